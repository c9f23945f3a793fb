package mysql

import (
	"context"
	"database/sql"
	"database/sql/driver"
	"math/rand/v2"
	"sync"
	"sync/atomic"
	"time"

	"github.com/leaderrun/leaderrun/backends"
)

// lossCheck bounds how often a holder reads its row: the database tells
// nobody of a change, and a loss must be seen within a second (S3).
const lossCheck = 500 * time.Millisecond

// hold is a grant's Handle: the connection that holds the lock's held
// named lock while the grant lasts (has), or tries to take it again.
type hold struct {
	s    *Store
	name string

	mu   sync.Mutex
	conn *sql.Conn
	has  bool
}

// keep checks that the connection still holds the named lock, and takes
// it if it is free: it was taken by a first waiter's look at it, or lost
// with a connection. This also keeps the connection from idling out.
func (h *hold) keep(ctx context.Context) {
	h.mu.Lock()
	defer h.mu.Unlock()
	var err error
	if h.conn == nil {
		if h.conn, err = h.s.db.Conn(ctx); err != nil {
			return
		}
	}
	err = h.conn.QueryRowContext(ctx, "SELECT COALESCE(IF(IS_USED_LOCK(?) <=> CONNECTION_ID(), 1, GET_LOCK(?, 0)), 0)",
		h.name, h.name).Scan(&h.has)
	if err != nil {
		discard(h.conn)
		h.conn, h.has = nil, false
	}
}

// release gives the named lock up, and the connection back.
func (h *hold) release(ctx context.Context) {
	h.mu.Lock()
	defer h.mu.Unlock()
	if h.conn == nil {
		return
	}
	if _, err := h.conn.ExecContext(ctx, "DO RELEASE_LOCK(?)", h.name); err != nil {
		discard(h.conn)
	} else {
		h.conn.Close()
	}
	h.conn, h.has = nil, false
}

// discard closes c for good, rather than return it to the pool: the
// session, and the named locks it may still hold, end with it.
func discard(c *sql.Conn) {
	_ = c.Raw(func(any) error { return driver.ErrBadConn })
	c.Close()
}

// Follow implements backends.RecordLock.
//
// A waiter (held nil) takes its place in the lock's queue: on a
// connection of its own, it waits in GET_LOCK for the queue's named
// lock, and is Behind until it has it. The first in line waits in
// GET_LOCK for the holder's named lock, and is woken when the holder
// gives it up (after its release) or its connection closes (it died):
// then, and when it waits longer than a lease, it says to read the row;
// the driver times the lease from what it reads. If no one holds the
// holder's named lock (a holder that died, or that lost it to a broken
// connection), the first in line reads every retry period. A waiter that
// waits in line for two lease durations reads the row: if it has been
// free or run out for as long, the first in line is not taking it (its
// process frozen), and the waiter stops being Behind.
//
// A holder is told to read its row every retry period, at most every
// lossCheck, and keeps (or takes back) the holder's named lock.
func (l *lock) Follow(ctx context.Context, c backends.Claim, held *backends.Record) (backends.Follower, error) {
	fctx, cancel := context.WithCancel(context.Background())
	f := &follower{l: l, c: c, ch: make(chan struct{}, 1), cancel: cancel, done: make(chan struct{})}
	if held != nil {
		h, _ := held.Handle.(*hold)
		go f.holding(fctx, h)
		return f, nil
	}
	f.behind.Store(true)
	if err := f.join(ctx); err != nil {
		cancel()
		return nil, l.s.fail("queue for", l.key, err)
	}
	go f.waiting(fctx)
	return f, nil
}

// follower is a waiter's place in the queue, or a holder's watch; its
// goroutine owns conn, id, first and stale.
type follower struct {
	l      *lock
	c      backends.Claim
	ch     chan struct{}
	behind atomic.Bool
	cancel context.CancelFunc
	done   chan struct{}

	conn  *sql.Conn // a waiter's connection, nil after a failure
	id    int64     // its CONNECTION_ID()
	first bool      // it holds the queue's named lock
	stale bool      // the row looked abandoned by the first in line
}

func (f *follower) Changed() <-chan struct{} { return f.ch }
func (f *follower) Behind() bool             { return f.behind.Load() }

func (f *follower) poke(waiter bool) {
	if waiter {
		f.l.s.woken.Add(1)
	}
	select {
	case f.ch <- struct{}{}:
	default:
	}
}

