// Package mysql is the MySQL and MariaDB store: a lease is a row in a
// table of the database a team already runs, and the database's own
// clock decides when it expires. docs/backends/mysql.md says what it
// keeps, what it needs and what replication does to it.
//
// A lock is a backends.RecordLock. Its row in Config.Table, keyed by
// <prefix><lock>, holds the holder, its candidacy's owner, its token, its
// lease's length and its expiry by UTC_TIMESTAMP(6), read in the same
// statement that compares it: the hosts' clocks never matter. A grant is
// one transaction on one connection: the lock's counter in <table>_tokens
// is raised (GREATEST of itself and the token read, plus one), and the
// row is written only if it is free or expired by the database's clock;
// if not, nothing is committed. Renewal and release are single UPDATEs
// conditional on the owner and token; a marker's write checks the lease
// with a locking read in its transaction. The history and the markers
// live in <table>_docs.
//
// # Why the token never goes backwards
//
// The counter row's exclusive lock, taken by the grant's first statement
// and held until it commits, orders every grant of a lock: each one reads
// the last committed value and commits a greater one, or rolls back and
// grants nothing. The counter is kept apart from the lock's row, so a row
// deleted by hand takes nothing of it; a counter deleted by hand goes on
// from the token of the row. Only both deleted start again.
//
// # Waiters
//
// Waiters queue on a named lock of their own (GET_LOCK), each on a
// connection it keeps while it waits: the one that holds it is first in
// line, and alone reads the row; the others wait in GET_LOCK and are
// Behind. The holder keeps a second named lock for as long as it holds
// the row, and gives it up after its release: the first in line, waiting
// for it, is woken by the release, or by the holder's connection closing.
// The row stays the truth: a named lock only says when to read it.
package mysql

import (
	"context"
	"crypto/sha256"
	"crypto/tls"
	"crypto/x509"
	"database/sql"
	"encoding/hex"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"regexp"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"time"

	"github.com/go-sql-driver/mysql"

	"github.com/leaderrun/leaderrun/backends"
)

// DefaultTable is the lease table's name when Config.Table is empty.
const DefaultTable = "leaderrun_locks"

// Config describes one MySQL or MariaDB server. The zero value of each
// field is noted.
type Config struct {
	// DSN is go-sql-driver's: [user[:password]@][net(addr)]/dbname[?params],
	// TLS as its tls= parameter says. Required.
	DSN string
	// Password is used when the DSN carries none. Zero: none.
	Password string
	// TLS replaces what the DSN's tls= says (a CA or client certificate
	// of the operator's). Nil: the DSN's.
	TLS *tls.Config
	// Table is the lease table, [database.]name; the tables <table>_tokens
	// and <table>_docs go beside it. Zero: DefaultTable.
	Table string
	// Prefix starts every lock's key. Zero: none.
	Prefix string
	// Log receives the driver's lines at debug level. Nil: nothing.
	Log *slog.Logger
}

// Store is one MySQL or MariaDB database, shared by every lock the
// process campaigns for.
type Store struct {
	db     *sql.DB
	addr   string // the server, for messages; never a password
	secret string // to redact, should a message ever carry it
	space  string // the database and table, naming the named locks
	prefix string
	log    *slog.Logger

	locks, tokens, docs string // the tables, quoted

	mu      sync.Mutex
	created bool

	hostile atomic.Bool   // a connection read an answer beyond maxAnswer
	woken   atomic.Uint64 // wake-ups of waiters, for the herd test
}

// maxAnswer bounds what one request may read: the largest answer is a
// document (backends.MaxDoc). The driver reads one packet (16 MiB at
// most) before the bound can count it.
const maxAnswer = 1 << 20

// maxKey bounds a lock's key, the tables' primary key.
const maxKey = 512

var tableName = regexp.MustCompile(`^(?:[A-Za-z0-9_$]{1,64}\.)?[A-Za-z0-9_$]{1,57}$`)

// ValidateTable checks a table name: [database.]name of letters, digits,
// _ and $, its name short enough for the suffixes of the tables beside it.
func ValidateTable(t string) error {
	if !tableName.MatchString(t) {
		return fmt.Errorf("table %q: want [database.]name, of letters, digits, _ and $, the name at most 57 characters", t)
	}
	return nil
}

