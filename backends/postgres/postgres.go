// Package postgres is the PostgreSQL backend: a lease is a row in a table
// of the database a team already runs, and the database's own clock decides
// when it expires.
//
// # Schema
//
// One row per lock in the lease table (Config.Table, "leaderrun_leases" by
// default), keyed by name = <prefix><lock>:
//
//	name      text PRIMARY KEY  -- <prefix><lock>
//	holder    text              -- the holder's identity; '' when free
//	owner     text              -- a random id of the holder's candidacy,
//	                            -- and ";holders=N" in a pool of N > 1
//	token     bigint            -- the holder's fencing token
//	ttl       interval          -- the lease duration granted
//	acquired  timestamptz       -- when the holder got it (database clock)
//	renewed   timestamptz       -- its last renewal (database clock)
//	expires   timestamptz       -- renewed + ttl: free after this
//
// Beside it, created with it: the sequence <table>_token_seq that tokens are
// drawn from; <table>_markers, the once-per-period completion markers
// (name, key, identity, token, at, expires); <table>_history, the last 100
// terms of each lock (name, token, identity, acquired, started, ended, how,
// exit_code, signal, reason, once_key); and the trigger function
// <table>_notify with its triggers leaderrun_notify_update,
// leaderrun_notify_delete and leaderrun_notify_truncate on the lease table.
// All are created if missing (IF NOT EXISTS, serialised by a transaction's
// advisory lock so that concurrent first users do not collide). A table
// name may be schema-qualified ("ops.leaderrun_leases"); otherwise it lives
// in the first schema of the search_path.
//
// # Statements
//
// Every statement is one round trip and a single SQL statement (data-
// modifying WITH clauses), so each is atomic on its own; there are no
// explicit transactions and no session state. Expiry is always compared
// with now(), the database's clock: the hosts' clocks never matter, and a
// waiter sleeps for expires - now() as the database computed it.
//
//   - Acquire: UPDATE the row, setting holder, owner, a new token
//     (nextval), ttl and expires = now() + ttl, WHERE it is free (empty
//     holder) or expired (expires <= now()), or already granted to this very
//     candidacy (owner: an answer that was lost is not a lock held against
//     ourselves). The same statement returns the current holder and
//     expires - now() when the row is held, so a waiter knows how long to
//     sleep. When the row does not exist yet, an idempotent INSERT ... ON
//     CONFLICT DO NOTHING creates it free, and the UPDATE runs again.
//   - Renew: UPDATE expires = now() + ttl WHERE holder and token are still
//     ours and the lease has not expired. Matching no row is a loss.
//   - Release: in one statement, set the row free (empty holder, expires
//     now()) if it is still ours, append the term to the history, and trim
//     the lock's history to its last 100 terms.
//   - Complete: INSERT ... ON CONFLICT DO UPDATE of the marker, selecting
//     from the lease row FOR SHARE WHERE holder, token are ours and the
//     lease has not expired. The share lock makes a takeover (an UPDATE of
//     that row) wait until the marker is committed; a takeover committed
//     first leaves the SELECT nothing to find, and no marker is written.
//     Expired markers are ignored when read and deleted by the writer.
//
// # Why the token never goes backwards
//
// The token is nextval of the sequence, drawn by the acquiring UPDATE on
// the row it grants. The sequence hands out strictly increasing values in
// the order they are drawn, whatever transactions do (no CACHE: one value
// at a time), so it suffices that a grant's value is drawn after every
// earlier grant's. A grant is an UPDATE of the current version of the row;
// an earlier grant committed an UPDATE of the same row, so it drew its
// value before its commit. If that commit came before our statement's
// snapshot, our nextval comes after it. If it came later, our UPDATE finds
// the version it read already replaced: under READ COMMITTED it waits for
// the row lock, re-reads the newest version, re-checks the WHERE clause and
// evaluates SET, nextval included, again (PostgreSQL's EvalPlanQual); if
// the row was deleted meanwhile it updates nothing. A row that was deleted
// by hand (even the whole table emptied with DELETE or TRUNCATE) is created
// again free by the INSERT, with no token drawn: the next grant's UPDATE
// draws its value after that INSERT, so after the DELETE, so after every
// grant of the deleted row. That is why no token is drawn in the INSERT: a
// value drawn in an INSERT's VALUES is evaluated before any row lock or
// conflict check, and a statement delayed between the two could store a
// value smaller than one granted meanwhile.
//
// The sequence is not owned by the table, so DROP TABLE and TRUNCATE ...
// RESTART IDENTITY leave it alone; dropping or resetting the sequence itself
// (or restoring an older backup, or promoting an asynchronous replica that
// had not received the latest grants) would let tokens repeat.
//
// # Loss, and waiting: LISTEN/NOTIFY or polling
//
// The triggers send a notification on the channel named like the table
// (without its schema) when a row's holder, owner, token or name changes,
// when its expiry is moved earlier, when it is deleted, and when the table
// is truncated; renewals send none. Each Backend keeps one dedicated
// connection that LISTENs on it (besides the pool that runs the statements:
// usually one connection, at most two), both shared with its slot backends
// (the rows <prefix><lock>.slot<i> of a pool, --holders), and makes sure,
// each time it connects, that a pg_notify sent from another connection
// arrives on it.
// It pings that connection every 30 s, so that one that died silently is
// replaced.
//
// While that works, a lease reads its row as soon as a notification names
// it (a notification is a hint; the row is the truth), so a row deleted,
// freed, expired by hand or given to another holder is a loss within a few
// milliseconds; a lease also reads its row each time the listener
// (re)connects, for what it may have missed. A waiter is woken by a
// release at once; otherwise it sleeps until the holder's expiry by the
// database's clock (expiry itself sends nothing), but at most 30 s.
//
// Without it — the triggers could not be created (the role does not own
// the table), the listening connection is down, or the connection goes
// through a pooler that does not keep a session (PgBouncer in transaction
// mode: the probe never arrives) — the backend polls: a lease
// learns of its loss at the runner's next renewal (within --retry-period),
// and a waiter tries again every Config.PollInterval, or at the holder's
// expiry if that comes first. The log says which mode is in use, and when
// it changes.
//
// # PgBouncer in transaction mode
//
// The backend needs no session state: no prepared statements (it runs its
// statements as unnamed statements, Parse, Bind and Execute in one round
// trip, with pgx's pgconn), no SET, no session advisory locks, no
// temporary tables. Through PgBouncer in
// transaction mode it works, in polling mode; what that costs: a loss is
// seen at the next renewal (within --retry-period, not within
// milliseconds), a handover waits up to the poll interval, and an idle
// waiter sends one statement per poll interval instead of about one per
// lease duration. The listening connection tries LISTEN once, gets no
// notification within 2 s, and closes. A session-mode pooler, or a direct
// connection, gets notifications. (Statement mode is not supported: the
// schema is created in a multi-statement transaction.)
//
// # Privileges
//
// The first user creates the objects above and needs CREATE on the schema
// (PostgreSQL 15 no longer grants it on public to every role). Others, or
// every user if an administrator created the objects beforehand, need
// SELECT, INSERT, UPDATE on the lease table; SELECT, INSERT, UPDATE,
// DELETE on the markers; SELECT, INSERT, DELETE on the history; and USAGE
// on the sequence (docs/backends/postgres.md has the GRANTs, which the e2e
// tests run as written). Notifications also need the triggers, which only
// the table's owner can create (without them the backend polls); LISTEN
// and NOTIFY need no privilege. Nothing else: no superuser, no extensions. A missing table that the role cannot create
// is an error naming the table and the privilege. PostgreSQL 11 or later
// (tested with 15).
//
// # Connection
//
// The connection is configured as psql's, parsed by pgx (pgconn): a URL or
// key=value string, a service (service=, PGSERVICE) from the user's
// service file or pg_service.conf in PGSYSCONFDIR, the PG* variables, and
// a missing password from PGPASSFILE (~/.pgpass); several hosts with
// every target_session_attrs, every sslmode, sslrootcert, sslcert, sslkey
// and sslpassword, channel_binding (SCRAM-SHA-256-PLUS over TLS),
// require_auth. Where no host is named, the server's socket is looked for
// in /var/run/postgresql only, as Debian's libpq does: never in /tmp,
// where any user of the host may bind one (parseConnString has the
// details, and what is refused). Messages name the server as host:port,
// never the password.
//
// # Bounds
//
// What the server sends is bounded, so that a broken or hostile server
// gets an error, never leaderrun's memory: a protocol message at 1 MiB, all
// that one statement (or a connection's start-up, or one wait for a
// notification) reads at 4 MiB, and the rows of each statement at what it
// can return (one, or the history's limit); past a bound the connection is
// closed. Every statement has a deadline (10 s unless its caller sets
// one), and every connection attempt the connect timeout.
package postgres

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"log/slog"
	"slices"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/jackc/pgx/v5/pgconn"

	"github.com/leaderrun/leaderrun/backends"
)

