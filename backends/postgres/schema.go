package postgres

import (
	"context"
	"errors"
	"fmt"
	"hash/fnv"
	"strings"

	"github.com/jackc/pgx/v5"
)

type idents struct {
	tableName string // as configured, for messages
	schema    string // unquoted, "" for the search_path's first
	channel   string // unquoted notification channel: the table's own name

	table, markers, hist, seq, fn string // quoted, schema-qualified if configured
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
	if name == "" || qualified && schema == "" || len(schema) > maxTableName || len(name) > maxTableName ||
		strings.ContainsAny(schema+name, ".\x00") {
		return idents{}, fmt.Errorf("postgres: invalid table name %q: want [schema.]table, each at most %d bytes",
			table, maxTableName)
	}
	quote := func(n string) string {
		if schema != "" {
			return quoteIdent(schema) + "." + quoteIdent(n)
		}
		return quoteIdent(n)
	}
	return idents{tableName: table, schema: schema, channel: name, table: quote(name), markers: quote(name + "_markers"),
		hist: quote(name + "_history"), seq: quote(name + "_token_seq"), fn: quote(name + "_notify")}, nil
}

func literal(s string) string { return "'" + strings.ReplaceAll(s, "'", "''") + "'" }

// statements are the store's SQL, built once with its table's names.
type statements struct {
	ids idents

	check, ddl, get, ensureRow, take, keep, free, readDoc, writeDoc string
}

