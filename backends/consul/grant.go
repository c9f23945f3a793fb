package consul

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/hashicorp/consul/api"

	"github.com/leaderrun/leaderrun/backends"
)

// The candidate is its own grant once Lead returned it: the methods below
// implement backends.Grant.

func (t *candidate) Token() uint64       { return t.token }
func (t *candidate) TTL() time.Duration  { return t.claim.Timings.LeaseDuration }
func (t *candidate) Acquired() time.Time { return t.acquired }

// Session is the ID of the Consul session that holds the lock.
func (t *candidate) Session() string { return t.session }

// Renew renews the session (the servers' TTL timer) and passes its check
// (the agent's timer), and returns nil only if both were acknowledged:
// the runner's deadline then counts from the send time of a renewal that
// restarted both timers, neither of which can end the session sooner than
// a TTL later (docs/safety.md). Neither writes anything a waiter watches.
// A session or check that is gone is a loss.
func (t *candidate) Renew(ctx context.Context) error {
	if err := t.Err(); err != nil {
		return err
	}
	err := t.l.s.renew(ctx, t.check, t.session)
	switch {
	case errors.Is(err, errSessionGone):
		err = fmt.Errorf("consul: lost %s: %v: %w", t.l.key, err, backends.ErrLeaseLost)
		t.Set(err)
		return err
	case err != nil:
		return fmt.Errorf("consul at %s: holding %s: %w", t.l.s.addr, t.l.key, err)
	}
	return nil
}

// watch holds blocking queries on the key until it is no longer held by
// this session (each lasts a minute at most, so that a silently broken
// connection is noticed), or ctx ends. Failed queries are retried: whether
// the store can be reached is for renewals and the runner's deadline to
// judge; the watch reports only what Consul says about the key.
func (t *candidate) watch(ctx context.Context, index uint64) {
	defer close(t.watchDone)
	if t.qsession != "" {
		// Its entry went with the acquisition; the session would last
		// until Release deregisters the check.
		dctx, cancel := context.WithTimeout(ctx, requestTimeout)
		t.l.s.destroy(dctx, t.qsession)
		cancel()
	}
	for {
		pair, meta, err := t.l.s.get(ctx, t.l.key, index, time.Minute)
		switch {
		case ctx.Err() != nil:
			return
		case err != nil:
			if sleep(ctx, time.Second) != nil {
				return
			}
			continue
		case pair == nil:
			err = fmt.Errorf("consul: lock key %s was deleted: %w", t.l.key, backends.ErrLeaseLost)
		case pair.Session == "":
			err = fmt.Errorf("consul: session %s no longer holds %s (destroyed, expired or released): %w", t.session, t.l.key, backends.ErrLeaseLost)
		case pair.Session != t.session:
			err = fmt.Errorf("consul: %s was taken by session %s (%q): %w", t.l.key, pair.Session, pair.Value, backends.ErrLeaseLost)
		}
		if err != nil {
			t.Set(err)
			return
		}
		index = nextIndex(index, meta.LastIndex)
	}
}

// Release releases the key (unlike an invalidation, a release imposes no
// lock-delay on the next holder), writing the token into the record, then
// destroys the session and deregisters its check. If the release fails
// but the destroy succeeds, the key is freed after the lock-delay; if
// both fail, the check, no longer passed, ends the session within a TTL.
func (t *candidate) Release(ctx context.Context) error {
	if !t.BeginRelease() {
		return nil
	}
	// The watch is waited for at the end: the release is what the next
	// holder waits for.
	t.stopWatch()
	defer func() { <-t.watchDone }()
	if t.Err() == nil {
		p := &api.KVPair{Key: t.l.key, Value: t.rec.encode(), Flags: recordFlags, Session: t.session}
		_, _, _ = t.l.s.client.KV().Release(p, (&api.WriteOptions{}).WithContext(ctx))
	}
	_, err := t.l.s.client.Session().Destroy(t.session, (&api.WriteOptions{}).WithContext(ctx))
	// Only now: deregistering the check would invalidate the session.
	_ = t.l.s.client.Agent().CheckDeregisterOpts(t.check, (&api.QueryOptions{}).WithContext(ctx))
	if err != nil {
		return fmt.Errorf("consul at %s: destroy session %s holding %s: %w", t.l.s.addr, t.session, t.l.key, err)
	}
	return nil
}

// WriteDoc writes d in one transaction that checks that the lock key is
// still held by this session.
func (t *candidate) WriteDoc(ctx context.Context, d backends.Doc) error {
	return t.l.writeDoc(ctx, d, t.session)
}
