package consul

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"net/http"
	"strings"
	"sync"
	"time"

	"github.com/hashicorp/consul/api"

	"github.com/leaderrun/leaderrun/backends"
)

// Campaign implements backends.Backend. It creates a session and tries to
// acquire the key. If another session holds it, the candidate joins the
// lock's queue and waits its turn: while others are ahead of it, in a
// blocking query on the entry just ahead; once first in line, in a blocking
// query on the lock key, timing its holder (see the package documentation).
// A goroutine of its own renews the session every TTL/2 meanwhile, so that
// no blocking query has to end early for a renewal. If the session is
// invalidated while waiting, the candidate leaves the queue and campaigns
// again with a new session, at the end of the queue.
//
// A store that cannot be reached, or refuses the token, before the first
// wait is an error wrapping backends.ErrUnavailable at once. While waiting,
// transient errors are retried for as long as the session may live (its
// TTL since the last acknowledged renewal); a refusal is final.
//
// Cancelling ctx leaves the queue, releases the key if an acquisition may
// have gone through and destroys the session, on a context of its own,
// before Campaign returns ctx's error.
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
		if err == nil {
			return l, nil
		}
		// Leave the queue: a dead entry would only make the waiter behind
		// it look twice.
		c.withdraw()
		switch {
		case errors.Is(err, errSessionGone) && ctx.Err() == nil:
			continue
		case ctx.Err() != nil:
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
	check    string        // the ID of its TTL check on the agent
	ttl      time.Duration // as granted

	mu      sync.Mutex
	lastAck time.Time // send time of the last create or renew Consul acknowledged

	// maybeHeld is set while an acquisition may have succeeded without us
	// knowing: a withdrawal must then release the key before destroying
	// the session, or Consul would impose the lock-delay on everyone.
	maybeHeld bool
	// queued is set once the candidate's queue entry may exist.
	queued bool
	// first is set once no live entry is ahead of ours: from then on the
	// candidate watches the lock key. Entries only ever join at the end,
	// so it stays first until it wins or leaves.
	first bool

	// What the last read of the lock key showed (first in line only).
	viewed bool
	index  uint64 // X-Consul-Index, for the next blocking query
	holder holder // holder.session is "" if the key is free
	free   freeSpell
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
		// Released rather than invalidated: no delay. Only a refusal tells.
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

// newCandidate registers a TTL check on the agent and creates a session
// for this lock bound to that check alone.
//
// The check's TTL is the lease duration, and the agent runs its timer: a
// candidate that stops passing it (its leaderrun died, hangs, or lost its
// link to the agent) has its check turn critical a TTL after the agent
// last heard from it, and Consul then invalidates the session at once. That
// is what frees the key of a dead holder within the lease; the session's
// own TTL (the same duration, which Consul enforces only after 2×TTL) is
// the backstop for an agent that dies with its leaderrun.
//
// The session has no other check: Consul's default would tie it to the
// agent's serfHealth check, and a host cut off from the servers would then
// lose its session (and the key, after the lock-delay) while its leaderrun,
// unable to hear of it, lets its command run until the renew deadline.
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
	b.dropDeadChecks(ctx)
	c := &candidate{b: b, identity: identity, check: newCheckID()}
	c.lastAck = time.Now()
	reg := &api.AgentCheckRegistration{
		ID:                c.check,
		Name:              checkName,
		Notes:             "leaderrun candidate for " + b.key + " (" + identity + "); its session ends when this check turns critical",
		AgentServiceCheck: api.AgentServiceCheck{TTL: ttl.String(), Status: api.HealthPassing},
	}
	if err := b.client.Agent().CheckRegisterOpts(reg, (&api.QueryOptions{}).WithContext(ctx)); err != nil {
		return nil, b.unavailable("register the TTL check "+c.check+" of a candidate for", withACLHint(err))
	}
	id, err := b.createSession(ctx, c.check, ttl)
	if err != nil {
		c.withdraw()
		return nil, err
	}
	c.session = id
	info, _, err := b.client.Session().Info(id, (&api.QueryOptions{}).WithContext(ctx))
	if err == nil && info == nil {
		// Destroyed already, by an operator.
		c.withdraw()
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

// checkName is the name of every candidate's TTL check; dropDeadChecks
// recognises them by it and by checkPrefix.
const (
	checkName   = "leaderrun"
	checkPrefix = "leaderrun:"
)

func newCheckID() string {
	var b [8]byte
	_, _ = rand.Read(b[:])
	return checkPrefix + hex.EncodeToString(b[:])
}

// createSession creates the candidate's session, bound to check. The agent
// registers a new check in the catalog a moment after it acknowledged it,
// and Consul refuses a session on a check the catalog does not have yet:
// that refusal is retried for the request's time.
//
// api.Session.Create leaves out a zero LockDelay, which Consul reads as its
// default of 15 s; the body is sent as is so that 0 means 0. NodeChecks
// alone names the check: Consul adds serfHealth to a session whose body
// has no check list, and reads a "Checks" list, even an empty one, in
// place of NodeChecks.
func (b *Backend) createSession(ctx context.Context, check string, ttl time.Duration) (string, error) {
	body := map[string]any{
		"Name":       b.sessionName(),
		"TTL":        ttl.String(),
		"LockDelay":  b.lockDelay.String(),
		"Behavior":   api.SessionBehaviorRelease,
		"NodeChecks": []string{check},
	}
	var retry backends.Backoff
	for {
		var out struct{ ID string }
		_, err := b.client.Raw().Write("/v1/session/create", body, &out, (&api.WriteOptions{}).WithContext(ctx))
		if err == nil {
			return out.ID, nil
		}
		var se api.StatusError
		if !errors.As(err, &se) || !strings.Contains(se.Body, "Missing check") || retry.Sleep(ctx) != nil {
			return "", b.unavailable("create session for", err)
		}
	}
}

// dropDeadChecks deregisters the critical checks of candidates that died
// on this agent: nothing else would remove them. A critical check's
// session is invalidated already (or will be when the agent next reaches
// the servers; deregistering it has the same effect), so no live holder
// depends on it; a candidate that finds its check gone campaigns again
// with a new one. Errors are ignored: the next candidate tries again.
func (b *Backend) dropDeadChecks(ctx context.Context) {
	q := (&api.QueryOptions{}).WithContext(ctx)
	// The filter keeps the answer to leaderrun's checks, whatever else
	// the agent runs.
	checks, err := b.client.Agent().ChecksWithFilterOpts(fmt.Sprintf("Name == %q and Status == %q", checkName, api.HealthCritical), q)
	if err != nil {
		return
	}
	for id, ch := range checks {
		if ch.Name == checkName && strings.HasPrefix(id, checkPrefix) && ch.Status == api.HealthCritical {
			_ = b.client.Agent().CheckDeregisterOpts(id, q)
		}
	}
}

// withACLHint adds, to a 403 from the agent's check endpoints, the rule a
// token needs for them.
func withACLHint(err error) error {
	var se api.StatusError
	if errors.As(err, &se) && se.Code == http.StatusForbidden {
		return fmt.Errorf("%w (a candidate's TTL check needs node write on the agent's node: node_prefix \"\" { policy = \"write\" })", err)
	}
	return err
}

// acked is the send time of the last acknowledged create or renewal.
func (c *candidate) acked() time.Time {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.lastAck
}

// campaign tries to acquire the key and, if it is held, waits in the queue
// until it does. It returns errSessionGone if the session was invalidated
// meanwhile.
//
// An error before the first wait ends the campaign: a store that cannot be
// reached or refuses us is reported at once. Once waiting, a transient
// error (see tolerate) is retried, so that a Raft election or a short
// outage of the agent does not end the campaign.
func (c *candidate) campaign(ctx context.Context, try bool) (*lease, error) {
	l, err := c.attempt(ctx)
	switch {
	case err != nil || l != nil:
		return l, err
	case try:
		return nil, fmt.Errorf("consul: %s is held by another session, or in its lock-delay: %w", c.b.key, backends.ErrLocked)
	}
	// The keep-alive cancels wctx with the reason if the session is lost.
	wctx, lose := context.WithCancelCause(ctx)
	var wg sync.WaitGroup
	wg.Add(1)
	go func() {
		defer wg.Done()
		c.keepAlive(wctx, lose)
	}()
	defer func() {
		lose(nil)
		wg.Wait()
	}()
	why := func(err error) error {
		if ctx.Err() == nil && context.Cause(wctx) != nil && !errors.Is(context.Cause(wctx), context.Canceled) {
			return context.Cause(wctx)
		}
		return err
	}
	if err := c.enqueue(wctx); err != nil {
		return nil, why(err)
	}
	var retry backends.Backoff
	for {
		if err := c.waitTurn(wctx); err != nil {
			return nil, why(err)
		}
		l, err := c.attempt(wctx)
		switch {
		case err == nil && l != nil:
			return l, nil
		case err == nil && c.holder.session == "":
			retry.Reset()
			c.free.failures++
			c.free.lastFailure = time.Now()
		case err == nil:
			// The key looked like ours and was not: read it again.
			retry.Reset()
			c.viewed = false
		default:
			if err := c.tolerate(wctx, err, &retry); err != nil {
				return nil, why(err)
			}
		}
	}
}

// attempt acquires the key, and leaves the queue in the same transaction,
// so that the waiter behind learns of it only once the key is ours. A nil
// lease with a nil error means Consul refused: another session holds the
// key, or its lock-delay is running. The transaction's answer carries the
// key's new ModifyIndex: the token.
func (c *candidate) attempt(ctx context.Context) (*lease, error) {
	ctx, cancel := context.WithTimeout(ctx, requestTimeout)
	defer cancel()
	// The lease's deadline counts from the send time of the last renewal
	// of both the session and the check that was acknowledged before the
	// acquisition was sent: neither can expire sooner than a TTL after it.
	acked := c.acked()
	rec := record{Identity: c.identity, TTL: c.ttl.String(), LockDelay: c.b.lockDelay.String()}
	ops := api.TxnOps{{KV: &api.KVTxnOp{Verb: api.KVLock, Key: c.b.key, Value: rec.encode(), Flags: recordFlags, Session: c.session}}}
	if c.queued {
		ops = append(ops, &api.TxnOp{KV: &api.KVTxnOp{Verb: api.KVDelete, Key: c.b.queueKey(c.session)}})
	}
	c.maybeHeld = true
	ok, resp, _, err := c.b.client.Txn().Txn(ops, (&api.QueryOptions{}).WithContext(ctx))
	why := txnError(resp)
	switch {
	case err != nil:
		return nil, c.b.unavailable("acquire", err)
	case !ok && strings.Contains(why, "invalid session"):
		c.maybeHeld = false
		return nil, errSessionGone
	case !ok && isPermissionDenied(why):
		c.maybeHeld = false
		return nil, c.b.unavailable("acquire", fmt.Errorf("%w: %s", errPermissionDenied, why))
	case !ok:
		c.maybeHeld = false
		return nil, nil
	case len(resp.Results) == 0 || resp.Results[0].KV == nil:
		return nil, c.b.unavailable("acquire", errors.New("transaction answer without the key"))
	}
	c.maybeHeld = false // the lease owns the key from now on
	token := resp.Results[0].KV.ModifyIndex
	return newLease(c.b, c.session, c.check, rec, token, c.ttl, acked), nil
}

// txnError is the first error a rolled-back transaction reports, "" if none.
func txnError(resp *api.TxnResponse) string {
	if resp == nil || len(resp.Errors) == 0 {
		return ""
	}
	return resp.Errors[0].What
}

// errPermissionDenied is a transaction refused by the ACLs: Consul reports
// that as an error of the transaction, not as a 403.
var errPermissionDenied = errors.New("permission denied (403)")

func isPermissionDenied(what string) bool {
	return strings.Contains(strings.ToLower(what), "permission denied")
}

// renew renews the session and passes the check once, and records the
// send time if both were acknowledged.
func (c *candidate) renew(ctx context.Context) error {
	ctx, cancel := context.WithTimeout(ctx, requestTimeout)
	defer cancel()
	sent := time.Now()
	switch err := c.b.renew(ctx, c.session, c.check); {
	case errors.Is(err, errSessionGone):
		return err
	case err != nil:
		return c.b.unavailable("renew", err)
	}
	c.mu.Lock()
	c.lastAck = sent
	c.mu.Unlock()
	return nil
}

// keepAlive renews the session and passes the check of a waiting
// candidate every TTL/2, as the api's RenewPeriodic does, leaving the other
// half for retries, until ctx ends. If the session is gone, or cannot be renewed within its TTL, it
// cancels the wait with the reason.
func (c *candidate) keepAlive(ctx context.Context, lose context.CancelCauseFunc) {
	var retry backends.Backoff
	t := time.NewTimer(time.Until(c.acked().Add(c.ttl / 2)))
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		}
		err := c.renew(ctx)
		switch {
		case err == nil:
			retry.Reset()
			t.Reset(time.Until(c.acked().Add(c.ttl / 2)))
			continue
		case ctx.Err() != nil:
			return
		case errors.Is(err, errSessionGone) || !transient(err) || time.Since(c.acked()) >= c.ttl:
			lose(err)
			return
		}
		t.Reset(retry.Next())
	}
}

