package consul

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"net/http"
	"slices"
	"strings"
	"time"

	"github.com/hashicorp/consul/api"

	"github.com/leaderrun/leaderrun/backends"
)

// checkName names every candidate's TTL check, checkPrefix begins its ID.
const checkName, checkPrefix = "leaderrun", "leaderrun:"

// parkedTTL is the check's TTL of a waiter further back in the queue (or
// the lease duration, if longer), so that a change of leader makes only
// the two at the front send anything (docs/backends/consul.md, "Waiting:
// a queue", gives the price).
const parkedTTL = 10 * time.Minute

// queue lists the entries of the lock's queue of waiters, oldest first.
func (l *lock) queue(ctx context.Context) (api.KVPairs, error) {
	pairs, _, err := l.s.client.KV().List(l.queuePrefix(), (&api.QueryOptions{}).WithContext(ctx))
	if err != nil {
		return nil, l.s.failed("read the queue of", l.key, err)
	}
	slices.SortFunc(pairs, func(a, b *api.KVPair) int { return cmp.Compare(a.CreateIndex, b.CreateIndex) })
	return pairs, nil
}

// waitTurn blocks until this candidate is first in the queue and an
// acquisition may succeed. Behind others it is parked; first in line, it
// is readied before it watches the key.
func (t *candidate) waitTurn(ctx context.Context) error {
	for !t.first {
		ahead, err := t.ahead(ctx)
		if err == nil && ahead != nil {
			if err = t.setReady(ctx, false); err == nil {
				err = t.waitFor(ctx, ahead)
			}
		}
		if err != nil {
			return err
		}
		t.first = ahead == nil
	}
	if err := t.setReady(ctx, true); err != nil {
		return err
	}
	return t.waitKey(ctx)
}

// ahead returns the live entry just ahead of ours, nil if ours is first.
// Dead entries (an older leaderrun's, released) are skipped and deleted;
// our entry gone (deleted by hand) ends the candidacy.
func (t *candidate) ahead(ctx context.Context) (*api.KVPair, error) {
	entries, err := t.l.queue(ctx)
	if err != nil {
		return nil, err
	}
	var prev *api.KVPair
	for _, e := range entries {
		switch {
		case e.Session == t.qsession:
			return prev, nil
		case e.Session == "":
			_, _, _ = t.l.s.client.KV().DeleteCAS(e, (&api.WriteOptions{}).WithContext(ctx))
		default:
			prev = e
		}
	}
	return nil, fmt.Errorf("%w: its queue entry is gone", errSessionGone)
}

// waitFor blocks until the entry ahead is deleted (its waiter took the
// key, left, or its session ended) or released (an older leaderrun's).
func (t *candidate) waitFor(ctx context.Context, ahead *api.KVPair) error {
	for index := ahead.ModifyIndex; ; {
		pair, meta, err := t.l.s.get(ctx, ahead.Key, index, maxWait)
		switch {
		case err != nil:
			return t.l.s.failed("watch the queue of", t.l.key, err)
		case pair == nil || pair.Session == "":
			return nil
		}
		index = nextIndex(index, meta.LastIndex)
	}
}

// waitKey blocks, first in line, until an acquisition may succeed: the
// key is free and no lock-delay is known to run, or it is held by our own
// session (an acquisition whose answer was lost). Renewals do not write
// the key, so an idle first in line sends one blocking query per maxWait.
func (t *candidate) waitKey(ctx context.Context) error {
	for {
		wait := maxWait
		switch {
		case t.index == 0:
		case t.holder == t.session:
			return nil
		case t.holder == "":
			if wait = time.Until(t.retry); wait <= 0 {
				return nil
			}
		}
		pair, meta, err := t.l.s.get(ctx, t.l.key, t.index, wait)
		if err != nil {
			return t.l.s.failed("watch", t.l.key, err)
		}
		t.index = nextIndex(t.index, meta.LastIndex)
		switch {
		case pair != nil && pair.Session != "":
			_, t.holderDelay = holderOf(pair)
			t.holder, t.freed, t.refused, t.retry = pair.Session, time.Time{}, 0, time.Time{}
		case t.freed.IsZero():
			// If its holder was invalidated rather than released, its
			// lock-delay runs from about now (no earlier).
			t.freed, t.holder = time.Now(), ""
		}
	}
}

