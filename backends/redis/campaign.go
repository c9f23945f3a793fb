package redis

import (
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"net"
	"strconv"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/leaderrun/leaderrun/backends"
)

const (
	// wakeSlack is added to the holder's PTTL before the first waiter
	// tries again, so that it wakes just after the expiry rather than
	// just before.
	wakeSlack = 5 * time.Millisecond
	// aliveRetries is how many retry periods a waiter may stay silent
	// before the others drop it from the queue.
	aliveRetries = 3
	// subscribeTimeout bounds the wait for the wake channel's
	// subscription; without it the waiter polls every retry period.
	subscribeTimeout = 2 * time.Second
	// pubsubPing is how often an idle pub/sub connection is pinged, so
	// that one that died silently is replaced; meanwhile waiters still
	// try every retry period.
	pubsubPing = 30 * time.Second
)

// Campaign implements backends.Backend. A candidate tries the acquire
// script; while another holds the lock it waits in the queue (see the
// package doc) and tries again when its wake channel says the lock is
// free, when the holder's lease has expired by the server's clock (if it
// is first in the queue), or every retry period.
//
// A server that cannot be reached or refuses us before the first wait is
// an error wrapping backends.ErrUnavailable at once. While waiting,
// failures that may pass (the network, a restart, a failover) are retried
// with backoff; a refusal (credentials, ACL permissions) ends the
// campaign.
//
// With Config.MinReplicas, a grant that too few replicas acknowledge is
// given up, and the candidate waits again (with opts.Try: an error
// wrapping backends.ErrUnavailable).
//
// Cancelling ctx ends the campaign; the candidate leaves the queue, and
// frees the lock if an attempt whose answer never came granted it, on a
// context of its own, before Campaign returns ctx's error.
func (b *Backend) Campaign(ctx context.Context, opts backends.CampaignOptions) (backends.Lease, error) {
	if opts.Identity == "" {
		return nil, errors.New("redis: campaign without an identity")
	}
	ttl := opts.LeaseDuration
	if ttl <= 0 {
		ttl = DefaultLeaseDuration
	}
	ttl = max(ttl.Truncate(time.Millisecond), time.Millisecond)
	b.startChecks()
	var refusals int
	for {
		c := &candidate{b: b, identity: opts.Identity, holders: max(opts.Holders, 1), nonce: randomNonce(), ttl: ttl, wake: make(chan struct{}, 1)}
		l, err := c.campaign(ctx, opts.Try)
		if err != nil {
			if c.queued || c.maybeHeld {
				c.withdraw()
			}
			if ctx.Err() != nil {
				return nil, ctx.Err()
			}
			return nil, err
		}
		if b.minRepl == 0 {
			return l, nil
		}
		err = l.replicate(ctx)
		if err == nil {
			if refusals > 0 {
				b.log.Info("redis: enough replicas acknowledged the grant", "token", l.token, "min_replicas", b.minRepl)
			}
			return l, nil
		}
		rctx, cancel := context.WithTimeout(context.Background(), withdrawTimeout)
		_ = l.Release(rctx, nil)
		cancel()
		switch {
		case ctx.Err() != nil:
			return nil, ctx.Err()
		case opts.Try:
			return nil, b.unavailable("replicate the grant of", err)
		case refusals == 0:
			b.log.Warn("redis: not starting the command: the grant was not acknowledged by enough replicas; waiting again",
				"token", l.token, "err", b.redact(err))
		default:
			b.log.Debug("redis: the grant was not acknowledged by enough replicas again", "token", l.token, "err", b.redact(err))
		}
		refusals++
		if err := sleep(ctx, b.heartbeat()); err != nil {
			return nil, err
		}
	}
}

// candidate is one candidacy for the lock, with a nonce of its own.
type candidate struct {
	b        *Backend
	identity string
	holders  int // the pool size, recorded in the lock's value when more than 1
	nonce    string
	ttl      time.Duration
	wake     chan struct{} // poked when the wake channel says the lock is free

	// queued is set once an attempt may have put the candidate in the
	// queue, maybeHeld while an attempt whose answer did not come may
	// have granted it the lock: a withdrawal must then undo that.
	queued, maybeHeld bool
}

