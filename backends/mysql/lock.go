package mysql

import (
	"context"
	"database/sql"
	"database/sql/driver"
	"errors"
	"fmt"
	"math/rand/v2"
	"strconv"
	"sync"
	"sync/atomic"
	"time"

	"github.com/leaderrun/leaderrun/backends"
)

// lock is one lock's row, and the named locks of its queue: queue, held
// by the first waiter in line, then by it as the holder; and held, by the
// holder of the row. granted is this candidacy's last grant.
type lock struct {
	s                *Store
	key, queue, held string
	granted          atomic.Pointer[hold]
}

// Key implements backends.Lock.
func (l *lock) Key() string { return l.key }

// The database's clock, a lease (?) past it, and a row held by owner and
// token that has not run out.
const (
	now, expiry = "UTC_TIMESTAMP(6)", "UTC_TIMESTAMP(6) + INTERVAL ? MICROSECOND"
	live        = "name = ? AND owner = ? AND token = ? AND holder <> '' AND expires > UTC_TIMESTAMP(6)"
)

// Get implements backends.RecordLock: the row, and what is left of its
// lease by the database's clock. Waiters are not counted.
func (l *lock) Get(ctx context.Context) (backends.Record, error) {
	rec := backends.Record{Waiting: -1, Node: l.s.addr}
	err := l.s.db.QueryRowContext(ctx, "SELECT holder, owner, token, holders, ttl_us * 1000, GREATEST(TIMESTAMPDIFF(MICROSECOND, "+
		now+", expires), 0) * 1000 FROM "+l.s.locks+" WHERE name = ?", l.key).
		Scan(&rec.Holder, &rec.Owner, &rec.Token, &rec.Holders, &rec.TTL, &rec.Left)
	switch {
	case errors.Is(err, sql.ErrNoRows), isServerError(err, errNoTable):
		return backends.Record{Waiting: -1, Node: l.s.addr}, nil
	case err != nil:
		return rec, l.s.fail("read", l.key, err)
	}
	// A state of the row: its token, new for every grant, and whether it was released.
	if rec.Version = strconv.FormatUint(rec.Token, 10); rec.Holder == "" {
		rec.Version += "-free"
	}
	return rec, nil
}

// Take implements backends.RecordLock: one transaction raises the counter
// and writes the row if it is free or run out by the database's clock
// (inserts it, if prev is none), whatever prev's version. Its connection,
// the grant's Handle, then holds the holder's named lock.
func (l *lock) Take(ctx context.Context, prev backends.Record, c backends.Claim) (rec backends.Record, err error) {
	err = l.s.withTables(ctx, func() (err error) {
		rec, err = l.take(ctx, prev, c)
		return err
	})
	switch {
	case err == nil:
		return rec, nil
	case errors.Is(err, backends.ErrConflict), isServerError(err, errDupKey), isServerError(err, errDeadlock):
		return backends.Record{}, fmt.Errorf("mysql: %q is held, or changed since it was read: %w", l.key, backends.ErrConflict)
	}
	return backends.Record{}, l.s.fail("take", l.key, err)
}

func (l *lock) take(ctx context.Context, prev backends.Record, c backends.Claim) (rec backends.Record, err error) {
	conn, err := l.s.db.Conn(ctx)
	if err != nil {
		return rec, err
	}
	h := &hold{name: l.held, conn: conn}
	defer func() {
		if err != nil {
			h.release(ctx)
		}
	}()
	tx, err := conn.BeginTx(ctx, nil)
	if err != nil {
		return rec, err
	}
	defer tx.Rollback() //nolint:errcheck // nothing to undo once committed
	res, err := tx.ExecContext(ctx, "INSERT INTO "+l.s.tokens+" (name, token) VALUES (?, LAST_INSERT_ID(?)) "+
		"ON DUPLICATE KEY UPDATE token = LAST_INSERT_ID(GREATEST(token, ?) + 1)", l.key, prev.Token+1, prev.Token)
	if err != nil {
		return rec, err
	}
	token, _ := res.LastInsertId() // the driver's never fails
	ttl := c.Timings.LeaseDuration.Microseconds()
	if prev.Exists() {
		err = one(tx.ExecContext(ctx, "UPDATE "+l.s.locks+" SET holder = ?, owner = ?, token = ?, holders = ?, ttl_us = ?, acquired = "+now+
			", renewed = "+now+", expires = "+expiry+" WHERE name = ? AND (holder = '' OR expires <= "+now+")",
			c.Identity, c.Owner, token, c.Holders, ttl, ttl, l.key))
	} else {
		err = one(tx.ExecContext(ctx, "INSERT INTO "+l.s.locks+" (name, holder, owner, token, holders, ttl_us, acquired, renewed, expires) "+
			"VALUES (?, ?, ?, ?, ?, ?, "+now+", "+now+", "+expiry+")", l.key, c.Identity, c.Owner, token, c.Holders, ttl, ttl))
	}
	if err != nil {
		return rec, err
	}
	// Named locks are not transactional: a grant that does not commit gives it
	// back above. Where the server refuses them, none is held. See idle.
	_, _ = tx.ExecContext(ctx, "SET SESSION wait_timeout = ?, @held = GET_LOCK(?, 0)", idle(c.Timings), l.held)
	d := time.Duration(ttl) * time.Microsecond
	rec = backends.Record{Holder: c.Identity, Owner: c.Owner, Token: uint64(token), Holders: c.Holders, TTL: d, Left: d,
		Acquired: time.Now(), Waiting: -1, Node: l.s.addr, Version: strconv.FormatInt(token, 10), Handle: h}
	if err = tx.Commit(); err == nil {
		l.granted.Store(h)
	}
	return rec, err
}

