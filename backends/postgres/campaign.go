package postgres

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/leaderrun/leaderrun/backends"
)

const (
	// wakeSlack is added to a holder's remaining time before a waiter
	// tries again, so that it wakes just after the expiry rather than
	// just before.
	wakeSlack = 5 * time.Millisecond
	// maxSleep caps a waiter's sleep even with notifications: a listening
	// connection that died silently is noticed only by its next ping, and
	// a release meanwhile would otherwise wait for the end of a long
	// lease.
	maxSleep = listenPing
)

// Campaign implements backends.Backend. It creates the tables if they are
// missing, then tries to acquire the row with one conditional UPDATE; while
// another candidate holds it, it sleeps until the holder's lease expires by
// the database's clock, or until a notification says that the row changed,
// or for PollInterval when notifications are not available (see the package
// doc), and tries again.
//
// A server that cannot be reached or refuses us before the first wait is
// an error wrapping backends.ErrUnavailable at once. While waiting, failures
// that may pass (the network, a restart) are retried with backoff; a
// refusal (credentials, privileges) ends the campaign.
//
// Cancelling ctx ends the campaign; if an attempt was in flight, whose
// grant we may not have heard of, the row is freed again on a context of
// its own before Campaign returns ctx's error.
func (b *Backend) Campaign(ctx context.Context, opts backends.CampaignOptions) (backends.Lease, error) {
	if opts.Identity == "" {
		return nil, errors.New("postgres: campaign without an identity")
	}
	ttl := opts.LeaseDuration
	if ttl <= 0 {
		ttl = DefaultLeaseDuration
	}
	if err := b.ensureSchema(ctx); err != nil {
		if ctx.Err() != nil {
			return nil, ctx.Err()
		}
		return nil, err
	}
	c := &candidate{b: b, identity: opts.Identity, owner: newOwner(opts), ttl: ttl, wake: make(chan struct{}, 1)}
	if !opts.Try {
		// Subscribe before the first attempt, so that a release committed
		// after it was answered wakes us.
		defer b.subscribe(c.poke)()
	}
	l, err := c.campaign(ctx, opts.Try)
	if err != nil {
		if c.maybeHeld {
			c.withdraw()
		}
		if ctx.Err() != nil {
			return nil, ctx.Err()
		}
		return nil, err
	}
	return l, nil
}

// candidate is one campaign for the row.
type candidate struct {
	b        *Backend
	identity string
	owner    string // random: tells our own grant from another's (see newOwner)
	ttl      time.Duration
	wake     chan struct{} // poked when the row may have changed

	// maybeHeld is set while an acquisition may have succeeded without us
	// hearing of it: a withdrawal must then free the row.
	maybeHeld bool
}

// poke wakes the waiting candidate; it never blocks (the listener calls it).
func (c *candidate) poke() {
	select {
	case c.wake <- struct{}{}:
	default:
	}
}

// attempt is what one acquire statement found.
type attempt struct {
	exists bool          // the row exists (if not, nothing else is set)
	won    bool          // we hold it now, with token
	token  uint64        // ours if won, the holder's otherwise
	holder string        // the holder's identity if not won
	left   time.Duration // until the holder's lease expires, by the database's clock
	sent   time.Time     // when the statement was sent
}

func (c *candidate) campaign(ctx context.Context, try bool) (*lease, error) {
	var retry backends.Backoff
	waited := false
	for {
		a, err := c.acquire(ctx)
		switch {
		case err == nil && a.won:
			return newLease(c, a.token, a.sent), nil
		case err == nil && !a.exists:
			// Created free; the next attempt can take it at once.
			if err = c.ensureRow(ctx); err == nil {
				continue
			}
		case err == nil && try:
			return nil, fmt.Errorf("postgres: %q in table %s is held by %q (token %d): %w",
				c.b.key, c.b.sql.ids.tableName, a.holder, a.token, backends.ErrLocked)
		case err == nil:
			if retry.Failures() > 0 {
				c.b.log.Info("postgres: reached the database again")
			}
			retry.Reset()
			waited = true
			if err := c.sleep(ctx, a.left); err != nil {
				return nil, err
			}
			continue
		}
		if ctx.Err() != nil {
			return nil, ctx.Err()
		}
		if pgCode(err) == "42P01" { // undefined_table: dropped by hand
			c.b.schemaGone()
			err = c.b.ensureSchema(ctx)
		}
		if err != nil {
			if !waited || try || refused(err) {
				return nil, err
			}
			if retry.Failures() == 0 {
				c.b.log.Warn("postgres: waiting for the lock, the database failed; retrying", "err", err)
			}
			if err := retry.Sleep(ctx); err != nil {
				return nil, err
			}
		}
	}
}

// acquire sends the acquire statement once.
func (c *candidate) acquire(ctx context.Context) (attempt, error) {
	ctx, cancel := context.WithTimeout(ctx, requestTimeout)
	defer cancel()
	var a attempt
	c.maybeHeld = true
	err := c.b.do(ctx, func(pc *conn) error {
		var token, left int64
		a.sent = time.Now()
		err := pc.queryRow(ctx, c.b.sql.acquire, []any{c.b.key, c.identity, c.owner, micros(c.ttl)}, &a.won, &token, &a.holder, &left)
		a.exists = err == nil
		a.token, a.left = uint64(token), time.Duration(left)*time.Microsecond
		return err
	})
	if errors.Is(err, errNoRows) {
		c.maybeHeld = false
		return attempt{sent: a.sent}, nil
	}
	if err != nil {
		return a, c.b.unavailable("acquire", err)
	}
	c.maybeHeld = false
	return a, nil
}

// ensureRow creates the row, free, if it does not exist. It draws no
// token: see the package doc.
func (c *candidate) ensureRow(ctx context.Context) error {
	ctx, cancel := context.WithTimeout(ctx, requestTimeout)
	defer cancel()
	err := c.b.do(ctx, func(pc *conn) error {
		return pc.query(ctx, c.b.sql.ensureRow, []any{c.b.key}, 0, nil)
	})
	if err != nil {
		return c.b.unavailable("create the row", err)
	}
	return nil
}

// sleep waits until the holder's lease may have expired (left, by the
// database's clock, plus wakeSlack), or a notification says the row
// changed, but at most maxSleep. Without notifications it waits at most
// PollInterval.
func (c *candidate) sleep(ctx context.Context, left time.Duration) error {
	d := min(left+wakeSlack, maxSleep)
	if !c.b.notifying() {
		d = min(d, c.b.poll)
	}
	t := time.NewTimer(max(d, time.Millisecond))
	defer t.Stop()
	select {
	case <-ctx.Done():
		return ctx.Err()
	case <-c.wake:
	case <-t.C:
	}
	return nil
}

// withdraw frees the row if an attempt whose answer we did not get made us
// its holder, on a context of its own: the caller's may be cancelled
// already. Errors are ignored: the row then expires after the lease
// duration.
func (c *candidate) withdraw() {
	ctx, cancel := context.WithTimeout(context.Background(), withdrawTimeout)
	defer cancel()
	_ = c.b.do(ctx, func(pc *conn) error {
		return pc.query(ctx, c.b.sql.withdraw, []any{c.b.key, c.owner}, 0, nil)
	})
}