// Defaults of Config.
const (
	DefaultTable          = "leaderrun_leases"
	DefaultPollInterval   = 2 * time.Second
	DefaultConnectTimeout = 5 * time.Second
	// DefaultLeaseDuration is used when a campaign asks for none.
	DefaultLeaseDuration = 15 * time.Second
)

const (
	// requestTimeout bounds the statements the backend sends on its own
	// behalf (campaign attempts, checks, Status), so that a connection
	// that stalls without closing cannot hang them.
	requestTimeout = 10 * time.Second
	// withdrawTimeout bounds the clean-up of a cancelled candidacy: it
	// runs after the caller's context ended and must not keep it waiting.
	withdrawTimeout = 2 * time.Second
	// maxPoolConns bounds the pool that runs the statements (see New).
	maxPoolConns = 2
	// maxTableName keeps the names derived from the table's
	// (<table>_token_seq, <table>_history, ...) within PostgreSQL's 63
	// bytes, beyond which it would cut them short.
	maxTableName = 50
)

// Config describes one lock in one PostgreSQL database. The zero value of
// each field is noted.
type Config struct {
	// URL is the connection string, as psql takes it: a URL
	// (postgres://user@host:port/db?sslmode=require) or key=value pairs.
	// Whatever it leaves out comes from its service (service=, or
	// PGSERVICE), then PGHOST, PGPORT, PGUSER, PGPASSWORD, PGDATABASE,
	// PGSSLMODE, PGCONNECT_TIMEOUT and the other libpq variables, and a
	// missing password from PGPASSFILE or ~/.pgpass (see the package doc).
	// Zero value: all from the environment. Prefer PGPASSWORD or .pgpass
	// to a password in a URL on a command line, which every local user
	// can read in ps.
	URL string

	// Prefix and Lock name the lock's row: name = Prefix + Lock. Lock is
	// required; see backends.ValidateLockName.
	Prefix, Lock string

	// Table is the lease table, optionally schema-qualified
	// ("schema.table"), at most 50 bytes per part; the markers, history,
	// sequence and trigger function are named after it. Zero value:
	// DefaultTable, in the first schema of the search_path.
	Table string

	// PollInterval is how often a waiter tries again when notifications
	// are not available (see the package doc); leaderrun passes its
	// --retry-period. Too short loads the database with one statement per
	// waiter per interval; too long delays a handover by up to the
	// interval. Zero value: DefaultPollInterval.
	PollInterval time.Duration

	// ConnectTimeout bounds each connection attempt, so that an
	// unreachable server fails a campaign instead of hanging it; the
	// connection string's connect_timeout (or PGCONNECT_TIMEOUT) wins.
	// Zero value: DefaultConnectTimeout.
	ConnectTimeout time.Duration

	// Log receives a line when the backend chooses between notifications
	// and polling, and when a waiter meets errors. Nil: nothing is logged.
	Log *slog.Logger
}

