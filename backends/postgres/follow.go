package postgres

import (
	"context"
	"encoding/json"
	"errors"
	"sync/atomic"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"k8s.io/apimachinery/pkg/util/wait"

	"github.com/leaderrun/leaderrun/backends"
)

// A follower has a connection of its own that LISTENs on the table's
// channel, where the triggers notify every change of a row but renewals.
// Waiters first queue on a session advisory lock of their lock's own key
// (lock.queue), which PostgreSQL grants one session at a time, in order:
// only the first in line listens; the others wait in the server's lock
// queue, woken by nothing (Behind). No follower keeps a session before
// the store's probe has seen that notifications arrive (not through
// PgBouncer in transaction mode). docs/backends/postgres.md, "Loss
// detection, waiting, and poolers", has the whole of it.
const (
	modeNotify = "notify"
	modePoll   = "poll"

	// probeTimeout is how long the probe waits for its own pg_notify.
	probeTimeout = 2 * time.Second
	// pingEvery is how often an idle listening connection is pinged, so
	// that one that died silently (a stalled link) is replaced; the pings
	// keep the session within the idle_session_timeout of waiterSession.
	pingEvery = 15 * time.Second
)

// waiterSession are the settings of a waiter's session (ignored before
// PostgreSQL 14): a first waiter that stopped without its connection
// closing (a paused process) loses its place after idle_session_timeout
// (its pings keep a live one), and one that went away while behind leaves
// the lock's queue within client_connection_check_interval.
var waiterSession = []string{"SET idle_session_timeout = '40s'", "SET client_connection_check_interval = '1s'"}

var (
	errNoDelivery = errors.New("a notification sent with pg_notify did not arrive on the listening connection " +
		"(a pooler in transaction mode?)")
	errNoTriggers = errors.New("the notification triggers are not installed on the table")
)

// Follow implements backends.RecordLock: nil where the store polls.
func (l *lock) Follow(ctx context.Context, c backends.Claim, held *backends.Record) (backends.Follower, error) {
	if err := l.s.ensure(ctx, l.key); err != nil || l.s.getMode() == modePoll {
		return nil, err
	}
	fctx, cancel := context.WithCancel(context.Background())
	f := &follower{Wake: backends.NewWake(), l: l, waiter: held == nil, period: c.Timings.RetryPeriod,
		cancel: cancel, done: make(chan struct{})}
	go f.run(fctx)
	return f, nil
}

// follower follows one lock's row, for a waiter or for its holder.
type follower struct {
	backends.Wake
	l      *lock
	waiter bool
	period time.Duration // a waiter's pace while it cannot listen
	behind atomic.Bool
	cancel context.CancelFunc
	done   chan struct{}
	// failing: its connection failed, and it said so. Of its goroutine.
	failing bool
}

func (f *follower) Behind() bool { return f.behind.Load() }
func (f *follower) Close()       { f.cancel(); <-f.done }

// run follows until Close: it waits for the probe, listens, and connects
// again after a failure. While it does not listen, a waiter looks every
// retry period; a holder learns of a loss at its next renewal.
func (f *follower) run(ctx context.Context) {
	defer close(f.done)
	s := f.l.s
	for {
		var known <-chan struct{}
		switch mode := s.getMode(); mode {
		case "":
			s.startProbe()
			known = s.known
		case modePoll:
			if !f.waiter {
				return
			}
		default:
			err := f.follow(ctx)
			f.behind.Store(false)
			if ctx.Err() == nil && !f.failing {
				f.failing = true
				s.log.Info("postgres: the listening connection failed; trying again every retry period", "row", f.l.key, "err", s.redact(err))
			}
		}
		t := time.NewTimer(wait.Jitter(f.period, 0.5))
		select {
		case <-ctx.Done():
			t.Stop()
			return
		case <-known:
			t.Stop()
			continue
		case <-t.C:
		}
		if f.waiter {
			f.Poke()
		}
	}
}

// follow connects, queues a waiter, listens, and then passes on what
// concerns the row until the connection fails or ctx ends.
func (f *follower) follow(ctx context.Context) error {
	s := f.l.s
	cctx, cancel := withTimeout(ctx)
	c, err := pgx.ConnectConfig(cctx, s.listen)
	cancel()
	if err != nil {
		return err
	}
	defer c.Close(context.Background()) // bounded by the connection's deadlines
	if f.waiter {
		if err := f.queue(ctx, c); err != nil {
			return err
		}
	}
	if err := statement(ctx, c, "LISTEN "+quoteIdent(s.sql.ids.channel)); err != nil {
		return err
	}
	if f.failing {
		f.failing = false
		s.log.Info("postgres: listening again", "row", f.l.key)
	}
	f.Poke() // for what happened before LISTEN took effect
	for {
		n, err := listenFor(ctx, c, pingEvery)
		if err != nil {
			return err
		}
		var p struct{ Op, Name string } // as the trigger function writes it
		if n != nil && json.Unmarshal([]byte(n.Payload), &p) == nil && (p.Op == "truncate" || p.Name == f.l.key) {
			f.Poke()
		}
	}
}

