// Package postgres is the PostgreSQL store: a lock is a row of a table in
// a database a team already runs, a backends.RecordLock whose leases the
// database's clock (now()) expires, and whose token is nextval of a
// sequence. Every statement is one unnamed statement on a pooled
// connection, with no explicit transaction and no session state, so that
// the store works through PgBouncer in transaction mode. Waiters queue on
// an advisory lock, and only the first in line listens for what the
// table's triggers notify (follow.go). docs/backends/postgres.md has the
// layout, the statements, why the token never goes backwards, the queue,
// the privileges and the bounds.
package postgres

import (
	"cmp"
	"context"
	"crypto/rand"
	"crypto/tls"
	"encoding/hex"
	"errors"
	"fmt"
	"hash/fnv"
	"log/slog"
	"slices"
	"strings"
	"sync"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/pgproto3"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/leaderrun/leaderrun/backends"
)

// Defaults of Config.
const (
	DefaultTable          = "leaderrun_leases"
	DefaultConnectTimeout = 5 * time.Second
)

const (
	// requestTimeout bounds a statement whose caller set no deadline.
	requestTimeout = 10 * time.Second
	// maxPoolConns bounds the pool that runs the statements, unless
	// pool_max_conns says otherwise: a renewal and a read of the row may
	// overlap. Each follower has a connection of its own besides.
	maxPoolConns = 2
	// maxTableName keeps the names derived from the table's
	// (<table>_token_seq, <table>_markers, ...) within PostgreSQL's 63
	// bytes, beyond which it would cut them short.
	maxTableName = 50
)

// Config describes a PostgreSQL database that keeps locks. The zero value
// of each field is noted.
type Config struct {
	// URL is the connection string, as psql takes it: a URL or key=value
	// pairs; what it leaves out comes from its service, the libpq
	// variables, and ~/.pgpass. Zero value: all from the environment.
	// Prefer PGPASSWORD or ~/.pgpass to a password in a URL on a command
	// line, which every local user can read in ps.
	URL string
	// Prefix is put before a lock's name to name its row.
	Prefix string
	// Table is the lease table, [schema.]name; the markers, history,
	// sequence and trigger function are named after it. Zero value:
	// DefaultTable, in the first schema of the search_path.
	Table string
	// ConnectTimeout bounds each connection attempt; the connection
	// string's connect_timeout (or PGCONNECT_TIMEOUT) wins. Zero value:
	// DefaultConnectTimeout.
	ConnectTimeout time.Duration
	// Log receives a line when the store creates its tables, and when it
	// finds out whether notifications arrive. Nil: nothing is logged.
	Log *slog.Logger
}

// Store is a PostgreSQL database that keeps locks, with one pool of
// connections for them all.
type Store struct {
	prefix   string
	pool     *pgxpool.Pool
	listen   *pgx.ConnConfig // of a follower's own connection
	user     string
	addr     string // host:port of the server(s), for messages
	password string // to redact, should a message ever carry it
	sql      statements
	log      *slog.Logger

	schemaMu sync.Mutex // held while the tables are checked
	ready    bool       // the tables were found or created

	mu      sync.Mutex
	mode    string        // modeNotify, modePoll, or "" until the probe found out (follow.go)
	known   chan struct{} // closed once mode is known
	probing bool
	probes  sync.WaitGroup     // the probe's goroutine
	stopped context.Context    // ends with Close
	stop    context.CancelFunc // of stopped
}

// Open returns the store that cfg describes. It sends nothing.
func Open(cfg Config) (*Store, error) {
	ids, err := newIdents(cmp.Or(cfg.Table, DefaultTable))
	if err != nil {
		return nil, err
	}
	if cfg.Log == nil {
		cfg.Log = slog.New(slog.DiscardHandler)
	}
	pc, err := parseConnString(cfg.URL)
	if err != nil {
		return nil, fmt.Errorf("postgres: connection string: %w", err)
	}
	cc := &pc.ConnConfig.Config
	if cc.ConnectTimeout <= 0 {
		cc.ConnectTimeout = cmp.Or(max(cfg.ConnectTimeout, 0), DefaultConnectTimeout)
	}
	pool, err := pgxpool.NewWithConfig(context.Background(), pc)
	if err != nil {
		return nil, fmt.Errorf("postgres: %w", err)
	}
	listen := pc.ConnConfig.Copy()
	listen.OnNotification = nil // buffered by pgx.Conn for WaitForNotification
	s := &Store{prefix: cfg.Prefix, pool: pool, listen: listen, user: cc.User, addr: endpoints(cc), password: cc.Password,
		sql: newStatements(ids), log: cfg.Log.With("backend", "postgres"), known: make(chan struct{})}
	s.stopped, s.stop = context.WithCancel(context.Background())
	return s, nil
}

