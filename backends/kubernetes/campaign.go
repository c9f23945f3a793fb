package kubernetes

import (
	"context"
	"errors"
	"fmt"
	"time"

	coordinationv1 "k8s.io/api/coordination/v1"

	"github.com/leaderrun/leaderrun/backends"
)

// withdrawTimeout bounds the clean-up of a candidacy that may have
// acquired the Lease without learning it (its update got no answer): if
// the apiserver does not answer in time either, the Lease expires on its
// own.
const withdrawTimeout = 2 * time.Second

// Campaign implements backends.Backend. It reads the Lease (creating a
// free one if there is none), and takes it with a conditional update if it
// is free or its record has not changed for leaseDurationSeconds on this
// candidate's clock. Otherwise it watches the Lease and tries again when it
// is released, deleted or expires.
//
// With opts.Try it returns ErrLocked at once if the record looks alive: by
// the timestamps in it, the one use made of them, to decide how long to
// try. A holder whose record looks expired may be dead, or its clock may be
// behind; the candidate then watches the record for one lease duration on
// its own clock and takes the Lease if nothing changed, or returns
// ErrLocked as soon as the holder renews. So --try on a lock whose holder
// died without releasing it takes up to one lease duration.
//
// An apiserver that cannot be reached or refuses a request before the
// first wait is an error wrapping backends.ErrUnavailable at once; a
// refusal (RBAC, credentials) is final in every mode, and so is an answer
// or watch event that no apiserver sends (too large, not decodable) or a
// redirect. While waiting, transient errors are retried, and a watch that
// ends is opened again.
//
// Cancelling ctx returns ctx's error. A candidate that waits has written
// nothing, so there is nothing to withdraw; an acquisition whose answer was
// lost is undone on a short context of its own.
func (b *Backend) Campaign(ctx context.Context, opts backends.CampaignOptions) (backends.Lease, error) {
	if opts.Identity == "" {
		// An empty holderIdentity is how a free Lease reads.
		return nil, fmt.Errorf("kubernetes: campaign for %s needs an identity", b.Key())
	}
	if err := b.CheckLeaseDuration(opts.LeaseDuration); err != nil {
		return nil, err
	}
	c := &candidate{b: b, identity: opts.Identity, holders: opts.RecordedHolders(), seconds: leaseSeconds(opts.LeaseDuration)}
	l, err := c.campaign(ctx, opts.Try)
	if err != nil {
		c.withdraw()
		if ctx.Err() != nil {
			return nil, ctx.Err()
		}
		return nil, err
	}
	return l, nil
}

// candidate is one campaign for the Lease.
type candidate struct {
	b        *Backend
	identity string
	holders  int   // recorded with the grant (see grant.Holders)
	seconds  int32 // the leaseDurationSeconds it writes

	// w follows the Lease once the candidate first needs it (to wait, or
	// to hold what it acquires); the lease that wins takes it over.
	w *watcher

	// What the candidate knows of the Lease: its latest state (nil if it
	// does not exist), the record last seen and when it changed, on the
	// monotonic clock (client-go's observedRecord and observedTime).
	cur        *coordinationv1.Lease
	observed   record
	observedAt time.Time
	seen       bool

	// uncertain is the token of an acquisition whose answer was lost: it
	// may hold the Lease (see withdraw). 0: none.
	uncertain uint64
}

// campaign runs until the candidate holds the Lease, or fails.
func (c *candidate) campaign(ctx context.Context, try bool) (*lease, error) {
	obj, err := c.b.get(ctx)
	if err != nil {
		return nil, c.b.unavailable("get", err)
	}
	c.observe(obj)
	waited := false
	var retry backends.Backoff
	for {
		if err := ctx.Err(); err != nil {
			return nil, err
		}
		var err error
		op := ""
		switch {
		case c.cur == nil:
			op, err = "create", c.create(ctx)
		case c.takeable():
			var l *lease
			op = "update"
			if l, err = c.acquire(ctx); err == nil {
				return l, nil
			}
		case try && c.looksAlive():
			return nil, fmt.Errorf("kubernetes: lease %s is held by %q: %w", c.b.Key(), c.observed.HolderIdentity, backends.ErrLocked)
		default:
			waited = true
			op, err = "watch", c.wait(ctx)
		}
		switch {
		case err == nil:
			retry.Reset()
		case ctx.Err() != nil:
			return nil, ctx.Err()
		case op == "create" && isNotFound(err):
			// The namespace does not exist: nothing to wait for.
			return nil, c.b.unavailable(op, err)
		case isConflict(err) || isNotFound(err):
			// Someone wrote the Lease, or deleted it, since we read it:
			// read it again, and go on from what it is now.
			obj, err := c.b.get(ctx)
			if err != nil {
				if !waited || !transient(err) {
					return nil, c.b.unavailable("get", err)
				}
				if retry.Sleep(ctx) != nil {
					return nil, ctx.Err()
				}
				continue
			}
			c.observe(obj)
		case errors.Is(err, backends.ErrUnavailable):
			return nil, err
		case !waited || !transient(err):
			return nil, c.b.unavailable(op, err)
		default:
			if retry.Sleep(ctx) != nil {
				return nil, ctx.Err()
			}
		}
	}
}

// observe records a state of the Lease, read or watched (nil: it does not
// exist). The clock restarts only when the record changes: a write that
// changes nothing but annotations or labels is no sign of life.
func (c *candidate) observe(obj *coordinationv1.Lease) {
	c.cur = obj
	if obj == nil {
		return
	}
	if rec := recordOf(obj); !c.seen || rec != c.observed {
		c.observed, c.observedAt, c.seen = rec, time.Now(), true
	}
}

