package postgres

import (
	"context"
	"errors"
	"fmt"
	"hash/fnv"
	"strings"
)

// Names of the triggers on the lease table; trigger names are per table.
const (
	triggerUpdate   = "leaderrun_notify_update"
	triggerDelete   = "leaderrun_notify_delete"
	triggerTruncate = "leaderrun_notify_truncate"
)

// idents are the quoted names of the backend's objects.
type idents struct {
	tableName string // as configured, for messages
	history   string // for messages
	schema    string // unquoted, "" for the search_path's first
	channel   string // unquoted notification channel: the table's own name

	table, markers, hist, seq, fn string // quoted, schema-qualified if configured
	// regclass literals of the same, for to_regclass and nextval.
	tableLit, markersLit, histLit, seqLit, fnLit string
}

// ValidateTable reports whether table can be Config.Table: [schema.]name,
// each part 1 to 50 bytes, without dots or NUL (any other character is
// quoted). The empty string is DefaultTable.
func ValidateTable(table string) error {
	if table == "" {
		return nil
	}
	_, err := newIdents(table)
	return err
}

func newIdents(table string) (idents, error) {
	schema, name, qualified := strings.Cut(table, ".")
	if !qualified {
		schema, name = "", table
	}
	for _, part := range []string{schema, name} {
		if qualified && part == "" || len(part) > maxTableName || strings.ContainsAny(part, ".\x00") {
			return idents{}, fmt.Errorf("postgres: invalid table name %q: want [schema.]table, each at most %d bytes",
				table, maxTableName)
		}
	}
	if name == "" {
		return idents{}, fmt.Errorf("postgres: invalid table name %q: want [schema.]table", table)
	}
	quote := func(n string) string {
		if schema != "" {
			return quoteIdent(schema) + "." + quoteIdent(n)
		}
		return quoteIdent(n)
	}
	ids := idents{
		tableName: table,
		history:   table + "_history",
		schema:    schema,
		channel:   name,
		table:     quote(name),
		markers:   quote(name + "_markers"),
		hist:      quote(name + "_history"),
		seq:       quote(name + "_token_seq"),
		fn:        quote(name + "_notify"),
	}
	ids.tableLit, ids.markersLit, ids.histLit = literal(ids.table), literal(ids.markers), literal(ids.hist)
	ids.seqLit, ids.fnLit = literal(ids.seq), literal(ids.fn+"()")
	return ids, nil
}

// literal quotes s as an SQL string literal.
func literal(s string) string { return "'" + strings.ReplaceAll(s, "'", "''") + "'" }

// epochMicros is the timestamptz column col as microseconds since the
// Unix epoch, NULL if it is: results are read in the text format, where a
// timestamp's form depends on the session's DateStyle, and an integer's
// does not. Exact on every version (extract returns a double before
// PostgreSQL 14, exact for whole seconds and for the microseconds of a
// minute).
func epochMicros(col string) string {
	return fmt.Sprintf("(extract(epoch FROM date_trunc('second', %[1]s))::bigint * 1000000 + "+
		"extract(microseconds FROM %[1]s)::bigint %% 1000000)", col)
}

// remainingMicros is how long until expires, by the database's clock.
const remainingMicros = "(extract(epoch FROM %s - now()) * 1000000)::bigint"

// statements are the backend's SQL, built once with its table names. See
// the package doc for what each does and why.
type statements struct {
	ids idents

	check, ddlTables, ddlTriggers                                  string
	ensureRow, acquire, withdraw, renew, verify, release, freeOnly string
	completed, complete, status, history                           string
}

func newStatements(ids idents) statements {
	s := statements{ids: ids}
	s.schemaStatements()
	s.leaseStatements()
	s.recordStatements()
	return s
}

