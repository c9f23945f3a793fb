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

// isUnknownCheck reports whether err is the agent's answer for a TTL
// check it does not have: 404 from newer agents, 500 "does not have
// associated TTL" from Consul 1.14.
func isUnknownCheck(err error) bool {
	var se api.StatusError
	if !errors.As(err, &se) {
		return false
	}
	return se.Code == http.StatusNotFound || strings.Contains(se.Body, "does not have associated TTL") ||
		strings.Contains(strings.ToLower(se.Body), "unknown check")
}

// renew passes check and renews sessions, all at the same time, and
// returns nil only if each was acknowledged. If Consul no longer has one
// of the sessions, or the agent the check (deregistered, or the agent lost
// its state), the error wraps errSessionGone: a check that is gone has
// taken its sessions with it.
func (b *Backend) renew(ctx context.Context, check string, sessions ...string) error {
	errs := make([]error, len(sessions)+1)
	var wg sync.WaitGroup
	for i, s := range sessions {
		wg.Go(func() {
			entry, _, err := b.client.Session().Renew(s, (&api.WriteOptions{}).WithContext(ctx))
			switch {
			case err == nil && entry == nil:
				errs[i] = fmt.Errorf("%w: session %s expired or was destroyed", errSessionGone, s)
			case err != nil:
				errs[i] = fmt.Errorf("renew session %s: %w", s, err)
			}
		})
	}
	// Agent.PassTTL takes no context: the same endpoint through Raw.
	_, err := b.client.Raw().Write("/v1/agent/check/pass/"+check, nil, nil, (&api.WriteOptions{}).WithContext(ctx))
	wg.Wait()
	switch {
	case isUnknownCheck(err):
		return fmt.Errorf("%w: the agent no longer has the TTL check %s", errSessionGone, check)
	case err != nil:
		errs[len(sessions)] = fmt.Errorf("pass the TTL check %s: %w", check, withACLHint(err))
	}
	for _, err := range errs {
		if errors.Is(err, errSessionGone) {
			return err
		}
	}
	return errors.Join(errs...)
}

// newCandidate registers a TTL check on the agent and creates a lock
// session bound to that check alone: the candidate is ready to acquire.
//
// The check's TTL is the lease duration, and the agent runs its timer: a
// candidate that stops passing it (its leaderrun died, hangs, or lost its
// link to the agent) has its check turn critical a TTL after the agent
// last heard from it, and Consul then invalidates the session at once. That
// is what frees the key of a dead holder within the lease; the session's
// own TTL (the same duration, which Consul enforces only after 2×TTL) is
// the backstop for an agent that dies with its leaderrun.
//
// The lock session has no other check: Consul's default would tie it to
// the agent's serfHealth check, and a host cut off from the servers would
// then lose its session (and the key, after the lock-delay) while its
// leaderrun, unable to hear of it, lets its command run until the renew
// deadline.
//
// The session is created even if ctx is cancelled meanwhile (the request
// takes a round trip), so that a cancelled campaign can always destroy it
// rather than leave it to expire.
func (b *Backend) newCandidate(ctx context.Context, opts backends.CampaignOptions) (*candidate, error) {
	if err := ctx.Err(); err != nil {
		return nil, err
	}
	ctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), requestTimeout)
	defer cancel()
	b.dropDeadChecks(ctx)
	c := &candidate{b: b, identity: opts.Identity, holders: opts.RecordedHolders(), check: newCheckID(),
		lease: opts.LeaseDuration, kick: make(chan struct{}, 1)}
	c.lastAck = time.Now()
	if err := c.registerCheck(ctx, c.lease); err != nil {
		return nil, err
	}
	id, ttl, err := c.lockSession(ctx)
	if err != nil {
		c.withdraw()
		return nil, err
	}
	c.session, c.ttl = id, ttl
	return c, nil
}

