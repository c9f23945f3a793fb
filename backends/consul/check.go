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

// renew renews session and passes check, at the same time, and returns nil
// only if both were acknowledged. If Consul no longer has the session, or
// the agent the check (deregistered, or the agent lost its state), the
// error wraps errSessionGone: a check that is gone has taken its session
// with it.
func (b *Backend) renew(ctx context.Context, session, check string) error {
	var checkErr error
	var wg sync.WaitGroup
	wg.Add(1)
	go func() {
		defer wg.Done()
		// Agent.PassTTL takes no context: the same endpoint through Raw.
		_, checkErr = b.client.Raw().Write("/v1/agent/check/pass/"+check, nil, nil, (&api.WriteOptions{}).WithContext(ctx))
	}()
	entry, _, err := b.client.Session().Renew(session, (&api.WriteOptions{}).WithContext(ctx))
	wg.Wait()
	switch {
	case err == nil && entry == nil:
		return fmt.Errorf("%w: session %s expired or was destroyed", errSessionGone, session)
	case isUnknownCheck(checkErr):
		return fmt.Errorf("%w: the agent no longer has the TTL check %s of session %s", errSessionGone, check, session)
	case err != nil:
		return fmt.Errorf("renew session %s: %w", session, err)
	case checkErr != nil:
		return fmt.Errorf("pass the TTL check %s of session %s: %w", check, session, withACLHint(checkErr))
	}
	return nil
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