// expiry is when the observed record may be taken over, by client-go's
// rule: leaseDurationSeconds after it was seen to change.
func (c *candidate) expiry() time.Time {
	return c.observedAt.Add(time.Duration(c.observed.LeaseDurationSeconds) * time.Second)
}

// takeable reports whether the Lease is free, or its holder's record has
// not changed for its lease duration.
func (c *candidate) takeable() bool {
	return !c.observed.held() || time.Now().After(c.expiry())
}

// looksAlive reports whether the record's own timestamps say that its
// holder renewed it within its lease duration. It decides only whether a
// try gives up at once; never whether the Lease may be taken.
func (c *candidate) looksAlive() bool {
	if c.observed.RenewTime == 0 {
		return true
	}
	renewed := time.UnixMicro(c.observed.RenewTime)
	return time.Now().Before(renewed.Add(time.Duration(c.observed.LeaseDurationSeconds) * time.Second))
}

// create creates a free Lease, so that the grant that follows is an update
// conditional on a version, like every other (see the package doc on the
// token). If someone created it first, the caller reads it again.
func (c *candidate) create(ctx context.Context) error {
	now := stamp(time.Now())
	obj := newLeaseObject(c.b.namespace, c.b.lock)
	setRecord(obj, record{LeaseDurationSeconds: 1, AcquireTime: now, RenewTime: now})
	got, err := c.b.client.createLease(ctx, obj)
	if err != nil {
		return err // AlreadyExists is a 409, which the caller reads as a conflict
	}
	c.observe(got)
	return nil
}

// startWatch follows the Lease from the candidate's latest state, once.
func (c *candidate) startWatch() {
	if c.w == nil {
		c.w = startWatch(c.b.client, c.cur)
	}
}

// wait blocks until the Lease changes or the observed record expires.
func (c *candidate) wait(ctx context.Context) error {
	c.startWatch()
	var expired <-chan time.Time
	if c.observed.held() {
		// client-go's test is "expiry before now": wake just after it.
		t := time.NewTimer(time.Until(c.expiry()) + time.Millisecond)
		defer t.Stop()
		expired = t.C
	}
	select {
	case ch := <-c.w.changes:
		switch {
		case ch.deleted && (ch.gone || c.cur == nil || !newer(c.cur, ch.obj)):
			c.observe(nil)
		case !ch.deleted && newer(ch.obj, c.cur):
			c.observe(ch.obj)
		}
		return nil
	case <-expired:
		return nil
	case err := <-c.w.broken:
		return c.b.unavailable("watch", err)
	case <-c.w.done:
		if c.w.refused != nil {
			return c.b.unavailable("watch", c.w.refused)
		}
		return errors.New("kubernetes: watch stopped")
	case <-ctx.Done():
		return ctx.Err()
	}
}

// acquire takes the Lease with one update conditional on the version the
// candidate knows. The write is sent, and its answer awaited, even if ctx
// ends meanwhile, so that the candidate knows whether it holds the Lease.
func (c *candidate) acquire(ctx context.Context) (*lease, error) {
	obj := c.cur.DeepCopy()
	rv, err := revision(obj)
	if err != nil {
		return nil, c.b.unavailable("update", err)
	}
	token := rv + 1
	if g, ok := lastGrant(obj); ok && g.Token >= token {
		token = g.Token + 1
	}
	now := stamp(time.Now())
	rec := record{
		HolderIdentity:       c.identity,
		LeaseDurationSeconds: c.seconds,
		AcquireTime:          now,
		RenewTime:            now,
		LeaseTransitions:     recordOf(obj).LeaseTransitions + 1,
	}
	setRecord(obj, rec)
	setGrant(obj, grant{Token: token, Holder: c.identity, Transitions: rec.LeaseTransitions, Holders: c.holders})
	// The watch goes out with the update: the lease needs it from its
	// first moment, and it must be allowed (RBAC) before the lease is
	// handed out.
	c.startWatch()
	wctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), requestTimeout)
	defer cancel()
	sent := time.Now()
	got, err := c.b.client.updateLease(wctx, obj)
	if err != nil {
		if !isConflict(err) && !isNotFound(err) && !isRefusal(err) {
			c.uncertain = token
		}
		return nil, err
	}
	l := newLease(c.b, c.identity, token, c.seconds, sent, got, c.w)
	c.w = nil // the lease owns it now
	if err := l.w.ready(wctx); err != nil && isRefusal(err) {
		_ = l.Release(wctx, nil)
		return nil, c.b.unavailable("watch", err)
	}
	if err := ctx.Err(); err != nil {
		_ = l.Release(wctx, nil)
		return nil, err
	}
	return l, nil
}

// withdraw ends a campaign that did not win: it stops the watch and, if an
// acquisition may have gone through unseen, frees the Lease if that grant
// holds it.
func (c *candidate) withdraw() {
	if c.w != nil {
		c.w.stop()
		c.w = nil
	}
	if c.uncertain == 0 {
		return
	}
	ctx, cancel := context.WithTimeout(context.Background(), withdrawTimeout)
	defer cancel()
	obj, err := c.b.get(ctx)
	if err != nil || obj == nil || recordOf(obj).HolderIdentity != c.identity || holderToken(obj) != c.uncertain {
		return
	}
	free := obj.DeepCopy()
	setRecord(free, released(recordOf(obj), time.Now()))
	_, _ = c.b.client.updateLease(ctx, free)
}

// released is rec given up, as client-go's ReleaseOnCancel writes it: no
// holder, a lease of one second (so that electors that predate the
// empty-holder rule wait only that long), both times now, the count of
// transitions kept.
func released(rec record, now time.Time) record {
	return record{
		LeaseDurationSeconds: 1,
		AcquireTime:          stamp(now),
		RenewTime:            stamp(now),
		LeaseTransitions:     rec.LeaseTransitions,
	}
}