// schemaStatements are the check of the backend's objects and the DDL
// that creates them.
func (s *statements) schemaStatements() {
	ids := s.ids
	// The state of the objects: schema, table, markers, history,
	// sequence, and the number of our triggers (3 when all are there,
	// enabled, with our channel).
	objects := fmt.Sprintf(`coalesce(current_schema(), ''),
	to_regclass(%[1]s) IS NOT NULL, to_regclass(%[2]s) IS NOT NULL,
	to_regclass(%[3]s) IS NOT NULL, to_regclass(%[4]s) IS NOT NULL`,
		ids.tableLit, ids.markersLit, ids.histLit, ids.seqLit)
	triggers := fmt.Sprintf(`(SELECT count(*) FROM pg_trigger WHERE tgrelid = to_regclass(%[1]s)
		AND tgname IN ('%[2]s', '%[3]s', '%[4]s') AND tgenabled <> 'D'
		AND encode(tgargs, 'escape') = %[5]s)`,
		ids.tableLit, triggerUpdate, triggerDelete, triggerTruncate,
		literal(strings.ReplaceAll(ids.channel, `\`, `\\`)+`\000`))
	s.check = "SELECT " + objects + ",\n\t" + triggers
	lockKey := fnv.New64a()
	lockKey.Write([]byte("leaderrun schema " + ids.table))
	// Each DDL string is one implicit transaction: the advisory lock
	// serialises concurrent creators (CREATE ... IF NOT EXISTS alone can
	// fail when two run at once), and the SELECT after it says what was
	// still missing, for the log.
	advisory := fmt.Sprintf("SELECT pg_advisory_xact_lock(%d);\n", int64(lockKey.Sum64()))
	s.ddlTables = advisory + "SELECT " + objects + ";\n" + fmt.Sprintf(tablesDDL, ids.table, ids.markers, ids.hist, ids.seq)
	s.ddlTriggers = advisory + "SELECT " + triggers + ";\n" + fmt.Sprintf(triggersDDL, ids.table, ids.fnLit, ids.fn,
		literal(ids.channel), triggerUpdate, triggerDelete, triggerTruncate, triggers)
}

// leaseStatements take, keep and give up a lease row.
func (s *statements) leaseStatements() {
	t := s.ids.table
	s.ensureRow = fmt.Sprintf(`INSERT INTO %s (name) VALUES ($1) ON CONFLICT (name) DO NOTHING`, t)
	s.acquire = fmt.Sprintf(acquireSQL, t, s.ids.seqLit, fmt.Sprintf(remainingMicros, "cur.expires"))
	s.withdraw = fmt.Sprintf(`UPDATE %s SET holder = '', owner = '', expires = now() WHERE name = $1 AND owner = $2`, t)
	s.renew = fmt.Sprintf(renewSQL, t)
	s.verify = fmt.Sprintf(`SELECT holder, token, expires > now() FROM %s WHERE name = $1`, t)
	s.release = fmt.Sprintf(releaseSQL, t, s.ids.hist, historyKeep-1)
	s.freeOnly = fmt.Sprintf(`UPDATE %s SET holder = '', owner = '', expires = now() WHERE name = $1 AND holder = $2 AND token = $3`, t)
}

// recordStatements read and write the markers, and read the status and
// the history.
func (s *statements) recordStatements() {
	t, m, h := s.ids.table, s.ids.markers, s.ids.hist
	s.completed = fmt.Sprintf(`SELECT identity, token, %s, %s FROM %s WHERE name = $1 AND key = $2 AND expires > now()`,
		epochMicros("at"), epochMicros("expires"), m)
	s.complete = fmt.Sprintf(completeSQL, t, m)
	s.status = fmt.Sprintf(`SELECT holder, owner, token, (extract(epoch FROM ttl) * 1000000)::bigint, `+
		fmt.Sprintf(remainingMicros, "expires")+`, holder <> '' AND expires > now() FROM %s WHERE name = $1`, t)
	s.history = fmt.Sprintf(`SELECT identity, token, %s, %s, %s, how, exit_code, signal, reason, once_key
FROM %s WHERE name = $1 ORDER BY token DESC LIMIT $2`, epochMicros("acquired"), epochMicros("started"), epochMicros("ended"), h)
}

// tablesDDL creates the lease table (%[1]s), the markers (%[2]s), the
// history (%[3]s) and the token sequence (%[4]s).
const tablesDDL = `CREATE SEQUENCE IF NOT EXISTS %[4]s AS bigint MINVALUE 1 NO CYCLE;
CREATE TABLE IF NOT EXISTS %[1]s (
	name     text PRIMARY KEY,
	holder   text NOT NULL DEFAULT '',
	owner    text NOT NULL DEFAULT '',
	token    bigint NOT NULL DEFAULT 0,
	ttl      interval NOT NULL DEFAULT '0',
	acquired timestamptz,
	renewed  timestamptz,
	expires  timestamptz NOT NULL DEFAULT now()
);
CREATE TABLE IF NOT EXISTS %[2]s (
	name     text NOT NULL,
	key      text NOT NULL,
	identity text NOT NULL,
	token    bigint NOT NULL,
	at       timestamptz NOT NULL,
	expires  timestamptz NOT NULL,
	PRIMARY KEY (name, key)
);
CREATE TABLE IF NOT EXISTS %[3]s (
	name      text NOT NULL,
	token     bigint NOT NULL,
	identity  text NOT NULL,
	acquired  timestamptz,
	started   timestamptz,
	ended     timestamptz,
	how       text NOT NULL,
	exit_code integer NOT NULL,
	signal    text NOT NULL DEFAULT '',
	reason    text NOT NULL DEFAULT '',
	once_key  text NOT NULL DEFAULT '',
	PRIMARY KEY (name, token)
);`

// triggersDDL creates the notifying trigger function and the triggers on
// the lease table (%[1]s), unless all three are there (%[8]s, their
// count); %[2]s and %[3]s are the function as a literal and as a name,
// %[4]s the channel, %[5]s to %[7]s the triggers' names.
const triggersDDL = `DO $leaderrun$
BEGIN
	IF %[8]s = 3 THEN
		RETURN;
	END IF;
	IF to_regprocedure(%[2]s) IS NULL THEN
		CREATE FUNCTION %[3]s() RETURNS trigger LANGUAGE plpgsql AS $fn$
		BEGIN
			IF TG_OP = 'TRUNCATE' THEN
				PERFORM pg_notify(TG_ARGV[0], json_build_object('op', 'truncate')::text);
			ELSIF TG_OP = 'DELETE' THEN
				PERFORM pg_notify(TG_ARGV[0], json_build_object('op', 'delete', 'name', OLD.name)::text);
			ELSE
				PERFORM pg_notify(TG_ARGV[0], json_build_object('op', 'update', 'name', OLD.name)::text);
				IF NEW.name IS DISTINCT FROM OLD.name THEN
					PERFORM pg_notify(TG_ARGV[0], json_build_object('op', 'update', 'name', NEW.name)::text);
				END IF;
			END IF;
			RETURN NULL;
		END
		$fn$;
	END IF;
	DROP TRIGGER IF EXISTS %[5]s ON %[1]s;
	DROP TRIGGER IF EXISTS %[6]s ON %[1]s;
	DROP TRIGGER IF EXISTS %[7]s ON %[1]s;
	-- Renewals move expires later and send nothing.
	CREATE TRIGGER %[5]s AFTER UPDATE ON %[1]s FOR EACH ROW
		WHEN (OLD.holder IS DISTINCT FROM NEW.holder OR OLD.owner IS DISTINCT FROM NEW.owner
			OR OLD.token IS DISTINCT FROM NEW.token OR OLD.name IS DISTINCT FROM NEW.name
			OR NEW.expires < OLD.expires)
		EXECUTE FUNCTION %[3]s(%[4]s);
	CREATE TRIGGER %[6]s AFTER DELETE ON %[1]s FOR EACH ROW EXECUTE FUNCTION %[3]s(%[4]s);
	CREATE TRIGGER %[7]s AFTER TRUNCATE ON %[1]s FOR EACH STATEMENT EXECUTE FUNCTION %[3]s(%[4]s);
END
$leaderrun$;`

// acquireSQL: $1 name, $2 holder, $3 owner, $4 ttl in µs. Returns (won,
// token, holder, µs to expiry) when the row exists, no row when it does
// not. %[1]s the lease table, %[2]s the sequence, %[3]s the time to expiry.
const acquireSQL = `WITH cur AS (
	SELECT holder, token, expires FROM %[1]s WHERE name = $1
), won AS (
	UPDATE %[1]s SET holder = $2, owner = $3, token = nextval(%[2]s::regclass),
		ttl = $4::bigint * interval '1 microsecond',
		acquired = now(), renewed = now(), expires = now() + $4::bigint * interval '1 microsecond'
	WHERE name = $1 AND (holder = '' OR expires <= now() OR owner = $3)
	RETURNING token
)
SELECT true, won.token, $2, $4::bigint FROM won
UNION ALL
SELECT false, cur.token, cur.holder, %[3]s
FROM cur WHERE NOT EXISTS (SELECT FROM won)`

// renewSQL: $1 name, $2 holder, $3 token. Returns (renewed, row exists,
// holder, token, not expired).
const renewSQL = `WITH r AS (
	UPDATE %[1]s SET renewed = now(), expires = now() + ttl
	WHERE name = $1 AND holder = $2 AND token = $3 AND expires > now()
	RETURNING 1
)
SELECT EXISTS (SELECT FROM r), cur.name IS NOT NULL, coalesce(cur.holder, ''), coalesce(cur.token, 0),
	coalesce(cur.expires > now(), false)
FROM (SELECT) AS one LEFT JOIN %[1]s AS cur ON cur.name = $1`

// releaseSQL: $1 name, $2 holder, $3 token; the term: $4 token ... $13
// once_key; $14 whether there is a term. Returns whether the row was
// freed. %[1]s the lease table, %[2]s the history, %[3]d the terms kept
// besides the new one.
const releaseSQL = `WITH rel AS (
	UPDATE %[1]s SET holder = '', owner = '', expires = now() WHERE name = $1 AND holder = $2 AND token = $3
	RETURNING 1
), ins AS (
	INSERT INTO %[2]s (name, token, identity, acquired, started, ended, how, exit_code, signal, reason, once_key)
	SELECT $1, $4, $5, $6, $7, $8, $9, $10, $11, $12, $13 WHERE $14::boolean
	ON CONFLICT (name, token) DO NOTHING
	RETURNING 1
), pruned AS (
	DELETE FROM %[2]s WHERE $14::boolean AND name = $1 AND token <= (
		SELECT token FROM %[2]s WHERE name = $1 ORDER BY token DESC OFFSET %[3]d LIMIT 1)
)
SELECT EXISTS (SELECT FROM rel)`

// completeSQL: $1 name, $2 holder, $3 token; the marker: $4 key ... $8
// expires. Returns whether the marker was written. %[1]s the lease table,
// %[2]s the markers.
const completeSQL = `WITH l AS (
	SELECT FROM %[1]s WHERE name = $1 AND holder = $2 AND token = $3 AND expires > now() FOR SHARE
), gc AS (
	DELETE FROM %[2]s WHERE name = $1 AND key <> $4 AND expires <= now() AND EXISTS (SELECT FROM l)
), up AS (
	INSERT INTO %[2]s (name, key, identity, token, at, expires)
	SELECT $1, $4, $5, $6, $7, $8 FROM l
	ON CONFLICT (name, key) DO UPDATE SET identity = excluded.identity, token = excluded.token,
		at = excluded.at, expires = excluded.expires
	RETURNING 1
)
SELECT EXISTS (SELECT FROM up)`

// historyKeep is how many terms of a lock the writer keeps: the term it
// appends and the newest ones before it.
const historyKeep = 100

// ensureSchema creates what is missing of the backend's objects, once per
// Backend (again after a statement found the table gone). The tables and
// sequence are required: failing to create them is an error naming the
// table and the privilege. The triggers are not: without them the backend
// polls (see the package doc).
func (b *Backend) ensureSchema(ctx context.Context) error {
	b.schemaMu.Lock()
	defer b.schemaMu.Unlock()
	if b.schemaReady {
		return nil
	}
	ctx, cancel := context.WithTimeout(ctx, requestTimeout)
	defer cancel()
	ids := b.sql.ids
	var (
		schema   string
		present  [4]bool // table, markers, history, sequence
		triggers int
	)
	err := b.do(ctx, func(c *conn) error {
		return c.queryRow(ctx, b.sql.check, nil, &schema, &present[0], &present[1], &present[2], &present[3], &triggers)
	})
	if err != nil {
		return b.unavailable("check the tables for", err)
	}
	if ids.schema != "" {
		schema = ids.schema
	}
	objects := [4]string{"table " + ids.tableName, "table " + ids.tableName + "_markers",
		"table " + ids.history, "sequence " + ids.tableName + "_token_seq"}
	var missing []string
	for i, ok := range present {
		if !ok {
			missing = append(missing, objects[i])
		}
	}
	if len(missing) > 0 {
		op := "create " + strings.Join(missing, ", ") + " for"
		if schema == "" {
			return b.unavailable(op, errors.New("no schema to create them in: the search_path names none that exists"))
		}
		state, err := b.ddl(ctx, b.sql.ddlTables)
		switch {
		case pgCode(err) == "42501": // insufficient_privilege
			return b.unavailable(op, fmt.Errorf(
				"%w; the role %q needs the CREATE privilege on schema %q, or someone who has it must create them first (see the backend's documentation)",
				err, b.connCfg.User, schema))
		case err != nil:
			return b.unavailable(op, err)
		}
		var created []string
		for i, v := range state[1:] { // after the schema
			if v == "f" {
				created = append(created, objects[i])
			}
		}
		if len(created) > 0 {
			b.log.Info("postgres: created "+strings.Join(created, ", "), "schema", schema)
		}
	}
	if triggers != 3 {
		state, err := b.ddl(ctx, b.sql.ddlTriggers)
		if err != nil {
			b.log.Warn("postgres: cannot install the notification triggers: waiters poll and a loss is seen at the next renewal",
				"table", ids.tableName, "err", b.redact(err))
		} else {
			triggers = 3
			if state[0] != "3" {
				b.log.Info("postgres: installed the notification triggers", "table", ids.tableName)
			}
		}
	}
	b.notify = triggers == 3
	b.schemaReady = true
	return nil
}

// ddl runs one of the DDL strings and returns the first row of the result
// of its second statement, the SELECT that follows the advisory lock.
func (b *Backend) ddl(ctx context.Context, sql string) ([]string, error) {
	var row []string
	err := b.do(ctx, func(c *conn) error {
		// The advisory lock's row and the state's; nothing else returns
		// rows.
		results, err := c.exec(ctx, sql, 2)
		if err != nil {
			return err
		}
		if len(results) < 2 || len(results[1]) != 1 {
			return fmt.Errorf("postgres: unexpected answer to the DDL of table %s", b.sql.ids.tableName)
		}
		row = results[1][0]
		return nil
	})
	return row, err
}

// schemaGone makes the next campaign look for the tables again: a
// statement found the lease table missing (dropped by hand).
func (b *Backend) schemaGone() {
	b.schemaMu.Lock()
	b.schemaReady = false
	b.schemaMu.Unlock()
}