// attempt is what one run of the acquire script found.
type attempt struct {
	won     bool
	value   string // ours if won; the holder's, "" if the lock is free
	pttl    int64  // the lock's PTTL in ms (-2: no lock, -1: no expiry)
	rank    int64  // our place in the queue, 0 first; -1 with try
	waiting int64  // live waiters
	sent    time.Time
}

func (c *candidate) campaign(ctx context.Context, try bool) (*lease, error) {
	var (
		retry  backends.Backoff
		waited bool
		sub    *subscription
	)
	defer func() { sub.close() }()
	for {
		a, err := c.attempt(ctx, try)
		switch {
		case err == nil && a.won:
			return c.newLease(a)
		case err == nil && try:
			return nil, c.locked(a)
		case err == nil:
			if retry.Failures() > 0 {
				c.b.log.Info("redis: reached the server again")
			}
			retry.Reset()
			waited = true
			if sub == nil {
				// Queued now; subscribe, then try again at once: a
				// release between the attempt and the subscription
				// would not reach us.
				sub = c.subscribe()
				continue
			}
			if err := c.sleep(ctx, a); err != nil {
				return nil, err
			}
			continue
		}
		if ctx.Err() != nil {
			return nil, ctx.Err()
		}
		err = c.b.unavailable("acquire", err)
		if !waited || try || refused(err) {
			return nil, err
		}
		if retry.Failures() == 0 {
			c.b.log.Warn("redis: waiting for the lock, the server failed; retrying", "err", err)
		}
		if err := retry.Sleep(ctx); err != nil {
			return nil, err
		}
	}
}

// attempt runs the acquire script once.
func (c *candidate) attempt(ctx context.Context, try bool) (attempt, error) {
	ctx, cancel := context.WithTimeout(ctx, requestTimeout)
	defer cancel()
	mode := "try"
	if !try {
		mode = "wait"
		c.queued = true
	}
	b := c.b
	a := attempt{sent: time.Now()}
	b.attempts.Add(1)
	c.maybeHeld = true
	res, err := acquireScript().Run(ctx, b.c, b.keys, c.nonce, c.identity, millis(c.ttl), mode,
		millis(aliveRetries*b.retry), b.wakePfx, c.holders).Slice()
	if err != nil {
		return a, err
	}
	c.maybeHeld = false
	if len(res) < 3 {
		return a, fmt.Errorf("the acquire script answered %d values", len(res))
	}
	won, _ := res[0].(int64)
	a.won = won == 1
	a.value, _ = res[1].(string)
	a.pttl, _ = res[2].(int64)
	if !a.won && len(res) == 5 {
		a.rank, _ = res[3].(int64)
		a.waiting, _ = res[4].(int64)
	}
	return a, nil
}

// locked is --try's error for a lock held, or free with waiters first.
func (c *candidate) locked(a attempt) error {
	if a.value == "" {
		return fmt.Errorf("redis: %q is free, but %d candidates wait for it: %w", c.b.key, a.waiting, backends.ErrLocked)
	}
	v, err := parseValue(a.value)
	if err != nil {
		return fmt.Errorf("redis: %q holds a value that leaderrun did not write: %w", c.b.key, backends.ErrLocked)
	}
	return fmt.Errorf("redis: %q is held by %q (token %d): %w", c.b.key, v.Identity, v.Token, backends.ErrLocked)
}

// sleep waits for a poke from the wake channel, or until the holder's
// lease has expired by the server's clock if we are first in the queue,
// or for the heartbeat, whichever comes first.
func (c *candidate) sleep(ctx context.Context, a attempt) error {
	d := c.b.heartbeat()
	if a.rank == 0 && a.pttl >= 0 {
		d = min(d, time.Duration(a.pttl)*time.Millisecond+wakeSlack)
	}
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-ctx.Done():
		return ctx.Err()
	case <-c.wake:
	case <-t.C:
	}
	return nil
}

// poke wakes the waiting candidate; it never blocks.
func (c *candidate) poke() {
	select {
	case c.wake <- struct{}{}:
	default:
	}
}

