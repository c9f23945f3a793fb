package backends

import (
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"sync/atomic"
	"time"
)

// wakeSlack is added to a holder's lease time left by the store's clock
// before a waiter looks again, so that it wakes just after the expiry
// rather than just before.
const wakeSlack = 5 * time.Millisecond

// maxConflicts is how many conditional writes in a row may meet another
// writer's before the campaign backs off: each is another candidate that
// won, or a store whose read and write disagree.
const maxConflicts = 3

// recordCandidacy is one candidate's campaign for a RecordLock:
// client-go's elector, for every store that keeps its lock as one record.
// It takes the record when it is free, when the store's own clock says
// the holder's lease ran out, or, for a store without a clock, when the
// record has not changed for the holder's lease duration on this
// candidate's monotonic clock, counted from when it saw the record change
// (client-go's observedTime; docs/safety.md, "The follower's clock").
type recordCandidacy struct {
	lock     RecordLock
	claim    Claim
	try      bool
	quick    bool // see elector.campaign
	answered func()

	cur        Record    // the record as last read
	observedAt time.Time // when cur was last seen to change
	seen       bool      // cur was read at least once
	fresh      bool      // cur was read since the last wait or failure

	follow   Follower // tells of changes while waiting; nil if the store cannot
	followed bool     // Follow was asked
	polled   bool     // a store that cannot tell of changes was looked at again

	// watching is the version of a record that a --try watches for one
	// lease duration, because it looked expired by its own timestamps
	// (its holder may be dead, or its clock behind); "" if none.
	watching string

	// uncertain: a Take whose answer was lost may have granted the
	// lock; withdraw looks for claim.Owner.
	uncertain bool
}

// step: after a failure, the next step reads the record again.
func (c *recordCandidacy) step(ctx context.Context) (g Grant, err error) {
	defer func() {
		if err != nil {
			c.fresh = false
		}
	}()
	for conflicts := 0; ; {
		if err := ctx.Err(); err != nil {
			return nil, err
		}
		if !c.fresh {
			rec, err := c.lock.Get(ctx)
			if err != nil {
				return nil, err
			}
			c.answered()
			c.observe(rec)
		}
		now := time.Now()
		switch {
		case c.uncertain && c.ours(c.cur):
			// The Take whose answer was lost went through. Its grant is
			// given back and taken again, at the cost of a token: the
			// store's own state of it (Record.Handle) was lost with the
			// answer.
			if err := c.lock.Free(ctx, c.cur); err != nil {
				return nil, err
			}
			c.uncertain, c.fresh = false, false
			continue
		case c.takeable(now) && !c.behind():
			g, err := c.take(ctx)
			switch {
			case errors.Is(err, ErrConflict) && conflicts < maxConflicts:
				// Someone wrote first: read again, and decide again.
				conflicts++
				c.fresh = false
				continue
			case errors.Is(err, ErrConflict):
				// A store whose reads and conditional writes keep
				// disagreeing: paced and logged by the retry loop.
				return nil, fmt.Errorf("%s: %d conflicting writes in a row: %w: %w", c.lock.Key(), conflicts+1, ErrUnavailable, err)
			case !errors.Is(err, ErrLocked) || c.try:
				return g, err
			}
			// The store keeps the lock for a waiter ahead of this one.
		case c.try && !c.tryWatches(now):
			return nil, fmt.Errorf("%s is held by %q: %w", c.lock.Key(), c.cur.Holder, ErrLocked)
		}
		if err := c.wait(ctx); err != nil {
			return nil, err
		}
		c.fresh = false
	}
}

// observe records a read of the record; its clock restarts only when the
// record changed.
func (c *recordCandidacy) observe(rec Record) {
	if !c.seen || rec.Version != c.cur.Version {
		c.observedAt = time.Now()
	}
	c.cur, c.seen, c.fresh = rec, true, true
}

func (c *recordCandidacy) ours(rec Record) bool {
	return rec.Exists() && rec.Owner != "" && rec.Owner == c.claim.Owner && rec.Left != 0
}

// behind reports whether another waiter is ahead of this one in the
// store's queue: it takes even a free lock only once woken as the first.
func (c *recordCandidacy) behind() bool { return c.follow != nil && c.follow.Behind() }

func (c *recordCandidacy) takeable(now time.Time) bool {
	r := c.cur
	switch {
	case !r.Exists(), r.Holder == "", r.Left == 0:
		return true
	case r.Left != NoClock, r.TTL <= 0:
		return false
	}
	return now.After(c.observedAt.Add(r.TTL))
}

