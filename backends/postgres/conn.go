package postgres

import (
	"context"
	"crypto/tls"
	"errors"
	"fmt"
	"net"
	"sync/atomic"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/pgxpool"
)

// Bounds on what the server may send, so that a broken or hostile server
// gets an error and never leaderrun's memory (docs/safety.md).
const (
	// maxMessage bounds one protocol message: the largest the statements
	// legitimately receive is a document (backends.MaxDoc characters, at
	// most 4 bytes each) or an error.
	maxMessage = 1 << 20
	// maxExchange bounds all that one exchange may read: a connection's
	// start-up, a statement and its answer, or one wait for a notification.
	maxExchange = 4 << 20
)

var (
	errTooLarge    = fmt.Errorf("the server sent more than %d MiB in one answer", maxExchange>>20)
	errTooManyRows = errors.New("the server returned more rows than the statement can return")
	errMalformed   = errors.New("the server's answer is not what the statement returns")
	errNoRows      = errors.New("postgres: no row")
)

// budgetConn fails the read that goes past maxExchange; reset starts a
// new exchange.
type budgetConn struct {
	net.Conn
	left atomic.Int64
}

func (b *budgetConn) Read(p []byte) (int, error) {
	left := b.left.Load()
	if left <= 0 {
		return 0, errTooLarge
	}
	if int64(len(p)) > left {
		p = p[:left]
	}
	n, err := b.Conn.Read(p)
	b.left.Add(-int64(n))
	return n, err
}

func (b *budgetConn) reset() { b.left.Store(maxExchange) }

// connConfig sets the configuration of every connection of a store: the
// bounds above, and unnamed statements in one round trip each, which a
// pooler in transaction mode needs (nothing prepared, nothing cached).
func connConfig(pc *pgxpool.Config) {
	cfg := pc.ConnConfig
	cfg.MaxProtocolMessageBodyLen = maxMessage
	// Under TLS, not over it: SCRAM's channel binding needs the
	// connection that pgx holds to be the *tls.Conn itself.
	dial := cfg.DialFunc
	cfg.DialFunc = func(ctx context.Context, network, addr string) (net.Conn, error) {
		nc, err := dial(ctx, network, addr)
		if err != nil {
			return nil, err
		}
		b := &budgetConn{Conn: nc}
		b.reset()
		return b, nil
	}
	cfg.DefaultQueryExecMode, cfg.StatementCacheCapacity, cfg.DescriptionCacheCapacity = pgx.QueryExecModeExec, 0, 0
	// Only a follower's own connection listens; a pooled one behind a
	// pooler in transaction mode may run where another client listened,
	// and drops what it is sent.
	cfg.OnNotification = func(*pgconn.PgConn, *pgconn.Notification) {}
	// A connection that broke while idle fails its next statement, which
	// Store.do retries once: no ping before every statement.
	pc.ShouldPing = func(context.Context, pgxpool.ShouldPingParams) bool { return false }
	pc.MinConns, pc.MinIdleConns = 0, 0
}

func exchange(c *pgx.Conn) {
	nc := c.PgConn().Conn()
	if t, ok := nc.(*tls.Conn); ok {
		nc = t.NetConn()
	}
	if b, ok := nc.(*budgetConn); ok {
		b.reset()
	}
}

// queryRow runs sql, which returns at most one row, into dest; no row is
// errNoRows. An answer of other columns, or a second row, closes the
// connection at once rather than read the rest.
func queryRow(ctx context.Context, c *pgx.Conn, sql string, args []any, dest ...any) error {
	exchange(c)
	rows, _ := c.Query(ctx, sql, args...)
	defer rows.Close()
	n := 0
	for ; rows.Next(); n++ {
		switch {
		case n == 1:
			_ = c.PgConn().Conn().Close()
			return errTooManyRows
		case len(rows.FieldDescriptions()) != len(dest):
			_ = c.PgConn().Conn().Close()
			return fmt.Errorf("%w: %d columns for %d values", errMalformed, len(rows.FieldDescriptions()), len(dest))
		}
		if err := rows.Scan(dest...); err != nil {
			return fmt.Errorf("%w: %w", errMalformed, err)
		}
	}
	switch err := rows.Err(); {
	case err != nil:
		return err
	case n == 0:
		return errNoRows
	}
	return nil
}

func exec(ctx context.Context, c *pgx.Conn, sql string, args ...any) error {
	switch err := queryRow(ctx, c, sql, args); {
	case errors.Is(err, errNoRows):
		return nil
	case err == nil:
		return errMalformed
	default:
		return err
	}
}