// endpoints is host:port (or the socket's path) of every server the
// configuration may try, for messages.
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

// Name implements backends.Store.
func (s *Store) Name() string { return "postgres" }

// Lock implements backends.Store: the row Prefix + name.
func (s *Store) Lock(name string) backends.Lock {
	key := s.prefix + name
	h := fnv.New64a()
	h.Write([]byte("leaderrun queue " + s.sql.ids.table + "\x00" + key))
	return &lock{s: s, key: key, queue: int64(h.Sum64())}
}

// Close implements backends.Store, once leases are released and
// followers closed.
func (s *Store) Close() error {
	s.mu.Lock()
	s.stop()
	s.mu.Unlock()
	s.probes.Wait()
	s.pool.Close()
	return nil
}

type lock struct {
	s     *Store
	key   string // the row's name
	queue int64  // the key of the advisory lock its waiters queue on
}

func (l *lock) Key() string { return l.key }

// do runs fn on a pooled connection, bounded by requestTimeout unless ctx
// is. A connection that broke while idle (a restart, a pooler's or
// firewall's idle timeout) fails the first statement sent on it; with
// retry (a statement that may run twice), it is sent once more on another.
func (s *Store) do(ctx context.Context, retry bool, fn func(context.Context, *pgx.Conn) error) error {
	ctx, cancel := withTimeout(ctx)
	defer cancel()
	for try := 0; ; try++ {
		err := s.pool.AcquireFunc(ctx, func(c *pgxpool.Conn) error { return fn(ctx, c.Conn()) })
		if err == nil || !retry || try > 0 || ctx.Err() != nil || !brokenConn(err) {
			return err
		}
	}
}

func withTimeout(ctx context.Context) (context.Context, context.CancelFunc) {
	if _, ok := ctx.Deadline(); ok {
		return ctx, func() {}
	}
	return context.WithTimeout(ctx, requestTimeout)
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

// refused reports whether asking again cannot help: the server refused us
// (credentials, privileges, an object that does not exist), answered as
// no PostgreSQL does, or its certificate does not verify. Everything else
// may pass: the network, a restart, too many connections, a serialisation
// conflict, a read-only server during a failover.
func refused(err error) bool {
	var pgErr *pgconn.PgError
	var tooLong *pgproto3.ExceededMaxBodyLenErr
	var certErr *tls.CertificateVerificationError
	switch {
	case errors.Is(err, errTooLarge), errors.Is(err, errTooManyRows), errors.Is(err, errMalformed),
		errors.Is(err, errNoSchema), errors.As(err, &tooLong), errors.As(err, &certErr):
		return true
	case !errors.As(err, &pgErr) || len(pgErr.Code) < 2:
		return false
	}
	switch pgErr.Code[:2] {
	case "08", "40", "53", "57", "58":
		return false
	}
	return pgErr.Code != "25006" // read_only_sql_transaction
}

func pgCode(err error) string {
	var pgErr *pgconn.PgError
	if errors.As(err, &pgErr) {
		return pgErr.Code
	}
	return ""
}

// fail wraps err, met doing op on the row key: unavailable, and refused
// if asking again cannot help. It names no password.
func (s *Store) fail(op, key string, err error) error {
	kind := fmt.Errorf("%w: %w", backends.ErrUnavailable, err)
	if refused(err) {
		kind = fmt.Errorf("%w: %w: %w", backends.ErrUnavailable, backends.ErrRefused, err)
	}
	return s.redact(fmt.Errorf("postgres at %s: %s %q in table %s: %w", s.addr, op, key, s.sql.ids.tableName, kind))
}

// redact replaces the password in err's message, should a server message
// ever carry it.
func (s *Store) redact(err error) error {
	if err == nil || s.password == "" || !strings.Contains(err.Error(), s.password) {
		return err
	}
	return &redacted{err: err, msg: strings.ReplaceAll(err.Error(), s.password, "xxxxx")}
}

type redacted struct {
	err error
	msg string
}

func (r *redacted) Error() string { return r.msg }
func (r *redacted) Unwrap() error { return r.err }

func quoteIdent(name string) string {
	return `"` + strings.ReplaceAll(strings.ReplaceAll(name, "\x00", ""), `"`, `""`) + `"`
}

func randomID() string {
	b := make([]byte, 16)
	_, _ = rand.Read(b)
	return hex.EncodeToString(b)
}