// Backend campaigns for one lock in one PostgreSQL database. Its methods
// are safe for concurrent use, but Campaign is meant for one campaign at a
// time.
type Backend struct {
	*shared
	lock string
	key  string // the row's name
	log  *slog.Logger
}

// shared is what a backend and its slot backends (see Slot) have in
// common: the connections, and what is known of the tables.
type shared struct {
	root     *Backend       // the backend New made
	prefix   string         // Config.Prefix
	pool     *pool          // the connections of every slot
	connCfg  *pgconn.Config // for the listener's connection
	addr     string         // host:port of the server(s), for messages
	password string         // to redact, should a message ever carry it
	sql      statements
	poll     time.Duration
	logBase  *slog.Logger // without the lock

	schemaMu    sync.Mutex // held while the schema is checked
	schemaReady bool
	notify      bool // the triggers are installed, with our channel

	mu         sync.Mutex
	listener   *listener // nil until a campaign needs it; one for every slot
	pollLogged bool
	closed     bool
}

var _ backends.Backend = (*Backend)(nil)

// New returns a backend for cfg.Lock. It parses the connection
// configuration but sends nothing to the server until the first Campaign
// or Status.
func New(cfg Config) (*Backend, error) {
	if err := backends.ValidateLockName(cfg.Lock); err != nil {
		return nil, fmt.Errorf("postgres: %w", err)
	}
	if cfg.Table == "" {
		cfg.Table = DefaultTable
	}
	ids, err := newIdents(cfg.Table)
	if err != nil {
		return nil, err
	}
	if cfg.PollInterval <= 0 {
		cfg.PollInterval = DefaultPollInterval
	}
	if cfg.ConnectTimeout <= 0 {
		cfg.ConnectTimeout = DefaultConnectTimeout
	}
	if cfg.Log == nil {
		cfg.Log = slog.New(slog.DiscardHandler)
	}
	cc, maxConns, err := parseConnString(cfg.URL)
	if err != nil {
		// Its messages never show the string.
		return nil, fmt.Errorf("postgres: connection string: %w", err)
	}
	if cc.ConnectTimeout <= 0 {
		cc.ConnectTimeout = cfg.ConnectTimeout
	}
	// Every leaderrun on a host costs the server's max_connections at
	// most maxConns (a renewal and a check after a notification may
	// overlap; nothing else does), plus the listening connection.
	sh := &shared{
		prefix:   cfg.Prefix,
		pool:     newPool(cc, maxConns),
		connCfg:  cc,
		addr:     endpoints(cc),
		password: cc.Password,
		sql:      newStatements(ids),
		poll:     cfg.PollInterval,
		logBase:  cfg.Log.With("backend", "postgres"),
	}
	sh.root = sh.backend(cfg.Lock)
	return sh.root, nil
}