// enqueue joins the queue: an entry named by the session and held by it,
// so that it dies with the session. Entries are ordered by CreateIndex, a
// Raft index: a new one always comes last.
func (c *candidate) enqueue(ctx context.Context) error {
	ctx, cancel := context.WithTimeout(ctx, requestTimeout)
	defer cancel()
	c.queued = true
	p := &api.KVPair{Key: c.b.queueKey(c.session), Value: []byte(c.identity), Session: c.session}
	_, _, err := c.b.client.KV().Acquire(p, (&api.WriteOptions{}).WithContext(ctx))
	switch {
	case isInvalidSession(err):
		return errSessionGone
	case err != nil:
		return c.b.unavailable("join the queue of", err)
	}
	return nil
}

// waitTurn blocks until this candidate is first in the queue and an
// acquisition may succeed.
func (c *candidate) waitTurn(ctx context.Context) error {
	var retry backends.Backoff
	for !c.first {
		ahead, err := c.ahead(ctx)
		if err == nil && ahead != nil {
			err = c.waitFor(ctx, ahead)
		}
		if err != nil {
			if err := c.tolerate(ctx, err, &retry); err != nil {
				return err
			}
			continue
		}
		retry.Reset()
		c.first = ahead == nil
	}
	return c.waitKey(ctx)
}