// registerCheck registers the candidate's TTL check, passing, with ttl,
// or changes the TTL of the check it has: the agent restarts its timer,
// and the sessions bound to it stay.
func (c *candidate) registerCheck(ctx context.Context, ttl time.Duration) error {
	reg := &api.AgentCheckRegistration{
		ID:                c.check,
		Name:              checkName,
		Notes:             "leaderrun candidate for " + c.b.key + " (" + c.identity + "); its sessions end when this check turns critical",
		AgentServiceCheck: api.AgentServiceCheck{TTL: ttl.String(), Status: api.HealthPassing},
	}
	if err := c.b.client.Agent().CheckRegisterOpts(reg, (&api.QueryOptions{}).WithContext(ctx)); err != nil {
		return c.b.unavailable("register the TTL check "+c.check+" of a candidate for", withACLHint(err))
	}
	return nil
}

// lockSession creates a session for the lock, bound to the candidate's
// check alone (see newCandidate), and returns it with its TTL as granted.
func (c *candidate) lockSession(ctx context.Context) (string, time.Duration, error) {
	id, err := c.b.createSession(ctx, map[string]any{
		"Name":       c.b.sessionName(),
		"TTL":        c.lease.String(),
		"LockDelay":  c.b.lockDelay.String(),
		"Behavior":   api.SessionBehaviorRelease,
		"NodeChecks": []string{c.check},
	})
	if err != nil {
		return "", 0, err
	}
	info, _, err := c.b.client.Session().Info(id, (&api.QueryOptions{}).WithContext(ctx))
	var ttl time.Duration
	switch {
	case err == nil && info == nil:
		// Destroyed already, by an operator.
		err = errSessionGone
	case err == nil:
		ttl, err = time.ParseDuration(info.TTL)
	}
	if err != nil {
		c.destroy(ctx, id)
		if !errors.Is(err, errSessionGone) {
			err = c.b.unavailable("read session for", err)
		}
		return "", 0, err
	}
	return id, ttl, nil
}

// newQueueSession creates the session that holds the candidate's queue
// entry. It has no TTL, so that a waiter further back need not renew it:
// it ends with the candidate's check (its leaderrun died or hangs: the
// check turns critical a check's TTL after the last pass) or with the
// agent's node (serfHealth: the host is gone; a host merely cut off from
// the servers loses its place, which it takes again at the end), and its
// entry with it (Behavior delete), which wakes the waiter behind.
func (c *candidate) newQueueSession(ctx context.Context) (string, error) {
	return c.b.createSession(ctx, map[string]any{
		"Name":       c.b.sessionName() + ":queue",
		"LockDelay":  "0s",
		"Behavior":   api.SessionBehaviorDelete,
		"NodeChecks": []string{"serfHealth", c.check},
	})
}

// destroy destroys session id; errors are ignored (its check ends it).
func (c *candidate) destroy(ctx context.Context, id string) {
	_, _ = c.b.client.Session().Destroy(id, (&api.WriteOptions{}).WithContext(ctx))
}

// parkedTTL is the TTL of the check of a waiter that is not first in
// line (or the lease duration, if longer), and twice the period of its
// keep-alive: such a waiter holds no lock session, and passes its check
// once every 5 minutes, about when its blocking query ends too. So a
// queue of waiters costs its agent little, and a change of leader wakes
// the two waiters at its front and no other, not even for a keep-alive
// that happens to fall then. The price: a waiter further back that dies
// without a word (SIGKILL; a host that goes down takes its sessions with
// its serfHealth) keeps its place up to parkedTTL; if it comes first in
// line meanwhile and the key is freed, the waiter behind it takes over
// only once that place is freed.
const parkedTTL = 10 * time.Minute

// park readies the candidate for a long wait further back in the queue:
// it destroys its lock session and lengthens its check's TTL to
// parkedTTL. It does nothing if the candidate is parked already.
func (c *candidate) park(ctx context.Context) error {
	c.live.Lock()
	defer c.live.Unlock()
	if c.session == "" {
		return nil
	}
	ctx, cancel := context.WithTimeout(ctx, requestTimeout)
	defer cancel()
	sent := time.Now()
	if err := c.registerCheck(ctx, max(parkedTTL, c.lease)); err != nil {
		return err
	}
	c.destroy(ctx, c.session)
	c.mu.Lock()
	c.session, c.ttl, c.lastAck = "", 0, sent
	c.mu.Unlock()
	c.wake()
	return nil
}