// backend is the backend of lock, on these connections.
func (sh *shared) backend(lock string) *Backend {
	return &Backend{shared: sh, lock: lock, key: sh.prefix + lock, log: sh.logBase.With("lock", lock)}
}

// Slot implements backends.Backend: slot i is the row of the lock
// backends.SlotLock(lock, i), in the same table, reached through b's pool
// and listening connection: a candidate for several slots still holds at
// most two connections and a listening one.
func (b *Backend) Slot(i int) backends.Backend {
	if i == 0 {
		return b.root
	}
	return b.backend(backends.SlotLock(b.root.lock, i))
}

// endpoints is host:port (or the socket's path) of every server the
// configuration may try, for messages. It carries no user information.
func endpoints(c *pgconn.Config) string {
	var addrs []string
	for _, h := range append([]*pgconn.FallbackConfig{{Host: c.Host, Port: c.Port}}, c.Fallbacks...) {
		_, a := pgconn.NetworkAddress(h.Host, h.Port)
		if !slices.Contains(addrs, a) {
			addrs = append(addrs, a)
		}
	}
	return strings.Join(addrs, ",")
}

// Name implements backends.Backend.
func (b *Backend) Name() string { return "postgres" }

// Key is the name of the lock's row.
func (b *Backend) Key() string { return b.key }

// Table is the lease table as configured.
func (b *Backend) Table() string { return b.sql.ids.tableName }

