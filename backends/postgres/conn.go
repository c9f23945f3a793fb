package postgres

import (
	"context"
	"errors"
	"fmt"
	"io"
	"strconv"
	"sync/atomic"
	"time"

	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/pgproto3"
)

// Bounds on what the server may send, so that a broken or hostile server
// gets an error and never leaderrun's memory (docs/safety.md): no single
// answer may push a leaderrun past a few MiB, however many connections it
// holds (at most maxPoolConns and the listener, unless pool_max_conns says
// more).
const (
	// maxMessage bounds one protocol message (pgproto3's body length):
	// the largest that the backend's statements legitimately receive is
	// a row of the history, a few hundred bytes, or an error.
	maxMessage = 1 << 20
	// maxExchange bounds all that one exchange may read: a connection's
	// start-up (authentication, parameters, target_session_attrs's
	// check), a statement and its answer, or one wait for a notification.
	maxExchange = 4 << 20
	// closeTimeout bounds the Terminate message sent when a connection is
	// closed.
	closeTimeout = time.Second
)

// errTooLarge is the error of an exchange that read more than
// maxExchange bytes.
var errTooLarge = fmt.Errorf("the server sent more than %d MiB in one answer", maxExchange>>20)

// errTooManyRows is the error of a statement that returned more rows than
// it can legitimately return.
var errTooManyRows = errors.New("the server returned more rows than the statement can return")

// budget counts what pgconn reads from the connection and fails the read
// that goes past maxExchange. reset starts a new exchange.
type budget struct {
	r    io.Reader
	left atomic.Int64
}

func (b *budget) Read(p []byte) (int, error) {
	left := b.left.Load()
	if left <= 0 {
		return 0, errTooLarge
	}
	if int64(len(p)) > left {
		p = p[:left]
	}
	n, err := b.r.Read(p)
	b.left.Add(-int64(n))
	return n, err
}

func (b *budget) reset() { b.left.Store(maxExchange) }

// conn is one connection to the server, through pgconn, with its budget.
// Its methods must not be called concurrently.
type conn struct {
	pg     *pgconn.PgConn
	budget *budget
}

// connect opens a connection with cfg (a copy is made). onNote, if not
// nil, receives each notification, on the goroutine that reads it;
// otherwise notifications are dropped (a pooled connection behind a
// pooler in transaction mode may run where another client listened).
func connect(ctx context.Context, cfg *pgconn.Config, onNote func(*pgconn.Notification)) (*conn, error) {
	c := &conn{budget: &budget{}}
	cfg = cfg.Copy()
	cfg.MaxProtocolMessageBodyLen = maxMessage
	cfg.BuildFrontend = func(r io.Reader, w io.Writer) *pgproto3.Frontend {
		// Once per attempt (each host, each TLS mode), before it sends
		// anything: the start-up is an exchange of its own.
		c.budget.r = r
		c.budget.reset()
		return pgproto3.NewFrontend(c.budget, w)
	}
	cfg.OnNotification = nil
	if onNote != nil {
		cfg.OnNotification = func(_ *pgconn.PgConn, n *pgconn.Notification) { onNote(n) }
	}
	pg, err := pgconn.ConnectConfig(ctx, cfg)
	if err != nil {
		return nil, err
	}
	c.pg = pg
	return c, nil
}

// close sends Terminate, for at most closeTimeout, and closes the
// connection.
func (c *conn) close() {
	ctx, cancel := context.WithTimeout(context.Background(), closeTimeout)
	defer cancel()
	_ = c.pg.Close(ctx)
}

// idle reports whether the connection can serve another statement: open,
// and not left in a transaction (no statement here opens one).
func (c *conn) idle() bool { return !c.pg.IsClosed() && c.pg.TxStatus() == 'I' }

// abort closes the connection under a statement whose answer must not
// be read any further; pgconn's reader then fails at once.
func (c *conn) abort() { _ = c.pg.Conn().Close() }

// query runs sql with args as one unnamed statement (Parse, Bind,
// Describe, Execute, Sync in one round trip: nothing is prepared, as a
// pooler in transaction mode needs) and calls scan for each row, at most
// maxRows rows: a statement that returns more is errTooManyRows, and its
// connection is closed. The values passed to scan are valid during the
// call only.
func (c *conn) query(ctx context.Context, sql string, args []any, maxRows int, scan func([][]byte) error) error {
	values, oids, err := encodeArgs(args)
	if err != nil {
		return err
	}
	c.budget.reset()
	rr := c.pg.ExecParams(ctx, sql, values, oids, nil, nil)
	var scanErr error
	for n := 0; rr.NextRow(); n++ {
		if n == maxRows {
			c.abort()
			_, _ = rr.Close()
			return fmt.Errorf("%w (more than %d)", errTooManyRows, maxRows)
		}
		if scanErr == nil {
			scanErr = scan(rr.Values())
		}
	}
	if _, err := rr.Close(); err != nil {
		return err
	}
	return scanErr
}