// refusedFree times the next acquisition after one was refused on a free
// key, whose lock-delay runs: the delay its last holder's record gave,
// from when the key was seen free (plus 5 ms: Consul counts from the
// invalidation), else from 50 ms to 1 s apart, a second late at most.
func (t *candidate) refusedFree() {
	t.refused++
	t.retry = t.freed.Add(t.holderDelay + 5*time.Millisecond)
	if t.refused > 1 || t.holderDelay == 0 || !t.retry.After(time.Now()) {
		t.retry = time.Now().Add(min(50*time.Millisecond<<min(t.refused-1, 6), time.Second))
	}
}

// renew renews sessions ("" skipped) and passes check; nil only if each
// was acknowledged. A session or check gone is errSessionGone.
func (s *Store) renew(ctx context.Context, check string, sessions ...string) error {
	for _, id := range slices.DeleteFunc(sessions, func(id string) bool { return id == "" }) {
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

// withACLHint adds the rule a token needs to a 403 from a check endpoint.
func withACLHint(err error) error {
	var se api.StatusError
	if errors.As(err, &se) && se.Code == http.StatusForbidden {
		return fmt.Errorf("%w (a candidate's TTL check needs node write on the agent's node: node_prefix \"\" { policy = \"write\" })", err)
	}
	return err
}

// registerCheck registers the candidate's TTL check, passing, or changes
// its TTL (the agent restarts its timer; the sessions bound to it stay).
func (t *candidate) registerCheck(ctx context.Context, ttl time.Duration) error {
	reg := &api.AgentCheckRegistration{ID: t.check, Name: checkName,
		Notes:             "leaderrun candidate for " + t.l.key + " (" + t.claim.Identity + "); its sessions end when this check turns critical",
		AgentServiceCheck: api.AgentServiceCheck{TTL: ttl.String(), Status: api.HealthPassing}}
	if err := t.l.s.client.Agent().CheckRegisterOpts(reg, (&api.QueryOptions{}).WithContext(ctx)); err != nil {
		return t.l.s.failed("register the TTL check of a candidate for", t.l.key, withACLHint(err))
	}
	return nil
}

// createSession creates the candidate's lock session (forLock) or its
// queue session, as docs/backends/consul.md describes them. The body is
// sent as is: api.Session.Create drops a zero LockDelay (Consul reads
// 15 s), and Consul adds serfHealth to a session without NodeChecks. A
// refusal of a check the agent has not put in the catalog yet is retried.
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

// dropDeadChecks deregisters the critical checks (their sessions ended) of
// candidates that died on this agent, which nothing else would.
func (s *Store) dropDeadChecks(ctx context.Context) {
	q := (&api.QueryOptions{}).WithContext(ctx)
	checks, err := s.client.Agent().ChecksWithFilterOpts(fmt.Sprintf("Name == %q and Status == %q", checkName, api.HealthCritical), q)
	for id, ch := range checks {
		if err == nil && ch.Name == checkName && strings.HasPrefix(id, checkPrefix) && ch.Status == api.HealthCritical {
			_ = s.client.Agent().CheckDeregisterOpts(id, q)
		}
	}
}

// setReady readies the candidate to acquire (its check's TTL back to the
// lease duration, and a new lock session), or parks it (its lock session
// destroyed, its check's TTL parkedTTL), unless it is so already.
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
// registration, and life how long the sessions live after it: the check's
// TTL (the lock session's too, if any).
func (t *candidate) acked() (at time.Time, life time.Duration) {
	t.mu.Lock()
	defer t.mu.Unlock()
	if life = t.claim.Timings.LeaseDuration; t.session == "" {
		life = max(parkedTTL, life)
	}
	return t.lastAck, life
}

// keepAlive passes the check and renews the sessions of a waiting
// candidate every half of their life (every second after a failure),
// looking every half lease to notice it readied. A session gone, a
// refusal, or no renewal within their life ends the candidacy (t.end).
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
		t.mu.Lock()
		sent := time.Now()
		err := t.l.s.renew(ctx, t.check, t.session, t.qsession)
		if err == nil {
			t.lastAck = sent
		}
		t.mu.Unlock()
		if err == nil {
			continue
		}
		switch ferr := t.l.s.failed("renew the sessions of a candidate for", t.l.key, err); {
		case ctx.Err() != nil:
			return
		case errors.Is(err, errSessionGone):
		case errors.Is(ferr, backends.ErrRefused):
			err = ferr
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