// one is the error of a statement that should change one row (matched
// rows, with clientFoundRows): ErrConflict if it changed none.
func one(res sql.Result, err error) error {
	if err != nil {
		return err
	} else if n, _ := res.RowsAffected(); n != 1 {
		return backends.ErrConflict
	}
	return nil
}

// Keep implements backends.RecordLock: one UPDATE that moves the expiry
// a lease past the database's clock, while the row is held's and live;
// then the grant's connection keeps (or takes back) the named lock.
func (l *lock) Keep(ctx context.Context, held backends.Record) (backends.Record, error) {
	err := one(l.s.db.ExecContext(ctx, "UPDATE "+l.s.locks+" SET renewed = "+now+", expires = "+now+
		" + INTERVAL ttl_us MICROSECOND WHERE "+live, l.key, held.Owner, held.Token))
	switch {
	case errors.Is(err, backends.ErrConflict):
		return held, fmt.Errorf("mysql: %q no longer holds token %d (deleted, run out by the database's clock, or taken): %w",
			l.key, held.Token, backends.ErrLeaseLost)
	case err != nil:
		return held, l.s.fail("renew", l.key, err)
	}
	if h, ok := held.Handle.(*hold); ok {
		h.keep(ctx)
	}
	return held, nil
}

// Free implements backends.RecordLock: the row is freed if it is still
// held's, its token kept; only then are the named locks given up, which
// wakes a waiter. An unreachable server runs the lease out by its clock.
func (l *lock) Free(ctx context.Context, held backends.Record) error {
	_, err := l.s.db.ExecContext(ctx, "UPDATE "+l.s.locks+" SET holder = '', owner = '', expires = "+now+
		" WHERE name = ? AND owner = ? AND token = ?", l.key, held.Owner, held.Token)
	if h, ok := held.Handle.(*hold); ok {
		h.release(ctx)
	}
	if err != nil && !isServerError(err, errNoTable) {
		return l.s.fail("release", l.key, err)
	}
	return nil
}

// ReadDoc implements backends.Lock, reading at most one byte more than
// backends.MaxDoc.
func (l *lock) ReadDoc(ctx context.Context, name string) (backends.Doc, error) {
	d := backends.Doc{Name: name}
	var v uint64
	err := l.s.db.QueryRowContext(ctx, "SELECT version, SUBSTRING(data, 1, ?) FROM "+l.s.docs+" WHERE name = ? AND doc = ?",
		backends.MaxDoc+1, l.key, name).Scan(&v, &d.Data)
	switch {
	case errors.Is(err, sql.ErrNoRows), isServerError(err, errNoTable):
		return backends.Doc{Name: name}, nil
	case err != nil:
		return d, l.s.fail("read the "+name+" of", l.key, err)
	case len(d.Data) > backends.MaxDoc:
		return backends.Doc{Name: name}, fmt.Errorf("mysql: the %s of %q hold more than the %d bytes a document may: %w: %w",
			name, l.key, backends.MaxDoc, backends.ErrUnavailable, backends.ErrRefused)
	}
	d.Version = v
	return d, nil
}

// WriteDoc implements backends.Lock.
func (l *lock) WriteDoc(ctx context.Context, d backends.Doc) error {
	return l.docErr(d, l.s.withTables(ctx, func() error { return l.writeDoc(ctx, d, nil) }))
}

// WriteDocHeld implements backends.RecordLock: in one transaction, a
// locking read that finds the row held's (a takeover waits for the
// commit), and the document's write.
func (l *lock) WriteDocHeld(ctx context.Context, d backends.Doc, held backends.Record) error {
	return l.docErr(d, l.writeDoc(ctx, d, &held))
}