// queue waits until the waiter is first in line.
func (f *follower) queue(ctx context.Context, c *pgx.Conn) error {
	for _, set := range waiterSession {
		_ = statement(ctx, c, set)
	}
	var first bool
	qctx, cancel := withTimeout(ctx)
	err := queryRow(qctx, c, "SELECT pg_try_advisory_lock($1)", []any{f.l.queue}, &first)
	cancel()
	if err != nil || first {
		return err
	}
	f.behind.Store(true)
	err = queryRow(ctx, c, "SELECT true FROM pg_advisory_lock($1)", []any{f.l.queue}, &first) // as long as it takes
	f.behind.Store(false)
	return err
}

// listenFor waits up to d for a notification on c; after d, it pings c,
// to learn whether the connection died silently, and returns nil.
func listenFor(ctx context.Context, c *pgx.Conn, d time.Duration) (*pgconn.Notification, error) {
	wctx, cancel := context.WithTimeout(ctx, d)
	exchange(c)
	n, err := c.WaitForNotification(wctx)
	cancel()
	switch {
	case ctx.Err() != nil:
		return nil, ctx.Err()
	case errors.Is(err, context.DeadlineExceeded) && !c.IsClosed():
		pctx, cancel := withTimeout(ctx)
		defer cancel()
		exchange(c)
		return nil, c.Ping(pctx)
	}
	return n, err
}

// startProbe starts the probe, unless the store knows the mode or a probe
// runs, on a goroutine of the store's, which Close stops.
func (s *Store) startProbe() {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.mode != "" || s.probing || s.stopped.Err() != nil {
		return
	}
	s.probing = true
	s.probes.Go(func() {
		mode, err := s.probe(s.stopped)
		s.mu.Lock()
		s.probing = false
		s.mu.Unlock()
		if err == nil {
			s.setMode(mode, errNoDelivery)
		}
	})
}

// probe LISTENs on a connection of its own, sends a notification from a
// pooled connection, and reports whether it arrives within probeTimeout.
// Its channel is its own: through a pooler, that LISTEN may stay with a
// server connection, which should not be sent every change of the table
// (docs/backends/postgres.md: PgBouncer 1.18 was seen to crash).
func (s *Store) probe(ctx context.Context) (string, error) {
	cctx, cancel := withTimeout(ctx)
	c, err := pgx.ConnectConfig(cctx, s.listen)
	cancel()
	if err != nil {
		return "", err
	}
	defer c.Close(context.Background())
	channel := "leaderrun_probe_" + randomID()
	if err := statement(ctx, c, "LISTEN "+channel); err != nil {
		return "", err
	}
	err = s.do(ctx, true, func(ctx context.Context, pc *pgx.Conn) error {
		var ok bool
		return queryRow(ctx, pc, "SELECT true FROM pg_notify($1, 'probe')", []any{channel}, &ok)
	})
	for deadline := time.Now().Add(probeTimeout); err == nil; {
		left := time.Until(deadline)
		if left <= 0 {
			_ = statement(ctx, c, "UNLISTEN *")
			return modePoll, nil
		}
		var n *pgconn.Notification
		if n, err = listenFor(ctx, c, left); n != nil && n.Channel == channel {
			return modeNotify, nil
		}
	}
	return "", err
}

func statement(ctx context.Context, c *pgx.Conn, sql string) error {
	ctx, cancel := withTimeout(ctx)
	defer cancel()
	return exec(ctx, c, sql)
}

func (s *Store) getMode() string {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.mode
}

// setMode records, and logs, whether notifications reach the followers;
// known is closed the first time.
func (s *Store) setMode(mode string, why error) {
	s.mu.Lock()
	first := s.mode == ""
	s.mode = mode
	s.mu.Unlock()
	switch {
	case !first:
		return
	case mode == modeNotify:
		s.log.Info("postgres: listening for notifications: a loss or a release is seen at once",
			"mode", mode, "channel", s.sql.ids.channel)
	default:
		s.log.Info("postgres: polling: "+why.Error()+"; waiters look every retry period and a loss is seen at the next renewal",
			"mode", mode, "table", s.sql.ids.tableName)
	}
	close(s.known)
}
