package consul

import (
	"context"
	"errors"
	"fmt"
	"net/http"
	"time"

	"github.com/hashicorp/consul/api"

	"github.com/leaderrun/leaderrun/backends"
)

// Campaign implements backends.Backend. It creates a session, tries to
// acquire the key, and while another session holds it waits with blocking
// queries, renewing its own session every TTL/2 so that Status can count it.
// If the session is invalidated while waiting, it campaigns again with a new
// one.
//
// A store that cannot be reached, or refuses the token, before the first
// wait is an error wrapping backends.ErrUnavailable at once. While waiting,
// transient errors are retried for as long as the session may live (its
// TTL since the last acknowledged renewal).
//
// Cancelling ctx releases the key if an acquisition may have gone through
// and destroys the session, on a context of its own, before Campaign
// returns ctx's error.
func (b *Backend) Campaign(ctx context.Context, opts backends.CampaignOptions) (backends.Lease, error) {
	if err := b.CheckLeaseDuration(opts.LeaseDuration); err != nil {
		return nil, fmt.Errorf("consul: --lease-duration %v: %w", opts.LeaseDuration, err)
	}
	for {
		c, err := b.newCandidate(ctx, opts.Identity, opts.LeaseDuration)
		switch {
		case errors.Is(err, errSessionGone) && ctx.Err() == nil:
			continue
		case err != nil && ctx.Err() != nil:
			return nil, ctx.Err()
		case err != nil:
			return nil, err
		}
		l, err := c.campaign(ctx, opts.Try)
		switch {
		case err == nil:
			return l, nil
		case errors.Is(err, errSessionGone) && ctx.Err() == nil:
			continue
		}
		c.withdraw()
		if ctx.Err() != nil {
			return nil, ctx.Err()
		}
		return nil, err
	}
}

// candidate is one session's campaign for the key.
type candidate struct {
	b        *Backend
	identity string
	session  string
	ttl      time.Duration // as granted
	lastAck  time.Time     // send time of the last create or renew Consul acknowledged

	// maybeHeld is set while an acquisition may have succeeded without us
	// knowing: a withdrawal must then release the key before destroying
	// the session, or Consul would impose the lock-delay on everyone.
	maybeHeld bool

	// What the last read of the key showed.
	viewed bool
	index  uint64 // X-Consul-Index, for the next blocking query
	holder string // session holding the key, "" if free
	// holderDelay is the lock-delay of holder, or -1 if not known.
	holderDelay time.Duration
	free        freeSpell
}

// freeSpell is an unbroken run of reads that found the key free in the same
// version. An acquisition that fails on a free key meets the lock-delay of
// the session whose invalidation freed it; freeSpell times the retries.
type freeSpell struct {
	modifyIndex uint64        // the free key's ModifyIndex, 0 if deleted
	since       time.Time     // when it was first seen free
	delay       time.Duration // the lock-delay of the session that held it before, -1 if unknown
	failures    int           // acquisitions refused in this spell
	lastFailure time.Time
}

// Retry timing when the lock-delay of a free key is not known (the key was
// already free when we first looked, or the holder's session was gone
// before we could ask): back off from 50 ms to 1 s. Not knowing costs at
// most 1 s more than the delay itself, for about 20 attempts over 15 s.
const (
	firstBackoff = 50 * time.Millisecond
	maxBackoff   = time.Second
	// delaySlack is added to a known lock-delay: Consul counts it from the
	// invalidation on the server's clock, we from when we saw the key free.
	delaySlack = 5 * time.Millisecond
)

// retryAt is the earliest time an acquisition in this spell can succeed.
func (f *freeSpell) retryAt() time.Time {
	if f.failures == 0 {
		return f.since
	}
	if f.failures == 1 && f.delay > 0 {
		if at := f.since.Add(f.delay + delaySlack); at.After(f.lastFailure) {
			return at
		}
	}
	backoff := firstBackoff << min(f.failures-1, 6)
	return f.lastFailure.Add(min(backoff, maxBackoff))
}