// Close implements backends.Backend: it stops the listening connection and
// closes the pool, unless b is a slot backend, which has nothing of its
// own to close. Leases must be released first.
func (b *Backend) Close() error {
	if b != b.root {
		return nil
	}
	b.mu.Lock()
	l := b.listener
	b.closed = true
	b.mu.Unlock()
	if l != nil {
		l.close()
	}
	b.pool.close()
	return nil
}

// do runs fn on a pooled connection. A connection that broke while idle
// (the server restarted; a pooler, firewall or idle timeout closed it)
// fails the first statement sent on it; that failure is retried once, on a
// new connection. Only statements that may run twice use it: every one
// here but Complete's (see lease.Complete).
func (b *Backend) do(ctx context.Context, fn func(*conn) error) error {
	ctx, cancel := withTimeout(ctx)
	defer cancel()
	for try := 0; ; try++ {
		err := b.pool.with(ctx, fn)
		if err == nil || try > 0 || ctx.Err() != nil || !brokenConn(err) {
			return err
		}
	}
}

// brokenConn reports whether err says that an established connection
// failed under the statement, rather than the server answering it or a
// new connection failing.
func brokenConn(err error) bool {
	var pgErr *pgconn.PgError
	var connectErr *pgconn.ConnectError
	switch {
	case errors.As(err, &connectErr), errors.Is(err, context.Canceled), errors.Is(err, context.DeadlineExceeded):
		return false
	case errors.As(err, &pgErr):
		// Sent to idle connections when the server shuts down or crashes;
		// a pooler's own errors about its server connection are class 08.
		return pgErr.Code == "57P01" || pgErr.Code == "57P02" || strings.HasPrefix(pgErr.Code, "08")
	}
	return true
}

// refused reports whether err is the server refusing us for good
// (credentials, privileges, a database or object that does not exist, a
// statement it cannot run), as opposed to a failure that may pass: the
// network, a restart, too many connections, a serialisation conflict, a
// read-only server during a failover.
func refused(err error) bool {
	var pgErr *pgconn.PgError
	if !errors.As(err, &pgErr) || len(pgErr.Code) < 2 {
		return false
	}
	switch pgErr.Code[:2] {
	case "08", "40", "53", "57", "58":
		return false
	}
	return pgErr.Code != "25006" // read_only_sql_transaction
}

// pgCode is the SQLSTATE of err, "" if the server did not answer with one.
func pgCode(err error) string {
	var pgErr *pgconn.PgError
	if errors.As(err, &pgErr) {
		return pgErr.Code
	}
	return ""
}

// unavailable wraps an error met before leadership: it names the server and
// the row, and never the password.
func (b *Backend) unavailable(op string, err error) error {
	return b.redact(fmt.Errorf("postgres at %s: %s %q in table %s: %w: %w",
		b.addr, op, b.key, b.sql.ids.tableName, backends.ErrUnavailable, err))
}

// redact replaces the password in err's message, should a server message
// ever carry it; errors.Is and errors.As still see through it.
func (b *Backend) redact(err error) error {
	if err == nil || b.password == "" || !strings.Contains(err.Error(), b.password) {
		return err
	}
	return &redacted{err: err, msg: strings.ReplaceAll(err.Error(), b.password, "xxxxx")}
}

type redacted struct {
	err error
	msg string
}

func (r *redacted) Error() string { return r.msg }
func (r *redacted) Unwrap() error { return r.err }

// withTimeout bounds a statement that its caller did not bound: every
// statement has a deadline, so that a server that stops answering cannot
// hang a renewal, a release or a marker.
func withTimeout(ctx context.Context) (context.Context, context.CancelFunc) {
	if _, ok := ctx.Deadline(); ok {
		return ctx, func() {}
	}
	return context.WithTimeout(ctx, requestTimeout)
}

// quoteIdent is name as a quoted SQL identifier.
func quoteIdent(name string) string {
	return `"` + strings.ReplaceAll(strings.ReplaceAll(name, "\x00", ""), `"`, `""`) + `"`
}