// ahead lists the queue and returns the live entry just ahead of ours, or
// nil if ours is first. Dead entries (their session is gone; Consul
// released them) are ignored and deleted. If our entry is missing (deleted
// by hand), it joins again, at the end.
func (c *candidate) ahead(ctx context.Context) (*api.KVPair, error) {
	entries, err := c.b.queue(ctx)
	if err != nil {
		return nil, c.b.unavailable("read the queue of", err)
	}
	own := c.b.queueKey(c.session)
	var prev *api.KVPair
	for _, e := range entries {
		switch {
		case e.Key == own && e.Session == c.session:
			return prev, nil
		case e.Key == own:
			return nil, errSessionGone
		case e.Session == "":
			c.b.dropDead(ctx, e)
		default:
			prev = e
		}
	}
	if err := c.enqueue(ctx); err != nil {
		return nil, err
	}
	return nil, errRequeued
}

// errRequeued: our queue entry was missing and has been created again;
// look at the queue anew.
var errRequeued = errors.New("consul: queue entry re-created")

// dropDead deletes a queue entry whose session is gone, unless it changed
// since it was read. Errors are ignored: another waiter tries again.
func (b *Backend) dropDead(ctx context.Context, e *api.KVPair) {
	ctx, cancel := context.WithTimeout(ctx, requestTimeout)
	defer cancel()
	_, _, _ = b.client.KV().DeleteCAS(e, (&api.WriteOptions{}).WithContext(ctx))
}