// Open returns the store of cfg. It sends nothing until a lock is used.
func Open(cfg Config) (*Store, error) {
	secret := dsnPassword(cfg.DSN)
	mc, err := mysql.ParseDSN(cfg.DSN)
	if err != nil {
		return nil, fmt.Errorf("mysql: DSN: %s (want [user[:password]@][tcp(host:port)|unix(/path)]/dbname[?params])",
			redact(err.Error(), secret))
	}
	if cfg.Table == "" {
		cfg.Table = DefaultTable
	}
	if err := ValidateTable(cfg.Table); err != nil {
		return nil, fmt.Errorf("mysql: %w", err)
	}
	dbName, table, qualified := strings.Cut(cfg.Table, ".")
	if !qualified {
		dbName, table = mc.DBName, cfg.Table
	}
	switch {
	case dbName == "":
		return nil, errors.New("mysql: no database: name one in the DSN (.../dbname) or the table (dbname.table)")
	case len(cfg.Prefix)+backends.MaxSlotLockName > maxKey:
		return nil, fmt.Errorf("mysql: prefix of %d bytes: a key of the lock table holds at most %d", len(cfg.Prefix), maxKey)
	}
	if mc.Passwd == "" {
		mc.Passwd = cfg.Password
	}
	if cfg.TLS != nil {
		if v := mc.TLSConfig; v == "skip-verify" || v == "preferred" || v == "false" {
			return nil, fmt.Errorf("mysql: TLS files given with tls=%s in the DSN: drop it, or set tls=true", v)
		}
		mc.TLS = cfg.TLS.Clone()
	}
	if cfg.Log == nil {
		cfg.Log = slog.New(slog.DiscardHandler)
	}
	s := &Store{addr: mc.Net + "(" + mc.Addr + ")", secret: mc.Passwd, prefix: cfg.Prefix, log: cfg.Log.With("backend", "mysql"),
		space: dbName + "\x00" + table}
	q := "`" + dbName + "`.`" + table
	s.locks, s.tokens, s.docs = q+"`", q+"_tokens`", q+"_docs`"
	tune(mc, s)
	conn, err := mysql.NewConnector(mc)
	if err != nil {
		return nil, fmt.Errorf("mysql: DSN: %s", redact(err.Error(), mc.Passwd))
	}
	s.db = sql.OpenDB(conn)
	// Waiters keep a connection of their own; the pool's are for requests.
	s.db.SetMaxIdleConns(2)
	s.db.SetConnMaxIdleTime(time.Minute)
	return s, nil
}

// tune sets what the store relies on, whatever the DSN said: matched rows
// as affected rows (a renewal within one microsecond still counts),
// parameters interpolated in one round trip on a charset where that is
// safe, no read or write deadline but the request's own (a waiter's
// GET_LOCK waits long), a dial timeout, and the bounded connection.
func tune(mc *mysql.Config, s *Store) {
	mc.ClientFoundRows, mc.InterpolateParams, mc.MultiStatements = true, true, false
	_ = mc.Apply(mysql.Charset("utf8mb4", ""))
	mc.ReadTimeout, mc.WriteTimeout = 0, 0
	if mc.Timeout == 0 {
		mc.Timeout = 5 * time.Second
	}
	mc.Logger = logShim{s}
	mc.DialFunc = func(ctx context.Context, network, addr string) (net.Conn, error) {
		c, err := (&net.Dialer{KeepAlive: 15 * time.Second}).DialContext(ctx, network, addr)
		if err != nil {
			return nil, err
		}
		g := &guard{Conn: c, s: s}
		if sc, ok := c.(syscall.Conn); ok {
			return &sysGuard{g, sc}, nil
		}
		return g, nil
	}
}

// Name implements backends.Store.
func (s *Store) Name() string { return "mysql" }

// Close implements backends.Store. Leases must be released first.
func (s *Store) Close() error { return s.db.Close() }

// Lock implements backends.Store.
func (s *Store) Lock(name string) backends.Lock {
	key := s.prefix + name
	sum := sha256.Sum256([]byte(s.space + "\x00" + key))
	named := "leaderrun:" + hex.EncodeToString(sum[:16])
	return &lock{s: s, key: key, queue: named + ":q", held: named + ":h"}
}

// ensureTables creates the tables if they are missing, once per store.
func (s *Store) ensureTables(ctx context.Context) error {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.created {
		return nil
	}
	for _, q := range []string{
		"CREATE TABLE IF NOT EXISTS " + s.locks + ` (name VARBINARY(512) NOT NULL PRIMARY KEY,
		holder VARBINARY(1024) NOT NULL DEFAULT '', owner VARBINARY(64) NOT NULL DEFAULT '',
		token BIGINT UNSIGNED NOT NULL DEFAULT 0, holders INT NOT NULL DEFAULT 0, ttl_us BIGINT NOT NULL DEFAULT 0,
		acquired DATETIME(6) NOT NULL DEFAULT '1970-01-01', renewed DATETIME(6) NOT NULL DEFAULT '1970-01-01',
		expires DATETIME(6) NOT NULL DEFAULT '1970-01-01') ENGINE=InnoDB`,
		"CREATE TABLE IF NOT EXISTS " + s.tokens + ` (name VARBINARY(512) NOT NULL PRIMARY KEY,
		token BIGINT UNSIGNED NOT NULL) ENGINE=InnoDB`,
		"CREATE TABLE IF NOT EXISTS " + s.docs + ` (name VARBINARY(512) NOT NULL, doc VARBINARY(16) NOT NULL,
		version BIGINT UNSIGNED NOT NULL, data MEDIUMBLOB NOT NULL, PRIMARY KEY (name, doc)) ENGINE=InnoDB`,
	} {
		if _, err := s.db.ExecContext(ctx, q); err != nil {
			return err
		}
	}
	s.created = true
	return nil
}