// micros is d in whole microseconds, PostgreSQL's resolution, at least 1.
func micros(d time.Duration) int64 { return max(int64(d/time.Microsecond), 1) }

func randomID() string {
	b := make([]byte, 16)
	_, _ = rand.Read(b)
	return hex.EncodeToString(b)
}

// ownerHolders separates, in the owner column, the candidacy's random id
// from the size of its pool (see newOwner).
const ownerHolders = ";holders="

// newOwner is the owner column of a candidacy for opts: a random id that
// tells its grant from any other, and in a pool of more than one holder
// (--holders) the pool's size after it, so that Status can tell every
// candidate the holder's N. The pool's size lives there rather than in a
// column of its own because the owner column is written whole by every
// grant, by every version of leaderrun (so no older holder's record can
// carry a stale size), and because a new column would have to be added
// to existing tables, which takes their owner: the roles that only
// campaign have SELECT, INSERT and UPDATE (docs/backends/postgres.md).
func newOwner(opts backends.CampaignOptions) string {
	owner := randomID()
	if n := opts.RecordedHolders(); n > 0 {
		owner += ownerHolders + strconv.Itoa(n)
	}
	return owner
}

// holdersOf reads the pool's size from an owner column; 0 if it records
// none.
func holdersOf(owner string) int {
	_, n, ok := strings.Cut(owner, ownerHolders)
	if !ok {
		return 0
	}
	return backends.ParseHolders(n)
}

// Status implements backends.Status from one SELECT of the row. TTL is the
// lease duration the holder was granted, Remaining the time to its expiry
// by the database's clock. Waiting is -1: waiters leave no trace in the
// database. A lock whose table does not exist yet is free.
func (b *Backend) Status(ctx context.Context) (backends.Status, error) {
	st := backends.Status{Lock: b.lock, Backend: b.Name(), Key: b.key, Remaining: -1, Waiting: -1}
	ctx, cancel := context.WithTimeout(ctx, requestTimeout)
	defer cancel()
	var (
		holder, owner       string
		token, ttl, remains int64
		held                bool
	)
	err := b.do(ctx, func(c *conn) error {
		return c.queryRow(ctx, b.sql.status, []any{b.key}, &holder, &owner, &token, &ttl, &remains, &held)
	})
	switch {
	case errors.Is(err, errNoRows) || pgCode(err) == "42P01": // undefined_table
		return st, nil
	case err != nil:
		return st, b.unavailable("read", err)
	case !held:
		return st, nil
	}
	st.Held = true
	st.Identity = holder
	st.Holders = holdersOf(owner)
	st.Token = uint64(token)
	st.TTL = time.Duration(ttl) * time.Microsecond
	st.Remaining = time.Duration(remains) * time.Microsecond
	return st, nil
}

// History implements backends.Backend from the history table, newest
// first. A table that does not exist yet has no history.
func (b *Backend) History(ctx context.Context, limit int) ([]backends.Term, error) {
	if limit <= 0 || limit > backends.HistoryLimit {
		limit = backends.HistoryLimit
	}
	ctx, cancel := context.WithTimeout(ctx, requestTimeout)
	defer cancel()
	var terms []backends.Term
	err := b.do(ctx, func(c *conn) error {
		terms = terms[:0]
		return c.query(ctx, b.sql.history, []any{b.key, limit}, limit, func(values [][]byte) error {
			var (
				t     backends.Term
				token int64
			)
			if err := scanValues(values, &t.Identity, &token, &t.Acquired, &t.Started, &t.Ended, &t.End, &t.ExitCode,
				&t.Signal, &t.Reason, &t.OnceKey); err != nil {
				return err
			}
			t.Token = uint64(token)
			terms = append(terms, t)
			return nil
		})
	})
	switch {
	case pgCode(err) == "42P01":
		return nil, nil
	case err != nil:
		return nil, b.redact(fmt.Errorf("postgres at %s: read the history of %q in table %s: %w: %w",
			b.addr, b.key, b.sql.ids.history, backends.ErrUnavailable, err))
	}
	return backends.NewestFirst(terms, limit), nil
}