// waitFor blocks, in blocking queries that each last up to maxWait, until
// the entry ahead is deleted or its session is gone.
func (c *candidate) waitFor(ctx context.Context, ahead *api.KVPair) error {
	index := ahead.ModifyIndex
	for {
		pair, meta, err := c.b.get(ctx, ahead.Key, index, maxWait, false)
		switch {
		case err != nil:
			return c.b.unavailable("watch the queue of", err)
		case pair == nil:
			return nil
		case pair.Session == "":
			c.b.dropDead(ctx, pair)
			return nil
		}
		index = nextIndex(index, meta.LastIndex)
	}
}

// waitKey blocks, as the first in line, until an acquisition may succeed:
// the key is free and no lock-delay is known to be pending. It sleeps in a
// blocking query on the key, which Consul answers as soon as the key
// changes: when its holder releases it, or Consul invalidates the holder's
// session (its TTL check turned critical, or it was destroyed). A holder
// that renews does not write the key, so an idle first in line sends one
// blocking query per maxWait; it wakes up early only to retry after a
// lock-delay.
func (c *candidate) waitKey(ctx context.Context) error {
	var retry backends.Backoff
	for {
		now := time.Now()
		wake := now.Add(maxWait)
		switch {
		case !c.viewed:
		case c.holder.session == "":
			at := c.free.retryAt()
			if !now.Before(at) {
				return nil
			}
			wake = at
		case c.holder.session == c.session:
			// An earlier acquisition went through although its answer was
			// lost; acquiring again with the same session succeeds.
			return nil
		}
		index := c.index
		if !c.viewed {
			index = 0
		}
		pair, meta, err := c.b.get(ctx, c.b.key, index, wake.Sub(now), false)
		if err != nil {
			if err = c.tolerate(ctx, c.b.unavailable("watch", err), &retry); err != nil {
				return err
			}
			continue
		}
		retry.Reset()
		c.observe(ctx, pair, meta)
	}
}