// withdraw takes the candidate out of the queue and frees the lock if an
// unanswered attempt granted it, on a context of its own: the caller's
// may be cancelled already. Errors are ignored: the candidate's liveness
// deadline then takes it out of the queue, and the lock expires.
func (c *candidate) withdraw() {
	ctx, cancel := context.WithTimeout(context.Background(), withdrawTimeout)
	defer cancel()
	_ = withdrawScript().Run(ctx, c.b.c, c.b.keys, c.nonce, c.b.wakePfx).Err()
}

// heartbeat is how long a waiter sleeps at most: the retry period,
// jittered down by up to a quarter so that waiters do not march in step.
func (b *Backend) heartbeat() time.Duration {
	return b.retry - time.Duration(rand.Int64N(int64(b.retry/4)+1))
}

// millis is d in whole milliseconds, for the scripts.
func millis(d time.Duration) string { return strconv.FormatInt(d.Milliseconds(), 10) }

// sleep waits d, or until ctx ends.
func sleep(ctx context.Context, d time.Duration) error {
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-ctx.Done():
		return ctx.Err()
	case <-t.C:
		return nil
	}
}

// subscription is a waiting candidate's pub/sub connection, subscribed to
// its wake channel: a goroutine pokes the candidate for every message,
// and whenever the subscription is made again after a reconnection (a
// release meanwhile would have been missed). close stops it.
type subscription struct {
	ps     *redis.PubSub
	cancel context.CancelFunc
	done   chan struct{}
}

// subscribe subscribes to c's wake channel and waits until the server
// confirmed it, at most subscribeTimeout; if it did not, the goroutine
// keeps trying, and the waiter polls every retry period until then.
func (c *candidate) subscribe() *subscription {
	ctx, cancel := context.WithCancel(context.Background())
	s := &subscription{ps: c.b.c.Subscribe(ctx), cancel: cancel, done: make(chan struct{})}
	channel := c.b.wakePfx + c.nonce
	sctx, scancel := context.WithTimeout(ctx, subscribeTimeout)
	err := s.ps.Subscribe(sctx, channel)
	if err == nil {
		var msg any
		msg, err = receive(sctx, s.ps, subscribeTimeout)
		if _, ok := msg.(*redis.Subscription); !ok && err == nil {
			err = fmt.Errorf("unexpected %T before the subscription", msg)
		}
	}
	scancel()
	if err != nil {
		c.b.log.Info("redis: could not subscribe to the wake channel; trying every retry period until it works",
			"channel", channel, "retry_period", c.b.retry, "err", c.b.redact(err))
	}
	go s.run(ctx, c.poke)
	return s
}

func (s *subscription) run(ctx context.Context, poke func()) {
	defer close(s.done)
	var backoff backends.Backoff
	for {
		msg, err := receive(ctx, s.ps, pubsubPing)
		if ctx.Err() != nil {
			return
		}
		switch msg.(type) {
		case *redis.Message, *redis.Subscription:
			poke()
		}
		var ne net.Error
		switch {
		case err == nil:
			backoff.Reset()
		case errors.Is(err, errHostileReply):
			return // the connection is closed; the waiter polls
		case errors.As(err, &ne) && ne.Timeout():
			_ = s.ps.Ping(ctx)
		default:
			// go-redis reconnects and subscribes again on the next
			// receive; not in a busy loop while the server is down.
			if backoff.Sleep(ctx) != nil {
				return
			}
		}
	}
}

// receive is ps.ReceiveTimeout, with a panic of go-redis's parser (its
// type assertions on what a hostile server sends) turned into an error.
func receive(ctx context.Context, ps *redis.PubSub, timeout time.Duration) (msg any, err error) {
	defer func() {
		if p := recover(); p != nil {
			msg, err = nil, fmt.Errorf("%w: a pub/sub message go-redis could not read: %v", errHostileReply, p)
		}
	}()
	return ps.ReceiveTimeout(ctx, timeout)
}

// close stops the subscription and waits for its goroutine. It is safe on
// a nil subscription.
func (s *subscription) close() {
	if s == nil {
		return
	}
	s.cancel()
	_ = s.ps.Close()
	<-s.done
}
