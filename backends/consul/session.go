package consul

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"net/http"
	"strings"
	"time"

	"github.com/hashicorp/consul/api"

	"github.com/leaderrun/leaderrun/backends"
)

// checkName names every candidate's TTL check, and checkPrefix begins its
// ID: dropDeadChecks recognises them by both.
const checkName, checkPrefix = "leaderrun", "leaderrun:"

// parkedTTL is the TTL of the check of a waiter further back in the queue
// (or the lease duration, if longer), and twice the period of its
// keep-alive: it holds no lock session, and passes its check every 5
// minutes, about when its blocking query ends too. So a queue costs its
// agent little, and a change of leader makes the two waiters at its front
// send something and no other. The price: a waiter further back that dies
// without a word (SIGKILL) keeps its place up to parkedTTL.
const parkedTTL = 10 * time.Minute

// renew renews sessions ("" skipped) and passes check, and returns nil
// only if each was acknowledged. A session Consul no longer has, or a
// check the agent no longer has (which took its sessions with it), is
// errSessionGone.
func (s *Store) renew(ctx context.Context, check string, sessions ...string) error {
	for _, id := range sessions {
		if id == "" {
			continue
		}
		entry, _, err := s.client.Session().Renew(id, (&api.WriteOptions{}).WithContext(ctx))
		switch {
		case err == nil && entry == nil:
			return fmt.Errorf("%w: session %s expired or was destroyed", errSessionGone, id)
		case err != nil:
			return fmt.Errorf("renew session %s: %w", id, err)
		}
	}
	// Agent.PassTTL takes no context: the same endpoint through Raw.
	_, err := s.client.Raw().Write("/v1/agent/check/pass/"+check, nil, nil, (&api.WriteOptions{}).WithContext(ctx))
	var se api.StatusError
	switch {
	case errors.As(err, &se) && (se.Code == http.StatusNotFound || strings.Contains(se.Body, "does not have associated TTL") ||
		strings.Contains(strings.ToLower(se.Body), "unknown check")):
		// 404 from newer agents, 500 with a message from older ones.
		return fmt.Errorf("%w: the agent no longer has the TTL check %s", errSessionGone, check)
	case err != nil:
		return fmt.Errorf("pass the TTL check %s: %w", check, withACLHint(err))
	}
	return nil
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

// registerCheck registers the candidate's TTL check, passing, with ttl,
// or changes the TTL of the check it has (the agent restarts its timer;
// the sessions bound to it stay).
func (t *candidate) registerCheck(ctx context.Context, ttl time.Duration) error {
	reg := &api.AgentCheckRegistration{ID: t.check, Name: checkName,
		Notes:             "leaderrun candidate for " + t.l.key + " (" + t.claim.Identity + "); its sessions end when this check turns critical",
		AgentServiceCheck: api.AgentServiceCheck{TTL: ttl.String(), Status: api.HealthPassing}}
	if err := t.l.s.client.Agent().CheckRegisterOpts(reg, (&api.QueryOptions{}).WithContext(ctx)); err != nil {
		return t.l.s.failed("register the TTL check "+t.check+" of a candidate for", t.l.key, withACLHint(err))
	}
	return nil
}

// createSession creates the candidate's lock session (forLock), or the
// one that holds its queue entry, and returns its ID.
//
// The lock session is bound to the candidate's check alone, not to
// serfHealth (see the package documentation). The queue session has no
// TTL, so that a waiter further back need not renew it: it ends with the
// check or with the agent's node (a host merely cut off from the servers
// loses its place, and takes one again at the end), and its entry with it
// (Behavior delete), which wakes the waiter behind.
//
// The body is sent as is: api.Session.Create leaves out a zero LockDelay,
// which Consul reads as 15 s, and Consul adds serfHealth to a session
// without NodeChecks. The agent puts a new check in the catalog a moment
// after it acknowledged it, and Consul refuses a session on a check the
// catalog lacks: that refusal is retried for the request's time.
func (t *candidate) createSession(ctx context.Context, forLock bool) (string, error) {
	body := map[string]any{"Name": "leaderrun " + t.l.key + ":queue", "LockDelay": "0s",
		"Behavior": api.SessionBehaviorDelete, "NodeChecks": []string{"serfHealth", t.check}}
	if forLock {
		body = map[string]any{"Name": "leaderrun " + t.l.key, "TTL": t.claim.Timings.LeaseDuration.String(),
			"LockDelay": t.delay.String(), "Behavior": api.SessionBehaviorRelease, "NodeChecks": []string{t.check}}
	}
	for pause := 10 * time.Millisecond; ; pause = min(2*pause, 500*time.Millisecond) {
		var out struct{ ID string }
		_, err := t.l.s.client.Raw().Write("/v1/session/create", body, &out, (&api.WriteOptions{}).WithContext(ctx))
		if err == nil {
			return out.ID, nil
		}
		var se api.StatusError
		if !errors.As(err, &se) || !strings.Contains(se.Body, "Missing check") || sleep(ctx, pause) != nil {
			return "", t.l.s.failed("create session for", t.l.key, err)
		}
	}
}

// dropDeadChecks deregisters the critical checks of candidates that died
// on this agent: nothing else would. Their sessions are invalidated
// already (or will be, as deregistering does), so no live holder depends
// on them. Errors are ignored: the next candidate tries again.
func (s *Store) dropDeadChecks(ctx context.Context) {
	q := (&api.QueryOptions{}).WithContext(ctx)
	checks, err := s.client.Agent().ChecksWithFilterOpts(fmt.Sprintf("Name == %q and Status == %q", checkName, api.HealthCritical), q)
	for id, ch := range checks {
		if err == nil && ch.Name == checkName && strings.HasPrefix(id, checkPrefix) && ch.Status == api.HealthCritical {
			_ = s.client.Agent().CheckDeregisterOpts(id, q)
		}
	}
}

func newCheckID() string {
	var b [8]byte
	_, _ = rand.Read(b[:])
	return checkPrefix + hex.EncodeToString(b[:])
}

// setReady readies the candidate to acquire (its check's TTL back to the
// lease duration, and a new lock session), or parks it for a long wait
// further back in the queue (its lock session destroyed, its check's TTL
// parkedTTL). It does nothing if the candidate is so already.
func (t *candidate) setReady(ctx context.Context, ready bool) error {
	t.mu.Lock()
	defer t.mu.Unlock()
	if (t.session != "") == ready {
		return nil
	}
	// Neither the check's timer nor a new session's starts before this:
	// the lease's deadline may count from it.
	sent, ttl, id := time.Now(), max(parkedTTL, t.claim.Timings.LeaseDuration), ""
	if ready {
		ttl = t.claim.Timings.LeaseDuration
	}
	err := t.registerCheck(ctx, ttl)
	switch {
	case err == nil && ready:
		id, err = t.createSession(ctx, true)
	case err == nil:
		_, _ = t.l.s.client.Session().Destroy(t.session, (&api.WriteOptions{}).WithContext(ctx))
	}
	if err == nil {
		t.session, t.lastAck = id, sent
	}
	return err
}

// acked is the send time of the last acknowledged renewal or check
// registration, and life how long after it the candidate's sessions live
// without a renewal: its check's TTL, its lock session's if any.
func (t *candidate) acked() (at time.Time, life time.Duration) {
	t.mu.Lock()
	defer t.mu.Unlock()
	if life = t.claim.Timings.LeaseDuration; t.session == "" {
		life = max(parkedTTL, life)
	}
	return t.lastAck, life
}

// keepAlive passes the check and renews the sessions of a waiting
// candidate every half of their life, as the api's RenewPeriodic does, and
// every second after a failure, until ctx ends; it looks at least every
// half lease, to notice a candidate readied meanwhile. If a session is
// gone, the agent refuses, or they could not be renewed within their
// life, it ends the candidacy (t.end) with the reason.
func (t *candidate) keepAlive(ctx context.Context) {
	defer close(t.done)
	for {
		acked, life := t.acked()
		if due := time.Until(acked.Add(life / 2)); due > 0 {
			if sleep(ctx, min(due, t.claim.Timings.LeaseDuration/2)) != nil {
				return
			}
			continue
		}
		err := t.renew(ctx)
		switch {
		case err == nil:
			continue
		case ctx.Err() != nil:
			return
		case errors.Is(err, errSessionGone):
		case refused(err):
			err = t.l.s.failed("renew the sessions of a candidate for", t.l.key, err)
		case time.Since(acked) < life:
			if sleep(ctx, time.Second) != nil {
				return
			}
			continue
		default:
			err = fmt.Errorf("consul: could not renew the sessions of a candidate for %s in time: %w: %v", t.l.key, backends.ErrEnded, err)
		}
		t.end(err)
		return
	}
}

// renew passes the check and renews the sessions once, and records the
// send time if each was acknowledged.
func (t *candidate) renew(ctx context.Context) error {
	t.mu.Lock()
	defer t.mu.Unlock()
	sent := time.Now()
	err := t.l.s.renew(ctx, t.check, t.session, t.qsession)
	if err == nil {
		t.lastAck = sent
	}
	return err
}