// Server errors by number.
const (
	errDupKey    = 1062
	errNoTable   = 1146
	errDeadlock  = 1213
	errLockWait  = 1205
	errHostBlock = 1129
	errNoHost    = 1130
	errExpired   = 1862
	errNoSecure  = 3159
)

func isServerError(err error, number uint16) bool {
	var me *mysql.MySQLError
	return errors.As(err, &me) && me.Number == number
}

// refused reports whether asking again cannot help: credentials,
// privileges, a database or table that is not there or not leaderrun's
// (SQLSTATE classes 28 and 42), a host the server refuses, TLS that fails
// its checks, an authentication the driver will not do, or an answer no
// server gives.
func (s *Store) refused(err error) bool {
	var me *mysql.MySQLError
	var verify *tls.CertificateVerificationError
	var unknown x509.UnknownAuthorityError
	var host x509.HostnameError
	switch {
	case errors.As(err, &me):
		state := string(me.SQLState[:2])
		return state == "28" || state == "42" || me.Number == errHostBlock || me.Number == errNoHost ||
			me.Number == errExpired || me.Number == errNoSecure
	case errors.As(err, &verify), errors.As(err, &unknown), errors.As(err, &host), errors.Is(err, errHostile):
		return true
	}
	for _, e := range []error{mysql.ErrNoTLS, mysql.ErrCleartextPassword, mysql.ErrNativePassword, mysql.ErrOldPassword,
		mysql.ErrUnknownPlugin, mysql.ErrMalformPkt, mysql.ErrPktSync, mysql.ErrPktSyncMul} {
		if errors.Is(err, e) {
			return true
		}
	}
	return s.hostile.Load() && errors.Is(err, mysql.ErrInvalidConn)
}

// fail wraps an error of op on key as the store being unavailable, and
// refused when asking again cannot help; it names the server, never a
// password.
func (s *Store) fail(op, key string, err error) error {
	if s.refused(err) {
		err = fmt.Errorf("%w: %w", backends.ErrRefused, err)
	}
	err = fmt.Errorf("mysql at %s: %s %q: %w: %w", s.addr, op, key, backends.ErrUnavailable, err)
	if msg := err.Error(); redact(msg, s.secret) != msg {
		return &redacted{err, redact(msg, s.secret)}
	}
	return err
}

// redacted is an error whose message lost a secret; errors.Is and
// errors.As still see through it.
type redacted struct {
	err error
	msg string
}

func (r *redacted) Error() string { return r.msg }
func (r *redacted) Unwrap() error { return r.err }

func redact(msg, secret string) string {
	if secret == "" {
		return msg
	}
	return strings.ReplaceAll(msg, secret, "xxxxx")
}

// dsnPassword is what a DSN holds between the first ":" and the last "@"
// before its last "/", as the driver reads it: a secret to keep out of
// the messages of a DSN that does not parse.
func dsnPassword(dsn string) string {
	head := dsn[:max(strings.LastIndexByte(dsn, '/'), 0)]
	at := strings.LastIndexByte(head, '@')
	if at < 0 {
		return ""
	}
	_, pw, _ := strings.Cut(head[:at], ":")
	return pw
}

// errHostile is a connection's answer beyond maxAnswer: the connection
// is closed, and the driver reports it as an invalid connection.
var errHostile = errors.New("mysql: the server sent an answer beyond what leaderrun accepts")

// guard counts what the server sends in answer to each request (the bytes
// read since the client last wrote, TLS and compression included) and
// closes the connection at maxAnswer.
type guard struct {
	net.Conn
	s *Store
	n atomic.Int64
}

func (g *guard) Write(p []byte) (int, error) {
	g.n.Store(0)
	return g.Conn.Write(p)
}

func (g *guard) Read(p []byte) (int, error) {
	n, err := g.Conn.Read(p)
	if g.n.Add(int64(n)) > maxAnswer {
		g.s.hostile.Store(true)
		g.s.log.Warn("mysql: the server sent more than leaderrun reads in one answer; closing the connection", "server", g.s.addr, "limit", maxAnswer)
		g.Conn.Close()
		return 0, errHostile
	}
	return n, err
}

// sysGuard is a guard over a socket: the driver checks a pooled
// connection's health through its descriptor, with a peek the guard
// never sees, so that a connection the server closed while idle is not
// used.
type sysGuard struct {
	*guard
	sys syscall.Conn
}

func (g *sysGuard) SyscallConn() (syscall.RawConn, error) { return g.sys.SyscallConn() }

// logShim passes the driver's lines to the store's log at debug level.
type logShim struct{ s *Store }

func (l logShim) Print(v ...any) {
	l.s.log.Debug(redact(fmt.Sprint(v...), l.s.secret), "source", "go-sql-driver")
}
