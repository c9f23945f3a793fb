package postgres

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/leaderrun/leaderrun/backends"
)

// lease is a held row. A goroutine started by newLease checks the row
// whenever the listener says it may have changed (a notification names it,
// or the listener started listening and may have missed one), and closes
// Lost if the row is gone, held by someone else, or expired. Release stops
// it and waits for it.
type lease struct {
	b        *Backend
	identity string
	token    uint64
	ttl      time.Duration
	acquired time.Time

	*backends.Loss // Lost and Err
	check          chan struct{}
	unsubscribe    func()
	stop           context.CancelFunc
	done           chan struct{}
}

var _ backends.Lease = (*lease)(nil)

func newLease(c *candidate, token uint64, acquired time.Time) *lease {
	ctx, stop := context.WithCancel(context.Background())
	l := &lease{
		b:        c.b,
		identity: c.identity,
		token:    token,
		ttl:      time.Duration(micros(c.ttl)) * time.Microsecond,
		acquired: acquired,
		Loss:     backends.NewLoss(),
		check:    make(chan struct{}, 1),
		stop:     stop,
		done:     make(chan struct{}),
	}
	l.unsubscribe = c.b.subscribe(l.poke)
	go l.watch(ctx)
	return l
}

func (l *lease) Token() uint64       { return l.token }
func (l *lease) TTL() time.Duration  { return l.ttl }
func (l *lease) Acquired() time.Time { return l.acquired }

// Key is the name of the lease's row.
func (l *lease) Key() string { return l.b.key }

// poke asks the watcher to check the row; it never blocks.
func (l *lease) poke() {
	select {
	case l.check <- struct{}{}:
	default:
	}
}

// watch checks the row each time it is poked, until ctx ends.
func (l *lease) watch(ctx context.Context) {
	defer close(l.done)
	for {
		select {
		case <-ctx.Done():
			return
		case <-l.check:
		}
		if err := l.verify(ctx); err != nil {
			l.Set(err)
		}
	}
}

// verify reads the row and returns why it shows the lease lost, or nil. A
// failed read returns nil: whether the database can still be reached is
// for renewals and the runner's deadline to judge.
func (l *lease) verify(ctx context.Context) error {
	ctx, cancel := context.WithTimeout(ctx, requestTimeout)
	defer cancel()
	var (
		holder string
		token  int64
		alive  bool
	)
	err := l.b.do(ctx, func(c *conn) error {
		return c.queryRow(ctx, l.b.sql.verify, []any{l.b.key}, &holder, &token, &alive)
	})
	switch {
	case errors.Is(err, errNoRows) || pgCode(err) == "42P01":
		return l.lostErr(true, "", 0, false)
	case err != nil:
		if ctx.Err() == nil {
			l.b.log.Debug("postgres: could not check the row after a notification", "err", l.b.redact(err))
		}
		return nil
	}
	return l.lostErr(true, holder, uint64(token), alive)
}

// lostErr says why a row seen with (exists, holder, token, alive) is no
// longer this lease, or nil if it still is.
func (l *lease) lostErr(exists bool, holder string, token uint64, alive bool) error {
	where := fmt.Sprintf("%q in table %s", l.b.key, l.b.sql.ids.tableName)
	switch {
	case !exists || holder == "" && token == 0:
		return fmt.Errorf("postgres: the row %s was deleted: %w", where, backends.ErrLeaseLost)
	case holder != l.identity || token != l.token:
		if holder == "" {
			return fmt.Errorf("postgres: %s was freed by someone else (token %d, ours %d): %w",
				where, token, l.token, backends.ErrLeaseLost)
		}
		return fmt.Errorf("postgres: %s is held by %q with token %d, not by us (%q, token %d): %w",
			where, holder, token, l.identity, l.token, backends.ErrLeaseLost)
	case !alive:
		return fmt.Errorf("postgres: the lease on %s (token %d) expired by the database's clock: %w",
			where, l.token, backends.ErrLeaseLost)
	}
	return nil
}