// newCandidate creates a session for this lock. A Consul session is created
// with the local agent's serfHealth check too: if the agent's node fails,
// the session is invalidated without waiting for the TTL.
//
// The session is created even if ctx is cancelled meanwhile (the request
// takes a round trip), so that a cancelled campaign can always destroy it
// rather than leave it to expire.
func (b *Backend) newCandidate(ctx context.Context, identity string, ttl time.Duration) (*candidate, error) {
	if err := ctx.Err(); err != nil {
		return nil, err
	}
	ctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), requestTimeout)
	defer cancel()
	// api.Session.Create leaves out a zero LockDelay, which Consul reads
	// as its default of 15 s; send the body ourselves so that 0 means 0.
	body := map[string]any{
		"Name":      b.sessionName(),
		"TTL":       ttl.String(),
		"LockDelay": b.lockDelay.String(),
		"Behavior":  api.SessionBehaviorRelease,
	}
	var out struct{ ID string }
	sent := time.Now()
	if _, err := b.client.Raw().Write("/v1/session/create", body, &out, (&api.WriteOptions{}).WithContext(ctx)); err != nil {
		return nil, b.unavailable("create session for", err)
	}
	c := &candidate{b: b, identity: identity, session: out.ID, lastAck: sent, holderDelay: -1}
	info, _, err := b.client.Session().Info(out.ID, (&api.QueryOptions{}).WithContext(ctx))
	if err == nil && info == nil {
		// Destroyed already, by an operator or a failing node check.
		return nil, errSessionGone
	}
	if err == nil {
		c.ttl, err = time.ParseDuration(info.TTL)
	}
	if err != nil {
		c.withdraw()
		return nil, b.unavailable("read session for", err)
	}
	return c, nil
}

// campaign tries to acquire the key and waits for its turn until it does.
// It returns errSessionGone if the session was invalidated meanwhile.
//
// An error before the first wait ends the campaign: a store that cannot be
// reached or refuses us is reported at once. Once waiting, a transient
// error (see tolerate) is retried, so that a Raft election or a short
// outage of the agent does not end the campaign.
func (c *candidate) campaign(ctx context.Context, try bool) (*lease, error) {
	var retry backends.Backoff
	waited := false
	for {
		if err := ctx.Err(); err != nil {
			return nil, err
		}
		l, err := c.attempt(ctx)
		switch {
		case err == nil && l != nil:
			return l, nil
		case err == nil && try:
			return nil, fmt.Errorf("consul: %s is held by another session, or in its lock-delay: %w", c.b.key, backends.ErrLocked)
		case err == nil:
			retry.Reset()
			if c.viewed && c.holder == "" {
				c.free.failures++
				c.free.lastFailure = time.Now()
			}
		case !waited || try:
			return nil, err
		default:
			if err := c.tolerate(ctx, err, &retry); err != nil {
				return nil, err
			}
			continue
		}
		waited = true
		if err := c.waitTurn(ctx); err != nil {
			return nil, err
		}
	}
}

// attempt acquires the key and, if that worked, reads the token. A nil
// lease with a nil error means Consul refused: another session holds the
// key, or its lock-delay is running.
func (c *candidate) attempt(ctx context.Context) (*lease, error) {
	won, err := c.acquire(ctx)
	if err != nil || !won {
		return nil, err
	}
	l, err := c.grant(ctx)
	if errors.Is(err, errNotOurs) {
		return nil, nil
	}
	return l, err
}

// acquire sends one ?acquire= for the key.
func (c *candidate) acquire(ctx context.Context) (bool, error) {
	ctx, cancel := context.WithTimeout(ctx, requestTimeout)
	defer cancel()
	c.maybeHeld = true
	p := &api.KVPair{Key: c.b.key, Value: []byte(c.identity), Session: c.session}
	won, _, err := c.b.client.KV().Acquire(p, (&api.WriteOptions{}).WithContext(ctx))
	switch {
	case isInvalidSession(err):
		c.maybeHeld = false
		return false, errSessionGone
	case err != nil:
		return false, c.b.unavailable("acquire", err)
	}
	c.maybeHeld = won
	return won, nil
}

// errNotOurs: the key was acquired, but by the time we read it another
// session held it (or nobody): wait like every other candidate.
var errNotOurs = errors.New("consul: key not held by this session")

// grant reads the key after a successful acquisition to learn the token.
// Acquired is the send time of the session's last acknowledged create or
// renewal; the runner renews once more if that is old.
func (c *candidate) grant(ctx context.Context) (*lease, error) {
	pair, meta, err := c.b.get(ctx, 0, 0, true)
	if err != nil {
		return nil, c.b.unavailable("read", err)
	}
	if pair == nil || pair.Session != c.session {
		c.observe(ctx, pair, meta)
		return nil, errNotOurs
	}
	c.maybeHeld = false // the lease owns the key from now on
	return newLease(c.b, c.session, c.identity, pair.ModifyIndex, c.ttl, c.lastAck, meta.LastIndex), nil
}

// renew renews the session once and records the send time.
func (c *candidate) renew(ctx context.Context) error {
	ctx, cancel := context.WithTimeout(ctx, requestTimeout)
	defer cancel()
	sent := time.Now()
	entry, _, err := c.b.client.Session().Renew(c.session, (&api.WriteOptions{}).WithContext(ctx))
	switch {
	case err != nil:
		return c.b.unavailable("renew session "+c.session+" for", err)
	case entry == nil:
		return errSessionGone
	}
	c.lastAck = sent
	return nil
}

// renewAt is when a waiting candidate renews its session: at half the TTL,
// as the api's RenewPeriodic does, leaving the other half for retries.
func (c *candidate) renewAt() time.Time { return c.lastAck.Add(c.ttl / 2) }