func newStatements(ids idents) statements {
	t, m := ids.table, ids.markers
	// Whether the tables and the sequence are there, and how many of our
	// triggers (3 when all are, enabled, with our channel).
	objects := fmt.Sprintf(`to_regclass(%s) IS NOT NULL AND to_regclass(%s) IS NOT NULL AND to_regclass(%s) IS NOT NULL
	AND to_regclass(%s) IS NOT NULL`, literal(t), literal(m), literal(ids.hist), literal(ids.seq))
	triggers := fmt.Sprintf(`(SELECT count(*) FROM pg_trigger WHERE tgrelid = to_regclass(%s)
	AND tgname IN ('%s', '%s', '%s') AND tgenabled <> 'D' AND encode(tgargs, 'escape') = %s)`,
		literal(t), triggerUpdate, triggerDelete, triggerTruncate, literal(strings.ReplaceAll(ids.channel, `\`, `\\`)+`\000`))
	// The advisory lock serialises concurrent creators (CREATE ... IF NOT
	// EXISTS alone can fail when two run at once).
	key := fnv.New64a()
	key.Write([]byte("leaderrun schema " + t))
	return statements{ids: ids,
		check: fmt.Sprintf("SELECT coalesce(current_schema(), ''), %s, %s", objects, triggers),
		ddl: fmt.Sprintf(ddlSQL, int64(key.Sum64()), objects, t, m, ids.hist, ids.seq, triggers, literal(ids.fn+"()"), ids.fn,
			literal(ids.channel), triggerUpdate, triggerDelete, triggerTruncate),
		get:       fmt.Sprintf(`SELECT %s FROM %s WHERE name = $1`, recordCols, t),
		ensureRow: fmt.Sprintf(`INSERT INTO %s (name) VALUES ($1) ON CONFLICT (name) DO NOTHING`, t),
		take:      fmt.Sprintf(takeSQL, t, literal(ids.seq), recordCols),
		keep:      fmt.Sprintf(keepSQL, t, recordCols),
		free:      fmt.Sprintf(`UPDATE %s SET holder = '', owner = '', expires = now() WHERE name = $1 AND holder = $2 AND token = $3`, t),
		readDoc:   fmt.Sprintf(`SELECT left(identity, $3::integer), token FROM %s WHERE name = $1 AND key = $2`, m),
		writeDoc:  fmt.Sprintf(writeDocSQL, t, m),
	}
}

// Names of the triggers on the lease table; trigger names are per table.
const (
	triggerUpdate   = "leaderrun_notify_update"
	triggerDelete   = "leaderrun_notify_delete"
	triggerTruncate = "leaderrun_notify_truncate"
)

// ddlSQL creates, under the advisory lock %[1]d, what is missing: the
// sequence (%[6]s) and the lease table (%[3]s), the markers (%[4]s) and the
// history (%[5]s, kept for older releases) unless %[2]s says they are all
// there; then, unless there are 3 triggers (%[7]s), the trigger function
// (%[8]s, %[9]s) that notifies on the channel %[10]s, and the triggers
// %[11]s to %[13]s, which only the table's owner may create: without them
// followers poll. Renewals move expires later and notify nothing.
const ddlSQL = `DO $leaderrun$
BEGIN
	PERFORM pg_advisory_xact_lock(%[1]d);
	IF NOT (%[2]s) THEN
		CREATE SEQUENCE IF NOT EXISTS %[6]s AS bigint MINVALUE 1 NO CYCLE;
		CREATE TABLE IF NOT EXISTS %[3]s (
			name     text PRIMARY KEY,
			holder   text NOT NULL DEFAULT '',
			owner    text NOT NULL DEFAULT '',
			token    bigint NOT NULL DEFAULT 0,
			ttl      interval NOT NULL DEFAULT '0',
			acquired timestamptz,
			renewed  timestamptz,
			expires  timestamptz NOT NULL DEFAULT now()
		);
		CREATE TABLE IF NOT EXISTS %[4]s (
			name text NOT NULL, key text NOT NULL, identity text NOT NULL, token bigint NOT NULL,
			at timestamptz NOT NULL, expires timestamptz NOT NULL, PRIMARY KEY (name, key)
		);
		CREATE TABLE IF NOT EXISTS %[5]s (
			name text NOT NULL, token bigint NOT NULL, identity text NOT NULL,
			acquired timestamptz, started timestamptz, ended timestamptz, how text NOT NULL, exit_code integer NOT NULL,
			signal text NOT NULL DEFAULT '', reason text NOT NULL DEFAULT '', once_key text NOT NULL DEFAULT '',
			PRIMARY KEY (name, token)
		);
	END IF;
	IF %[7]s <> 3 THEN
		BEGIN
			IF to_regprocedure(%[8]s) IS NULL THEN
				CREATE FUNCTION %[9]s() RETURNS trigger LANGUAGE plpgsql AS $fn$
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
			DROP TRIGGER IF EXISTS %[11]s ON %[3]s;
			DROP TRIGGER IF EXISTS %[12]s ON %[3]s;
			DROP TRIGGER IF EXISTS %[13]s ON %[3]s;
			CREATE TRIGGER %[11]s AFTER UPDATE ON %[3]s FOR EACH ROW
				WHEN (OLD.holder IS DISTINCT FROM NEW.holder OR OLD.owner IS DISTINCT FROM NEW.owner
					OR OLD.token IS DISTINCT FROM NEW.token OR OLD.name IS DISTINCT FROM NEW.name
					OR NEW.expires < OLD.expires)
				EXECUTE FUNCTION %[9]s(%[10]s);
			CREATE TRIGGER %[12]s AFTER DELETE ON %[3]s FOR EACH ROW EXECUTE FUNCTION %[9]s(%[10]s);
			CREATE TRIGGER %[13]s AFTER TRUNCATE ON %[3]s FOR EACH STATEMENT EXECUTE FUNCTION %[9]s(%[10]s);
		EXCEPTION WHEN insufficient_privilege THEN
			NULL; -- not the table's owner: followers poll
		END;
	END IF;
END
$leaderrun$`

// ensure creates what is missing of the store's objects, once per Store
// (again after a statement found the table gone); key is for messages.
func (s *Store) ensure(ctx context.Context, key string) error {
	s.schemaMu.Lock()
	defer s.schemaMu.Unlock()
	if s.ready {
		return nil
	}
	var (
		schema   string
		present  bool
		triggers int64
	)
	check := func(ctx context.Context, c *pgx.Conn) error {
		return queryRow(ctx, c, s.sql.check, nil, &schema, &present, &triggers)
	}
	if err := s.do(ctx, true, check); err != nil {
		return s.fail("check the tables for", key, err)
	}
	if s.sql.ids.schema != "" {
		schema = s.sql.ids.schema
	}
	if before := triggers; !present || triggers != 3 {
		op := "create the table " + s.sql.ids.tableName + ", its sequence and its triggers for"
		if !present && schema == "" {
			return s.fail(op, key, errNoSchema)
		}
		err := s.do(ctx, true, func(ctx context.Context, c *pgx.Conn) error {
			if err := exec(ctx, c, s.sql.ddl); err != nil {
				return err
			}
			return check(ctx, c)
		})
		switch {
		case pgCode(err) == "42501": // insufficient_privilege
			return s.fail(op, key, fmt.Errorf("%w; the role %q needs the CREATE privilege on schema %q, "+
				"or someone who has it must create them first (see the store's documentation)", err, s.user, schema))
		case err != nil:
			return s.fail(op, key, err)
		}
		if triggers != before {
			s.log.Info("postgres: created what was missing of the table, its sequence and its triggers", "table", s.sql.ids.tableName)
		}
	}
	if triggers != 3 {
		s.setMode(modePoll, errNoTriggers)
	}
	s.ready = true
	return nil
}

var errNoSchema = errors.New("no schema to create them in: the search_path names none that exists")

// schemaGone makes the next use look for the tables again.
func (s *Store) schemaGone() {
	s.schemaMu.Lock()
	s.ready = false
	s.schemaMu.Unlock()
}