// tryWatches decides, for a --try that found the record held, whether to
// watch it rather than give up: only while it is unchanged since it
// looked expired by its own timestamps, for a store without a clock. A
// holder that renews meanwhile ends the watch, and the try with it; one
// that stays silent for a whole lease duration is taken over.
func (c *recordCandidacy) tryWatches(now time.Time) bool {
	r := c.cur
	if c.watching != "" {
		return r.Version == c.watching
	}
	if c.quick || r.Left != NoClock || r.TTL <= 0 || r.Renewed.IsZero() || now.Before(r.Renewed.Add(r.TTL)) {
		return false
	}
	c.watching = r.Version
	return true
}

// wait blocks until the record may have changed, its lease may have run
// out, or, for a store that cannot tell of changes, a retry period has
// passed. The first wait only starts following, and returns at once so
// that a change before the follower began is read.
func (c *recordCandidacy) wait(ctx context.Context) error {
	if !c.followed {
		f, err := c.lock.Follow(ctx, c.claim, nil)
		if err != nil {
			return err
		}
		c.follow, c.followed = f, true
		if f != nil {
			return nil
		}
	}
	var changed <-chan struct{}
	timeout := time.Duration(-1)
	switch {
	case c.follow != nil:
		changed = c.follow.Changed()
	case !c.polled:
		// The first look comes at a random moment of the first period,
		// so that waiters started together do not look together.
		c.polled = true
		timeout = rand.N(max(c.claim.Timings.RetryPeriod, time.Millisecond)) + 1
	default:
		timeout = c.claim.Timings.RetryPeriod
	}
	if c.follow == nil || !c.follow.Behind() {
		if d, ok := c.expiresIn(); ok && (timeout < 0 || d < timeout) {
			timeout = d
		}
	}
	var expired <-chan time.Time
	if timeout >= 0 {
		t := time.NewTimer(timeout)
		defer t.Stop()
		expired = t.C
	}
	select {
	case <-ctx.Done():
		return ctx.Err()
	case <-changed:
	case <-expired:
	}
	return nil
}

// expiresIn is how long until the record may be taken, if it can tell.
func (c *recordCandidacy) expiresIn() (time.Duration, bool) {
	r := c.cur
	switch {
	case r.Left > 0:
		return r.Left + wakeSlack, true
	case r.Left == NoClock && r.TTL > 0:
		// client-go's test is "expiry before now": wake just after it.
		return max(time.Until(c.observedAt.Add(r.TTL))+time.Millisecond, 0), true
	}
	return 0, false
}

// take writes the grant, conditional on the record as read. The write is
// sent, and its answer awaited, even if ctx ends meanwhile, so that the
// candidate knows whether it holds the lock.
func (c *recordCandidacy) take(ctx context.Context) (Grant, error) {
	wctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), c.claim.Timings.AttemptTimeout())
	defer cancel()
	sent := time.Now()
	rec, err := c.lock.Take(wctx, c.cur, c.claim)
	if err != nil {
		if !errors.Is(err, ErrConflict) && !errors.Is(err, ErrRefused) && !errors.Is(err, ErrLocked) {
			c.uncertain = true
		}
		return nil, err
	}
	return c.won(ctx, rec, sent)
}

// won holds rec, granted by a request sent at sent: it starts following
// as the holder before the lease is handed out (a store that refuses the
// holder's watch refuses the grant).
func (c *recordCandidacy) won(ctx context.Context, rec Record, sent time.Time) (Grant, error) {
	c.uncertain = false
	c.stopFollowing()
	wctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), c.claim.Timings.AttemptTimeout())
	defer cancel()
	g, err := holdRecord(wctx, c.lock, c.claim, rec, sent)
	if err != nil {
		_ = c.lock.Free(wctx, rec)
		return nil, err
	}
	if err := ctx.Err(); err != nil {
		_ = g.Release(wctx)
		return nil, err
	}
	return g, nil
}

func (c *recordCandidacy) stopFollowing() {
	if c.follow != nil {
		c.follow.Close()
		c.follow = nil
	}
}

// withdraw frees a grant whose answer was lost, if it went through.
func (c *recordCandidacy) withdraw(ctx context.Context) {
	c.stopFollowing()
	if !c.uncertain {
		return
	}
	if rec, err := c.lock.Get(ctx); err == nil && c.ours(rec) {
		_ = c.lock.Free(ctx, rec)
	}
}

// recordGrant is the Grant of a RecordLock. Renewals rewrite the record;
// the store's follower, if it has one, tells of changes, and a change
// that is not ours is a loss (S3).
type recordGrant struct {
	lock     RecordLock
	claim    Claim
	acquired time.Time
	*Loss

	held atomic.Pointer[Record]
	stop context.CancelFunc
	done chan struct{}
}