// ready readies a candidate that came first in line to acquire: its
// check's TTL back to the lease duration, and a lock session bound to it.
// It does nothing if the candidate is ready already.
func (c *candidate) ready(ctx context.Context) error {
	c.live.Lock()
	defer c.live.Unlock()
	if c.session != "" {
		return nil
	}
	ctx, cancel := context.WithTimeout(ctx, requestTimeout)
	defer cancel()
	// Neither the check's timer nor the session's starts before this:
	// the lease's deadline may count from it.
	sent := time.Now()
	if err := c.registerCheck(ctx, c.lease); err != nil {
		return err
	}
	id, ttl, err := c.lockSession(ctx)
	if err != nil {
		return err
	}
	c.mu.Lock()
	c.session, c.ttl, c.lastAck = id, ttl, sent
	c.mu.Unlock()
	c.wake()
	return nil
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

// createSession creates a session as body says, and returns its ID. The
// agent registers a new check in the catalog a moment after it
// acknowledged it, and Consul refuses a session on a check the catalog
// does not have yet: that refusal is retried for the request's time.
//
// api.Session.Create leaves out a zero LockDelay, which Consul reads as its
// default of 15 s; the body is sent as is so that 0 means 0. NodeChecks
// names the checks: Consul adds serfHealth to a session whose body has no
// check list, and reads a "Checks" list, even an empty one, in place of
// NodeChecks.
func (b *Backend) createSession(ctx context.Context, body map[string]any) (string, error) {
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

// acked is the send time of the last acknowledged renewal, or of the
// request that last set the check's TTL.
func (c *candidate) acked() time.Time {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.lastAck
}

// liveFor is how long after acked the candidate's sessions may live
// without a renewal: its check's TTL (and its lock session's, if any).
func (c *candidate) liveFor() time.Duration {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.session == "" {
		return max(parkedTTL, c.lease)
	}
	return min(c.lease, c.ttl)
}

// wake tells the keep-alive that the candidate was parked or readied.
func (c *candidate) wake() {
	select {
	case c.kick <- struct{}{}:
	default:
	}
}

// renew passes the check and renews the sessions once, and records the
// send time if each was acknowledged.
func (c *candidate) renew(ctx context.Context) error {
	c.live.Lock()
	defer c.live.Unlock()
	ctx, cancel := context.WithTimeout(ctx, requestTimeout)
	defer cancel()
	var sessions []string
	c.mu.Lock()
	for _, s := range []string{c.session, c.queueSession} {
		if s != "" {
			sessions = append(sessions, s)
		}
	}
	c.mu.Unlock()
	sent := time.Now()
	switch err := c.b.renew(ctx, c.check, sessions...); {
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

// keepAlive passes the check and renews the sessions of a waiting
// candidate every half of liveFor, as the api's RenewPeriodic does,
// leaving the other half for retries, until ctx ends: every TTL/2 for the
// first in line, every parkedTTL/2 further back. If a session is gone, or
// they cannot be renewed within liveFor, it cancels the wait with the
// reason.
func (c *candidate) keepAlive(ctx context.Context, lose context.CancelCauseFunc) {
	var retry backends.Backoff
	failed := false
	for {
		wait := time.Until(c.acked().Add(c.liveFor() / 2))
		if failed {
			wait = retry.Next()
		}
		t := time.NewTimer(wait)
		select {
		case <-ctx.Done():
			t.Stop()
			return
		case <-c.kick:
			// Parked or readied: a new period.
			t.Stop()
			failed = false
			continue
		case <-t.C:
		}
		err := c.renew(ctx)
		switch {
		case err == nil:
			retry.Reset()
			failed = false
		case ctx.Err() != nil:
			return
		case errors.Is(err, errSessionGone) || !transient(err) || time.Since(c.acked()) >= c.liveFor():
			lose(err)
			return
		default:
			failed = true
		}
	}
}