// tolerate decides about a failed request while waiting: it returns nil
// after a pause if the error is transient and the session should still be
// alive (within its TTL of the last acknowledged renewal), and the error
// (or ctx's) otherwise.
func (c *candidate) tolerate(ctx context.Context, err error, retry *backends.Backoff) error {
	switch {
	case ctx.Err() != nil:
		return ctx.Err()
	case errors.Is(err, errRequeued):
		return retry.Sleep(ctx)
	case errors.Is(err, errSessionGone) || !transient(err) || time.Since(c.acked()) >= c.ttl:
		return err
	}
	return retry.Sleep(ctx)
}

// transient reports whether a failed request may succeed if sent again:
// a network error, a server error (no leader, leadership lost while
// committing) or rate limiting; not a refusal such as 403, nor an answer
// leaderrun refuses (a redirect, one past maxAnswer).
func transient(err error) bool {
	var se api.StatusError
	if errors.As(err, &se) {
		return se.Code >= 500 || se.Code == http.StatusTooManyRequests
	}
	return !errors.Is(err, errPermissionDenied) && !errors.Is(err, errRedirect) && !errors.Is(err, errTooLarge)
}

// observe records a read of the lock key, at the moment the answer came:
// never earlier than the write it shows was applied.
func (c *candidate) observe(ctx context.Context, pair *api.KVPair, meta *api.QueryMeta) {
	now := time.Now()
	if meta != nil {
		c.index = nextIndex(c.index, meta.LastIndex)
	}
	prev := c.holder
	wasHeld := c.viewed && prev.session != ""
	c.viewed = true
	if pair != nil && pair.Session != "" {
		switch {
		case pair.Session != prev.session:
			c.holder = parseHolder(pair)
			if c.holder.lockDelay < 0 {
				c.holder.lockDelay = c.lockDelayOf(ctx, pair.Session)
			}
		}
		c.free = freeSpell{}
		return
	}
	var mod uint64
	if pair != nil {
		mod = pair.ModifyIndex
	}
	if c.free.since.IsZero() || c.free.modifyIndex != mod {
		spell := freeSpell{modifyIndex: mod, since: now, delay: -1}
		if wasHeld {
			// We saw it go free: if its holder was invalidated rather
			// than released, its lock-delay runs from about now.
			spell.delay = prev.lockDelay
		}
		c.free = spell
	}
	c.holder = holder{}
}

// lockDelayOf asks Consul for a session's lock-delay, -1 if it cannot say:
// for holders whose record does not tell.
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
// may be cancelled already. It leaves the queue first, so that the waiter
// behind moves up at once. Releasing the key matters only if we may hold
// it: destroying a session that holds it would impose its lock-delay on
// every other candidate. The check goes last: deregistering it would
// invalidate the session. Errors are ignored: the check turns critical a
// TTL later, which ends the session and its entry, and the next candidate
// on this agent deregisters it.
func (c *candidate) withdraw() {
	ctx, cancel := context.WithTimeout(context.Background(), withdrawTimeout)
	defer cancel()
	wo := (&api.WriteOptions{}).WithContext(ctx)
	if c.queued {
		_, _ = c.b.client.KV().Delete(c.b.queueKey(c.session), wo)
	}
	if c.maybeHeld {
		p := &api.KVPair{Key: c.b.key, Session: c.session}
		_, _, _ = c.b.client.KV().Release(p, wo)
	}
	if c.session != "" {
		_, _ = c.b.client.Session().Destroy(c.session, wo)
	}
	_ = c.b.client.Agent().CheckDeregisterOpts(c.check, (&api.QueryOptions{}).WithContext(ctx))
}