// Renew implements backends.Lease with one conditional UPDATE. A lease
// already known to be lost is not renewed.
func (l *lease) Renew(ctx context.Context) error {
	if err := l.Err(); err != nil {
		return err
	}
	var (
		renewed, exists, alive bool
		holder                 string
		token                  int64
	)
	err := l.b.do(ctx, func(c *conn) error {
		return c.queryRow(ctx, l.b.sql.renew, []any{l.b.key, l.identity, int64(l.token)}, &renewed, &exists, &holder, &token, &alive)
	})
	switch {
	case pgCode(err) == "42P01":
		l.Set(fmt.Errorf("postgres: the table %s was dropped: %w", l.b.sql.ids.tableName, backends.ErrLeaseLost))
		return l.Err()
	case err != nil:
		return l.b.redact(fmt.Errorf("postgres at %s: renew %q in table %s (token %d): %w",
			l.b.addr, l.b.key, l.b.sql.ids.tableName, l.token, err))
	case renewed:
		return nil
	}
	lost := l.lostErr(exists, holder, uint64(token), alive)
	if lost == nil { // cannot be: the UPDATE's conditions are the same
		lost = fmt.Errorf("postgres: renewal of %q matched no row: %w", l.b.key, backends.ErrLeaseLost)
	}
	l.Set(lost)
	return l.Err()
}

// Completed implements backends.Backend. A table that does not exist yet
// holds no marker.
func (b *Backend) Completed(ctx context.Context, key string) (*backends.Marker, error) {
	var (
		m       = backends.Marker{Key: key}
		token   int64
		at, exp time.Time
	)
	err := b.do(ctx, func(c *conn) error {
		return c.queryRow(ctx, b.sql.completed, []any{b.key, key}, &m.Identity, &token, &at, &exp)
	})
	switch {
	case errors.Is(err, errNoRows), pgCode(err) == "42P01": // undefined_table
		return nil, nil
	case err != nil:
		return nil, b.redact(fmt.Errorf("postgres at %s: read the marker %q of %q in table %s_markers: %w",
			b.addr, key, b.key, b.sql.ids.tableName, err))
	}
	m.Token, m.At, m.Expires = uint64(token), at, exp
	return &m, nil
}

// Complete implements backends.Lease with one statement that writes the
// marker only while the row is ours and alive, holding a share lock on it
// (see the package doc). It is not retried on a broken connection: a
// first attempt that was committed without an answer, followed by a loss,
// would make a retry report ErrLeaseLost for a marker that was written.
func (l *lease) Complete(ctx context.Context, m backends.Marker) error {
	ctx, cancel := withTimeout(ctx)
	defer cancel()
	var written bool
	err := l.b.pool.with(ctx, func(c *conn) error {
		return c.queryRow(ctx, l.b.sql.complete, []any{l.b.key, l.identity, int64(l.token),
			m.Key, m.Identity, int64(m.Token), m.At, m.Expires}, &written)
	})
	switch {
	case err != nil:
		return l.b.redact(fmt.Errorf("postgres at %s: write the marker %q of %q in table %s_markers: %w",
			l.b.addr, m.Key, l.b.key, l.b.sql.ids.tableName, err))
	case !written:
		l.Set(fmt.Errorf("postgres: %q in table %s no longer holds token %d; marker %q not written: %w",
			l.b.key, l.b.sql.ids.tableName, l.token, m.Key, backends.ErrLeaseLost))
		return l.Err()
	}
	return nil
}

// Release implements backends.Lease: one statement frees the row if it is
// still ours, appends term to the history and trims the history. If that
// fails with an error from the server (the history table is missing or
// not writable), the row is freed alone, so that the history never keeps
// the lock; if the server cannot be reached, the row expires after the
// lease duration.
func (l *lease) Release(ctx context.Context, term *backends.Term) error {
	if !l.BeginRelease() {
		return nil
	}
	l.unsubscribe()
	l.stop()
	<-l.done

	var t backends.Term
	if term != nil {
		t = *term
	}
	args := []any{l.b.key, l.identity, int64(l.token),
		int64(t.Token), t.Identity, t.Acquired, t.Started, t.Ended,
		t.End, t.ExitCode, t.Signal, t.Reason, t.OnceKey, term != nil}
	var freed bool
	err := l.b.do(ctx, func(c *conn) error {
		return c.queryRow(ctx, l.b.sql.release, args, &freed)
	})
	if pgCode(err) != "" {
		histErr := err
		err = l.b.do(ctx, func(c *conn) error {
			return c.query(ctx, l.b.sql.freeOnly, []any{l.b.key, l.identity, int64(l.token)}, 0, nil)
		})
		if err == nil {
			return l.b.redact(fmt.Errorf("postgres at %s: released %q, but could not append to table %s: %w",
				l.b.addr, l.b.key, l.b.sql.ids.history, histErr))
		}
	}
	if err != nil {
		return l.b.redact(fmt.Errorf("postgres at %s: release %q in table %s (token %d): %w",
			l.b.addr, l.b.key, l.b.sql.ids.tableName, l.token, err))
	}
	return nil
}