// waitTurn blocks until an acquisition may succeed: the key is free and no
// lock-delay is known to be pending. Between reads it sleeps in a blocking
// query on the key, which Consul answers as soon as the key changes, and
// wakes up in time to renew the session or to retry after a lock-delay.
//
// A failed read or renewal is retried while the session must still be
// alive (within its TTL of the last acknowledged renewal), so that a short
// outage of the agent does not end the campaign.
func (c *candidate) waitTurn(ctx context.Context) error {
	var retry backends.Backoff
	for {
		now := time.Now()
		wake := c.renewAt()
		if c.viewed && c.holder == "" {
			at := c.free.retryAt()
			if !now.Before(at) {
				return nil
			}
			wake = earliest(wake, at)
		}
		if !now.Before(c.renewAt()) {
			if err := c.renew(ctx); err != nil {
				if err = c.tolerate(ctx, err, &retry); err != nil {
					return err
				}
			}
			continue
		}
		index := c.index
		if !c.viewed {
			index = 0
		}
		pair, meta, err := c.b.get(ctx, index, wake.Sub(now), false)
		if err != nil {
			if err = c.tolerate(ctx, c.b.unavailable("watch", err), &retry); err != nil {
				return err
			}
			continue
		}
		retry.Reset()
		if pair != nil && pair.Session == c.session {
			// An earlier acquisition went through although its answer was
			// lost; acquiring again with the same session succeeds.
			return nil
		}
		c.observe(ctx, pair, meta)
	}
}

// tolerate decides about a failed request while waiting: it returns nil
// after a pause if the error is transient and the session should still be
// alive (within its TTL of the last acknowledged renewal), and the error
// (or ctx's) otherwise.
func (c *candidate) tolerate(ctx context.Context, err error, retry *backends.Backoff) error {
	if ctx.Err() != nil {
		return ctx.Err()
	}
	if errors.Is(err, errSessionGone) || !transient(err) || time.Since(c.lastAck) >= c.ttl {
		return err
	}
	return retry.Sleep(ctx)
}

// transient reports whether a failed request may succeed if sent again:
// a network error, a server error (no leader, leadership lost while
// committing) or rate limiting; not a refusal such as 403.
func transient(err error) bool {
	var se api.StatusError
	if errors.As(err, &se) {
		return se.Code >= 500 || se.Code == http.StatusTooManyRequests
	}
	return true
}

// observe records a read of the key.
func (c *candidate) observe(ctx context.Context, pair *api.KVPair, meta *api.QueryMeta) {
	if meta != nil {
		c.index = nextIndex(c.index, meta.LastIndex)
	}
	wasHeld := c.viewed && c.holder != ""
	c.viewed = true
	if pair != nil && pair.Session != "" {
		if pair.Session != c.holder {
			c.holder = pair.Session
			c.holderDelay = c.lockDelayOf(ctx, pair.Session)
		}
		c.free = freeSpell{}
		return
	}
	var mod uint64
	if pair != nil {
		mod = pair.ModifyIndex
	}
	if c.free.since.IsZero() || c.free.modifyIndex != mod {
		delay := time.Duration(-1)
		if wasHeld {
			// We saw it go free: if its holder was invalidated rather
			// than released, its lock-delay runs from about now.
			delay = c.holderDelay
		}
		c.free = freeSpell{modifyIndex: mod, since: time.Now(), delay: delay}
	}
	c.holder = ""
}

// lockDelayOf asks Consul for a session's lock-delay, -1 if it cannot say.
func (c *candidate) lockDelayOf(ctx context.Context, session string) time.Duration {
	ctx, cancel := context.WithTimeout(ctx, requestTimeout)
	defer cancel()
	info, _, err := c.b.client.Session().Info(session, (&api.QueryOptions{}).WithContext(ctx))
	if err != nil || info == nil {
		return -1
	}
	return info.LockDelay
}

// withdraw gives up the candidacy on a context of its own: the caller's
// may be cancelled already. Releasing first matters only if we may hold
// the key: destroying a session that holds it would impose its lock-delay
// on every other candidate. Errors are ignored: the session expires by
// itself within 2×TTL.
func (c *candidate) withdraw() {
	ctx, cancel := context.WithTimeout(context.Background(), withdrawTimeout)
	defer cancel()
	wo := (&api.WriteOptions{}).WithContext(ctx)
	if c.maybeHeld {
		p := &api.KVPair{Key: c.b.key, Value: []byte(c.identity), Session: c.session}
		_, _, _ = c.b.client.KV().Release(p, wo)
	}
	_, _ = c.b.client.Session().Destroy(c.session, wo)
}

func earliest(a, b time.Time) time.Time {
	if b.Before(a) {
		return b
	}
	return a
}