func holdRecord(ctx context.Context, lk RecordLock, claim Claim, rec Record, sent time.Time) (*recordGrant, error) {
	f, err := lk.Follow(ctx, claim, &rec)
	if err != nil {
		return nil, err
	}
	wctx, cancel := context.WithCancel(context.Background())
	g := &recordGrant{lock: lk, claim: claim, acquired: sent, Loss: NewLoss(), stop: cancel, done: make(chan struct{})}
	g.held.Store(&rec)
	if f == nil {
		close(g.done)
	} else {
		go g.watch(wctx, f)
	}
	return g, nil
}

func (g *recordGrant) current() Record { return *g.held.Load() }

// watch reads the record whenever the follower says it may have changed,
// and sets the loss if it is no longer ours. A read that fails is tried
// again, paced, until one answers: the change it was to see may be
// announced only once.
func (g *recordGrant) watch(ctx context.Context, f Follower) {
	defer close(g.done)
	defer f.Close()
	var retry <-chan time.Time
	for {
		select {
		case <-ctx.Done():
			return
		case <-f.Changed():
		case <-retry:
		}
		rctx, cancel := context.WithTimeout(ctx, g.claim.Timings.AttemptTimeout())
		err := g.look(rctx)
		cancel()
		switch {
		case errors.Is(err, ErrLeaseLost):
			g.Set(err)
			return
		case err != nil:
			retry = time.After(min(100*time.Millisecond, g.claim.Timings.RetryPeriod))
		default:
			retry = nil
		}
	}
}

// look asks the store whether the grant still holds the lock: its own
// check (HeldChecker) if it has one, else a read of the record. Errors
// other than ErrLeaseLost decide nothing (renewals do).
func (g *recordGrant) look(ctx context.Context) error {
	if c, ok := g.lock.(HeldChecker); ok {
		return c.Check(ctx, g.current())
	}
	return g.read(ctx)
}

// read reads the record and says whether, and how, it stopped being the
// grant's: deleted, released by someone else, taken, or run out.
func (g *recordGrant) read(ctx context.Context) error {
	rec, err := g.lock.Get(ctx)
	held := g.current()
	switch {
	case err != nil:
		return err
	case !rec.Exists():
		return fmt.Errorf("%s was deleted: %w", g.lock.Key(), ErrLeaseLost)
	case rec.Holder == "":
		return fmt.Errorf("%s was released by someone else: %w", g.lock.Key(), ErrLeaseLost)
	case rec.Holder != held.Holder || rec.Token != held.Token || rec.Owner != held.Owner:
		return fmt.Errorf("%s was taken by %q with token %d: %w", g.lock.Key(), rec.Holder, rec.Token, ErrLeaseLost)
	case rec.Left == 0:
		return fmt.Errorf("%s ran out by the store's clock: %w", g.lock.Key(), ErrLeaseLost)
	}
	return nil
}

func (g *recordGrant) Token() uint64       { return g.current().Token }
func (g *recordGrant) TTL() time.Duration  { return g.current().TTL }
func (g *recordGrant) Acquired() time.Time { return g.acquired }

// Handle is the store's own state of the grant (Record.Handle).
func (g *recordGrant) Handle() any { return g.current().Handle }

func (g *recordGrant) Renew(ctx context.Context) error {
	if err := g.Err(); err != nil {
		return err
	}
	rec, err := g.lock.Keep(ctx, g.current())
	if err != nil {
		if _, checks := g.lock.(HeldChecker); !checks && errors.Is(err, ErrLeaseLost) {
			// A refused conditional write says only that the record is no
			// longer as held; one read says what became of it (deleted,
			// taken, released), where the store still answers. (A store
			// with a check of its own says why in the refusal itself.)
			if why := g.read(ctx); errors.Is(why, ErrLeaseLost) {
				err = why
			}
		}
		if errors.Is(err, ErrLeaseLost) {
			g.Set(err)
		}
		return err
	}
	g.held.Store(&rec)
	return nil
}

func (g *recordGrant) WriteDoc(ctx context.Context, d Doc) error {
	err := g.lock.WriteDocHeld(ctx, d, g.current())
	if errors.Is(err, ErrLeaseLost) {
		g.Set(err)
	}
	return err
}

func (g *recordGrant) Release(ctx context.Context) error {
	if !g.BeginRelease() {
		return nil
	}
	g.stop()
	<-g.done
	return g.lock.Free(ctx, g.current())
}