func (l *lock) docErr(d backends.Doc, err error) error {
	switch {
	case err == nil, errors.Is(err, backends.ErrLeaseLost):
		return err
	case errors.Is(err, backends.ErrConflict), isServerError(err, errDupKey), isServerError(err, errDeadlock):
		return fmt.Errorf("mysql: the %s of %q changed since they were read: %w", d.Name, l.key, backends.ErrConflict)
	}
	return l.s.fail("write the "+d.Name+" of", l.key, err)
}

// writeDoc replaces d if it is still at d.Version (inserts it if that is
// nil) with a new random version, and, with held, only while held holds
// the lock.
func (l *lock) writeDoc(ctx context.Context, d backends.Doc, held *backends.Record) error {
	tx, err := l.s.db.BeginTx(ctx, nil)
	if err != nil {
		return err
	}
	defer tx.Rollback() //nolint:errcheck // nothing to undo once committed
	if held != nil {
		err := tx.QueryRowContext(ctx, "SELECT 1 FROM "+l.s.locks+" WHERE "+live+" LOCK IN SHARE MODE", l.key, held.Owner, held.Token).Scan(new(int))
		if errors.Is(err, sql.ErrNoRows) || isServerError(err, errNoTable) {
			return fmt.Errorf("mysql: %q no longer holds token %d; the %s were not written: %w", l.key, held.Token, d.Name, backends.ErrLeaseLost)
		} else if err != nil {
			return err
		}
	}
	next, data := rand.Uint64N(1<<63)+1, append([]byte{}, d.Data...)
	if old, ok := d.Version.(uint64); ok {
		err = one(tx.ExecContext(ctx, "UPDATE "+l.s.docs+" SET version = ?, data = ? WHERE name = ? AND doc = ? AND version = ?",
			next, data, l.key, d.Name, old))
	} else {
		err = one(tx.ExecContext(ctx, "INSERT INTO "+l.s.docs+" (name, doc, version, data) VALUES (?, ?, ?, ?)", l.key, d.Name, next, data))
	}
	if err != nil {
		return err
	}
	return tx.Commit()
}

// hold is a grant's Handle: the connection that holds the holder's named
// lock, and the queue's if adopted, while the grant lasts. One that broke
// is not replaced: the first waiter then reads every retry period.
type hold struct {
	name string
	mu   sync.Mutex
	conn *sql.Conn
}

// keep takes the named lock back if it is free (a waiter's look took it
// for a moment), and keeps the connection from idling out.
func (h *hold) keep(ctx context.Context) {
	h.mu.Lock()
	defer h.mu.Unlock()
	if h.conn == nil {
		return
	} else if _, err := h.conn.ExecContext(ctx, "DO IF(IS_USED_LOCK(?) <=> CONNECTION_ID(), 1, GET_LOCK(?, 0))", h.name, h.name); err != nil {
		discard(h.conn)
		h.conn = nil
	}
}

// release gives the named locks up, waking the next waiter, and ends the session.
func (h *hold) release(ctx context.Context) {
	h.mu.Lock()
	defer h.mu.Unlock()
	if h.conn != nil {
		_, _ = h.conn.ExecContext(ctx, "DO RELEASE_ALL_LOCKS()")
		discard(h.conn)
		h.conn = nil
	}
}

// adopt makes q, the queue session of the first waiter, which won, the
// grant's: it keeps the queue's named lock, so the next waiter sleeps on
// until the grant ends (one woken per change, not two), and takes the
// holder's. A frozen holder's idles out (join), freeing both.
func (h *hold) adopt(ctx context.Context, q *sql.Conn) bool {
	h.mu.Lock()
	defer h.mu.Unlock()
	if h.conn == nil {
		return false
	}
	_, _ = h.conn.ExecContext(ctx, "DO RELEASE_LOCK(?)", h.name)
	if _, err := q.ExecContext(ctx, "DO GET_LOCK(?, 0)", h.name); err != nil {
		return false
	}
	discard(h.conn)
	h.conn = q
	return true
}

// idle is a lease in whole seconds, at least 1: how long a session with a named
// lock may idle before the server ends it (wait_timeout), and GET_LOCK's wait.
func idle(t backends.Timings) int64 {
	return max(int64(t.LeaseDuration.Round(time.Second)/time.Second), 1)
}

// discard closes c, its session and its named locks, not to be reused.
func discard(c *sql.Conn) {
	_ = c.Raw(func(any) error { return driver.ErrBadConn })
	c.Close()
}

// Follow implements backends.RecordLock. A waiter (held nil) queues
// (follower); where the server refuses named locks (Galera), it reads
// every retry period. A holder reads its row every retry period, at most
// 500 ms apart: the database tells of no change.
func (l *lock) Follow(ctx context.Context, c backends.Claim, held *backends.Record) (backends.Follower, error) {
	if held != nil {
		return backends.Poll(min(c.Timings.RetryPeriod, 500*time.Millisecond), nil), nil
	}
	f := &follower{l: l, c: c, Wake: backends.NewWake(), done: make(chan struct{})}
	if err := f.join(ctx); isServerError(err, errUnsupported) {
		return nil, nil
	} else if err != nil {
		return nil, l.s.fail("queue for", l.key, err)
	}
	fctx, cancel := context.WithCancel(context.Background())
	f.cancel = cancel
	go f.waiting(fctx)
	return f, nil
}