// errNoRows is queryRow's error for a statement that returned no row.
var errNoRows = errors.New("postgres: no row")

// queryRow runs sql, which returns at most one row, and scans that row
// into dest (see scanValues); no row is errNoRows.
func (c *conn) queryRow(ctx context.Context, sql string, args []any, dest ...any) error {
	found := false
	err := c.query(ctx, sql, args, 1, func(values [][]byte) error {
		found = true
		return scanValues(values, dest...)
	})
	if err == nil && !found {
		return errNoRows
	}
	return err
}

// exec runs sql, which may hold several statements, with the simple
// protocol, and returns each statement's rows as text; all of them
// together at most maxRows.
func (c *conn) exec(ctx context.Context, sql string, maxRows int) ([][][]string, error) {
	c.budget.reset()
	mrr := c.pg.Exec(ctx, sql)
	var results [][][]string
	n := 0
	for mrr.NextResult() {
		rr := mrr.ResultReader()
		var rows [][]string
		for rr.NextRow() {
			if n++; n > maxRows {
				c.abort()
				_ = mrr.Close()
				return nil, fmt.Errorf("%w (more than %d)", errTooManyRows, maxRows)
			}
			row := make([]string, len(rr.Values()))
			for i, v := range rr.Values() {
				row[i] = string(v)
			}
			rows = append(rows, row)
		}
		if _, err := rr.Close(); err != nil {
			_ = mrr.Close()
			return nil, err
		}
		results = append(results, rows)
	}
	if err := mrr.Close(); err != nil {
		return nil, err
	}
	return results, nil
}

// waitForNotification waits until a notification arrives (handed to the
// connection's onNote) or ctx ends. A wait that ctx ended leaves the
// connection usable.
func (c *conn) waitForNotification(ctx context.Context) error {
	c.budget.reset()
	return c.pg.WaitForNotification(ctx)
}

// ping sends an empty statement.
func (c *conn) ping(ctx context.Context) error {
	c.budget.reset()
	return c.pg.Ping(ctx)
}

// Parameter types, sent with each statement so that the server need not
// infer them (it would take a parameter in a SELECT list for text).
const (
	oidBool        = 16
	oidInt8        = 20
	oidText        = 25
	oidTimestamptz = 1184
)

// encodeArgs is args in the text format, with their types: string,
// int64, int, bool, and time.Time (a zero time is NULL).
func encodeArgs(args []any) ([][]byte, []uint32, error) {
	values := make([][]byte, len(args))
	oids := make([]uint32, len(args))
	for i, a := range args {
		switch x := a.(type) {
		case string:
			values[i], oids[i] = []byte(x), oidText
		case int64:
			values[i], oids[i] = strconv.AppendInt(nil, x, 10), oidInt8
		case int:
			values[i], oids[i] = strconv.AppendInt(nil, int64(x), 10), oidInt8
		case bool:
			values[i], oids[i] = []byte(strconv.FormatBool(x)), oidBool
		case time.Time:
			// ISO 8601, which the server reads whatever its DateStyle.
			oids[i] = oidTimestamptz
			if !x.IsZero() {
				values[i] = x.UTC().AppendFormat(nil, "2006-01-02 15:04:05.999999Z07:00")
			}
		default:
			return nil, nil, fmt.Errorf("postgres: parameter $%d: cannot send a %T", i+1, a)
		}
	}
	return values, oids, nil
}

// scanValues sets each dest from a row's text values in order: *string
// (NULL is ""), *int64, *int, *bool, and *time.Time from microseconds
// since the Unix epoch (see epochMicros; NULL is the zero time).
func scanValues(values [][]byte, dest ...any) error {
	if len(values) != len(dest) {
		return fmt.Errorf("postgres: %d columns for %d values", len(values), len(dest))
	}
	for i, d := range dest {
		v := values[i]
		var err error
		switch x := d.(type) {
		case *string:
			*x = string(v)
		case *time.Time:
			*x = time.Time{}
			if v != nil {
				var us int64
				us, err = strconv.ParseInt(string(v), 10, 64)
				*x = time.UnixMicro(us).UTC()
			}
		case *int64:
			*x, err = strconv.ParseInt(string(v), 10, 64)
		case *int:
			*x, err = strconv.Atoi(string(v))
		case *bool:
			*x, err = strconv.ParseBool(string(v))
		default:
			return fmt.Errorf("postgres: cannot scan into %T", d)
		}
		if err != nil || v == nil && !isNullable(d) {
			// Not the value: it may be long.
			return fmt.Errorf("postgres: column %d of %d bytes is not a %T", i+1, len(v), d)
		}
	}
	return nil
}

func isNullable(d any) bool {
	switch d.(type) {
	case *string, *time.Time:
		return true
	}
	return false
}
