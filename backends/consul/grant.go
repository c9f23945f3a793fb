package consul

import (
	"context"
	"errors"
	"fmt"
	"time"

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
// this session, or ctx ends; each lasts a minute at most, so that a
// silently broken connection is noticed. Failed queries are retried:
// whether the store can be reached is for renewals and the runner's
// deadline to judge; the watch reports only what Consul says of the key.
func (t *candidate) watch(ctx context.Context, index uint64) {
	defer close(t.watchDone)
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

// Release releases the key, writing the token into the record, and
// removes the sessions and the check (see close). If the release fails
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
	return t.close(ctx)
}

// WriteDoc writes d in one transaction that checks that the lock key is
// still held by this session.
func (t *candidate) WriteDoc(ctx context.Context, d backends.Doc) error {
	return t.l.writeDoc(ctx, d, t.session)
}