// follower is a waiter's place in the queue; its goroutine owns conn, id, first.
type follower struct {
	l *lock
	c backends.Claim
	backends.Wake
	behind atomic.Bool
	cancel context.CancelFunc
	done   chan struct{}
	conn   *sql.Conn // nil after a failure
	id     int64     // its CONNECTION_ID()
	first  bool      // it holds the queue's named lock
}

// Close implements backends.Follower. The first in line that won hands
// its session to the grant (adopt); any other waiter's is killed, even in
// GET_LOCK: the server would notice a closed connection a second later.
func (f *follower) Close() {
	f.cancel()
	<-f.done
	if f.conn == nil {
		return
	}
	ctx, cancel := context.WithTimeout(context.Background(), f.c.Timings.AttemptTimeout())
	defer cancel()
	if h := f.l.granted.Swap(nil); f.first && h != nil && h.adopt(ctx, f.conn) {
		return
	}
	_, _ = f.l.s.db.ExecContext(ctx, "KILL ?", f.id)
	discard(f.conn)
}

func (f *follower) Behind() bool { return f.behind.Load() }

// join takes a connection and a place in the queue, first if it is free.
// The server ends the session once it idles for a lease (wait_timeout): a
// frozen or cut off waiter, or holder (adopt), leaves the queue.
func (f *follower) join(ctx context.Context) error {
	conn, err := f.l.s.db.Conn(ctx)
	if err != nil {
		return err
	}
	if _, err = conn.ExecContext(ctx, "SET SESSION wait_timeout = ?", idle(f.c.Timings)); err == nil {
		err = conn.QueryRowContext(ctx, "SELECT CONNECTION_ID(), GET_LOCK(?, 0)", f.l.queue).Scan(&f.id, &f.first)
	}
	if err != nil {
		discard(conn)
		return err
	}
	f.conn = conn
	f.behind.Store(!f.first)
	return nil
}

// waiting runs a waiter's turns until Close. A failure is read (the
// driver learns of it), and the waiter joins again a retry period later.
func (f *follower) waiting(ctx context.Context) {
	defer close(f.done)
	lease := time.Duration(idle(f.c.Timings)) * time.Second
	for ctx.Err() == nil {
		var err error
		switch {
		case f.conn == nil:
			err = f.join(ctx)
		case f.first:
			err = f.lead(ctx, lease)
		default:
			err = f.inLine(ctx, 2*lease)
		}
		if err != nil && ctx.Err() == nil {
			if f.conn != nil {
				discard(f.conn)
				f.conn, f.first = nil, false
			}
			f.poke()
			f.pause(ctx)
		}
	}
}

// pause waits about a retry period, less a random quarter.
func (f *follower) pause(ctx context.Context) {
	select {
	case <-ctx.Done():
	case <-time.After(f.c.Timings.RetryPeriod - rand.N(f.c.Timings.RetryPeriod/4+1)):
	}
}

// poke says to read the row; one already pending stands for it.
func (f *follower) poke() {
	f.l.s.woken.Add(1)
	f.Poke()
}

// inLine waits for the queue's named lock, held by the waiter ahead or the
// holder until it leaves, or the server ends its session (frozen: idle).
func (f *follower) inLine(ctx context.Context, wait time.Duration) error {
	var got sql.NullBool
	err := f.conn.QueryRowContext(ctx, "SELECT GET_LOCK(?, ?)", f.l.queue, int64(wait/time.Second)).Scan(&got)
	if f.first = got.Bool; f.first {
		f.behind.Store(false)
		f.l.s.woken.Add(1) // it moved up the queue
	}
	return err
}

// lead waits, first in line, for the holder's named lock, and holds it
// only for the moment of the statement: a grant takes it for good.
func (f *follower) lead(ctx context.Context, wait time.Duration) error {
	var held, got sql.NullBool
	err := f.conn.QueryRowContext(ctx, "SELECT IS_USED_LOCK(?) IS NOT NULL, GET_LOCK(?, ?), RELEASE_LOCK(?)",
		f.l.held, f.l.held, int64(wait/time.Second), f.l.held).Scan(&held, &got, new(sql.NullBool))
	if err != nil {
		return err
	}
	f.poke()
	if !held.Bool || got.Bool {
		// Given up, or held by no one: look again a retry period after
		// the read, once the next holder, if any, has taken it.
		f.pause(ctx)
	}
	return nil
}