// Close implements backends.Follower. A waiter's session is killed, so
// that it leaves the queue at once, even in the middle of a GET_LOCK
// (the server would notice a closed connection only later).
func (f *follower) Close() {
	f.cancel()
	<-f.done
	if f.conn == nil {
		return
	}
	ctx, cancel := context.WithTimeout(context.Background(), f.c.Timings.AttemptTimeout())
	defer cancel()
	_, _ = f.l.s.db.ExecContext(ctx, "KILL ?", f.id)
	discard(f.conn)
}

// holding tells the holder to read its row at every tick, and keeps the
// holder's named lock every retry period.
func (f *follower) holding(ctx context.Context, h *hold) {
	defer close(f.done)
	t := time.NewTicker(min(f.c.Timings.RetryPeriod, lossCheck))
	defer t.Stop()
	kept := time.Now()
	for {
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		}
		f.poke(false)
		if h != nil && time.Since(kept) >= f.c.Timings.RetryPeriod {
			kctx, cancel := context.WithTimeout(ctx, f.c.Timings.AttemptTimeout())
			h.keep(kctx)
			cancel()
			kept = time.Now()
		}
	}
}

// join takes a connection and a place in the queue, first if it is free.
func (f *follower) join(ctx context.Context) error {
	conn, err := f.l.s.db.Conn(ctx)
	if err != nil {
		return err
	}
	if err := conn.QueryRowContext(ctx, "SELECT CONNECTION_ID(), COALESCE(GET_LOCK(?, 0), 0)", f.l.queue).Scan(&f.id, &f.first); err != nil {
		discard(conn)
		return err
	}
	f.conn = conn
	f.behind.Store(!f.first && !f.stale)
	return nil
}

// waiting runs a waiter's turns in the queue until Close; after a
// failure it says to read the row (the driver then learns of the
// failure), and joins again a retry period later.
func (f *follower) waiting(ctx context.Context) {
	defer close(f.done)
	wait := max(f.c.Timings.LeaseDuration, time.Second)
	for ctx.Err() == nil {
		var err error
		switch {
		case f.conn == nil:
			err = f.join(ctx)
		case f.first:
			err = f.lead(ctx, wait)
		default:
			err = f.inLine(ctx, 2*wait)
		}
		if err != nil && ctx.Err() == nil {
			if f.conn != nil {
				discard(f.conn)
				f.conn, f.first = nil, false
			}
			f.poke(true)
			f.pause(ctx)
		}
	}
}

func (f *follower) pause(ctx context.Context) {
	t := time.NewTimer(f.c.Timings.RetryPeriod - rand.N(f.c.Timings.RetryPeriod/4+1))
	defer t.Stop()
	select {
	case <-ctx.Done():
	case <-t.C:
	}
}

// seconds is d as GET_LOCK's whole seconds, at least one.
func seconds(d time.Duration) int64 { return max(int64((d+time.Second-1)/time.Second), 1) }

// inLine waits for the queue's named lock. A waiter that waited its
// turn for long reads the row, and stops being Behind if it has been
// free or run out for as long.
func (f *follower) inLine(ctx context.Context, wait time.Duration) error {
	var got sql.NullBool
	if err := f.conn.QueryRowContext(ctx, "SELECT GET_LOCK(?, ?)", f.l.queue, seconds(wait)).Scan(&got); err != nil {
		return err
	}
	if got.Bool {
		// First in line: lead says when to read the row.
		f.first = true
		f.behind.Store(false)
		return nil
	}
	var n int
	err := f.l.s.db.QueryRowContext(ctx, "SELECT COUNT(*) FROM "+f.l.s.locks+" WHERE name = ? AND "+
		"expires > UTC_TIMESTAMP(6) - INTERVAL ? MICROSECOND", f.l.key, wait.Microseconds()).Scan(&n)
	if err == nil && n == 0 && !f.stale {
		f.stale = true
		f.behind.Store(false)
		f.poke(true)
	}
	return nil
}

// lead waits, first in line, for the holder's named lock, and says to
// read the row when the holder gave it up, when no one holds it, or
// after wait. It takes the named lock only for the moment of the
// statement: the holder takes it, and a waiter that wins it takes it in
// its grant.
func (f *follower) lead(ctx context.Context, wait time.Duration) error {
	var held, got sql.NullBool
	err := f.conn.QueryRowContext(ctx, "SELECT IS_USED_LOCK(?) IS NOT NULL, GET_LOCK(?, ?), RELEASE_LOCK(?)",
		f.l.held, f.l.held, seconds(wait), f.l.held).Scan(&held, &got, new(sql.NullBool))
	if err != nil {
		return err
	}
	f.poke(true)
	if !held.Bool || got.Bool {
		// Given up by the holder: the row is read, and taken if free.
		// Held by no one: read again a retry period later.
		f.pause(ctx)
	}
	return nil
}
