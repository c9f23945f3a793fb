// Package mysql is the MySQL and MariaDB store: a lease is a row whose
// expiry the database's clock decides (UTC_TIMESTAMP(6), read in the
// statement that compares it). docs/backends/mysql.md says what it keeps
// and needs, and what replication does to it.
//
// Tokens never go backwards. A grant is one transaction: it raises the
// lock's counter (<table>_tokens) to the greater of itself and the token
// read, plus one, holding that row's lock to the commit, and writes the
// lock's row only if it is free or run out, else commits nothing. The
// counter outlives the row, and a counter deleted goes on from the row's.
//
// Waiters queue on a named lock (GET_LOCK): the first in line alone reads
// the row, woken when the holder gives up a second named lock after its
// release, or dies; then it holds the queue's as the holder, so that one
// waiter is woken per change. The row stays the truth.
package mysql

import (
	"cmp"
	"context"
	"crypto/sha256"
	"crypto/tls"
	"database/sql"
	"encoding/hex"
	"errors"
	"fmt"
	"net"
	"regexp"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"time"

	"github.com/go-sql-driver/mysql"

	"github.com/leaderrun/leaderrun/backends"
)

// DefaultTable is the lease table when Config.Table is empty.
const DefaultTable = "leaderrun_locks"

// Config describes one database. The zero value of each field is noted.
type Config struct {
	// DSN is go-sql-driver's: [user[:password]@][net(addr)]/dbname[?params],
	// TLS as its tls= says. Required.
	DSN string
	// Password is used when the DSN has none. Zero: none.
	Password string
	// TLS replaces the DSN's tls= and its fallback to plain text. Nil: the DSN's.
	TLS *tls.Config
	// Table is the lease table, [database.]name; <table>_tokens and
	// <table>_docs go beside it. Zero: DefaultTable.
	Table string
	// Prefix starts every lock's key. Zero: none.
	Prefix string
}

// Store is one database, shared by every lock the process campaigns for.
type Store struct {
	db                  *sql.DB
	addr, space, prefix string // the server, for messages; what names the named locks; the keys' prefix
	locks, tokens, docs string // the tables, quoted
	mu                  sync.Mutex
	created             bool          // the tables were created (or found)
	hostile             atomic.Bool   // a connection read an answer beyond maxAnswer
	woken               atomic.Uint64 // wake-ups of waiters, for the herd test
}

// maxAnswer bounds what one request reads (the largest answer is a
// document); the driver allocates one packet, up to 16 MiB, before it counts.
const maxAnswer = 1 << 20

// tableName is [database.]name, the name leaving room for the suffixes.
var tableName = regexp.MustCompile(`^(?:[A-Za-z0-9_$]{1,64}\.)?[A-Za-z0-9_$]{1,57}$`)

// Open returns the store of cfg. It sends nothing until a lock is used.
// Its errors may quote the DSN's parts, the password among them if the DSN
// is malformed: callers redact it.
func Open(cfg Config) (*Store, error) {
	mc, err := mysql.ParseDSN(cfg.DSN)
	if err != nil {
		return nil, fmt.Errorf("mysql: DSN: %w (want [user[:password]@][tcp(host:port)|unix(/path)]/dbname[?params])", err)
	}
	cfg.Table = cmp.Or(cfg.Table, DefaultTable)
	db, table, qualified := strings.Cut(cfg.Table, ".")
	if !qualified {
		db, table = mc.DBName, cfg.Table
	}
	if mc.Passwd == "" {
		mc.Passwd = cfg.Password
	}
	switch {
	case !tableName.MatchString(cfg.Table):
		return nil, fmt.Errorf("mysql: table %q: want [database.]name, of letters, digits, _ and $, the name at most 57 characters", cfg.Table)
	case db == "":
		return nil, errors.New("mysql: no database: name one in the DSN (.../dbname) or the table (dbname.table)")
	case len(cfg.Prefix)+backends.MaxSlotLockName > 512:
		return nil, fmt.Errorf("mysql: a prefix of %d bytes: a lock's key (VARBINARY(512)) has no room left for the lock's name", len(cfg.Prefix))
	case cfg.TLS != nil:
		mc.TLS, mc.AllowFallbackToPlaintext = cfg.TLS.Clone(), false
	}
	q := "`" + db + "`.`" + table
	s := &Store{addr: mc.Net + "(" + mc.Addr + ")", space: db + "\x00" + table, prefix: cfg.Prefix,
		locks: q + "`", tokens: q + "_tokens`", docs: q + "_docs`"}
	tune(mc, s)
	conn, err := mysql.NewConnector(mc)
	if err != nil {
		return nil, fmt.Errorf("mysql: DSN: %w", err)
	}
	s.db = sql.OpenDB(conn)
	// Waiters keep connections of their own; the pool's are for requests.
	s.db.SetMaxIdleConns(2)
	s.db.SetConnMaxIdleTime(time.Minute)
	return s, nil
}

// tune sets what the store relies on, whatever the DSN says: matched rows
// as affected rows; parameters interpolated (one round trip), on a
// charset where that is safe; no deadline but the request's own (a
// waiter's GET_LOCK waits long); a dial timeout; the bounded connection.
func tune(mc *mysql.Config, s *Store) {
	mc.ClientFoundRows, mc.InterpolateParams, mc.MultiStatements = true, true, false
	_ = mc.Apply(mysql.Charset("utf8mb4", ""))
	mc.ReadTimeout, mc.WriteTimeout, mc.Logger = 0, 0, &mysql.NopLogger{}
	mc.Timeout = cmp.Or(mc.Timeout, 5*time.Second)
	mc.DialFunc = func(ctx context.Context, network, addr string) (net.Conn, error) {
		c, err := (&net.Dialer{KeepAlive: 15 * time.Second}).DialContext(ctx, network, addr)
		if err != nil {
			return nil, err
		}
		return &guard{Conn: c, s: s}, nil
	}
}

// Name implements backends.Store.
func (s *Store) Name() string { return "mysql" }

// Close implements backends.Store, once every lease was released.
func (s *Store) Close() error { return s.db.Close() }

// Lock implements backends.Store. Named locks are the server's, not a
// database's: theirs are named by the database, the table and the key.
func (s *Store) Lock(name string) backends.Lock {
	key := s.prefix + name
	sum := sha256.Sum256([]byte(s.space + "\x00" + key))
	named := "leaderrun:" + hex.EncodeToString(sum[:16])
	return &lock{s: s, key: key, queue: named + ":q", held: named + ":h"}
}

// withTables runs f, and again once the tables were created if missing.
func (s *Store) withTables(ctx context.Context, f func() error) error {
	err := f()
	if isServerError(err, errNoTable) {
		if err = s.ensureTables(ctx); err == nil {
			err = f()
		}
	}
	return err
}

// ensureTables creates the tables if they are missing, once per store.
func (s *Store) ensureTables(ctx context.Context) error {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.created {
		return nil
	}
	for _, q := range []string{
		s.locks + ` (name VARBINARY(512) NOT NULL PRIMARY KEY, holder VARBINARY(1024) NOT NULL DEFAULT '', owner VARBINARY(64) NOT NULL DEFAULT '',
		token BIGINT UNSIGNED NOT NULL DEFAULT 0, holders INT NOT NULL DEFAULT 0, ttl_us BIGINT NOT NULL DEFAULT 0,
		acquired DATETIME(6) NOT NULL DEFAULT '1970-01-01', renewed DATETIME(6) NOT NULL DEFAULT '1970-01-01', expires DATETIME(6) NOT NULL DEFAULT '1970-01-01')`,
		s.tokens + ` (name VARBINARY(512) NOT NULL PRIMARY KEY, token BIGINT UNSIGNED NOT NULL)`,
		s.docs + ` (name VARBINARY(512) NOT NULL, doc VARBINARY(16) NOT NULL, version BIGINT UNSIGNED NOT NULL, data MEDIUMBLOB NOT NULL, PRIMARY KEY (name, doc))`,
	} {
		if _, err := s.db.ExecContext(ctx, "CREATE TABLE IF NOT EXISTS "+q+" ENGINE=InnoDB"); err != nil {
			return err
		}
	}
	s.created = true
	return nil
}

// Server errors by number.
const (
	errDupKey      = 1062
	errNoTable     = 1146
	errDeadlock    = 1213
	errUnsupported = 1235 // GET_LOCK in a Galera cluster
)

func isServerError(err error, number uint16) bool {
	var me *mysql.MySQLError
	return errors.As(err, &me) && me.Number == number
}

// refused reports whether asking again cannot help: credentials,
// privileges, a database or table that is missing or not leaderrun's
// (SQLSTATE classes 28 and 42), a host refused (1129, 1130), a password
// expired (1862), TLS required (3159) or failing its checks, an
// authentication the driver will not do, or an answer no server gives.
func refused(err error) bool {
	var me *mysql.MySQLError
	if errors.As(err, &me) {
		state := string(me.SQLState[:2])
		return state == "28" || state == "42" || me.Number == 1129 || me.Number == 1130 || me.Number == 1862 || me.Number == 3159
	}
	var verify *tls.CertificateVerificationError
	return errors.As(err, &verify) || slices.ContainsFunc([]error{errHostile, mysql.ErrNoTLS, mysql.ErrCleartextPassword,
		mysql.ErrNativePassword, mysql.ErrOldPassword, mysql.ErrUnknownPlugin, mysql.ErrMalformPkt, mysql.ErrPktSync,
		mysql.ErrPktSyncMul}, func(e error) bool { return errors.Is(err, e) })
}

// fail wraps an error of op on key as the store being unavailable, and
// refused when asking again cannot help. It names the server; no error of
// the server or the driver carries the password.
func (s *Store) fail(op, key string, err error) error {
	if s.hostile.Load() && errors.Is(err, mysql.ErrInvalidConn) {
		// The driver reports the guard's refusal as a broken connection.
		err = fmt.Errorf("%w: %w", errHostile, err)
	}
	if refused(err) {
		err = fmt.Errorf("%w: %w", backends.ErrRefused, err)
	}
	return fmt.Errorf("mysql at %s: %s %q: %w: %w", s.addr, op, key, backends.ErrUnavailable, err)
}

var errHostile = fmt.Errorf("the server sent an answer beyond the %d bytes leaderrun reads", maxAnswer)

// guard counts what the server sends in answer to a request (read since
// the client last wrote, TLS included), and closes the connection beyond
// maxAnswer.
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
		g.Conn.Close()
		return 0, errHostile
	}
	return n, err
}

// SyscallConn is the socket's: the driver peeks through it at a pooled
// connection, so that one the server closed while idle is not used.
func (g *guard) SyscallConn() (syscall.RawConn, error) { return g.Conn.(syscall.Conn).SyscallConn() }
