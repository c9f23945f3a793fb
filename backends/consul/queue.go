package consul

import (
	"cmp"
	"context"
	"fmt"
	"slices"
	"strings"
	"time"

	"github.com/hashicorp/consul/api"
)

// queue lists the entries of the lock's queue of waiters, oldest first.
func (l *lock) queue(ctx context.Context) (api.KVPairs, error) {
	pairs, _, err := l.s.client.KV().List(l.queuePrefix(), (&api.QueryOptions{}).WithContext(ctx))
	if err != nil {
		return nil, l.s.failed("read the queue of", l.key, err)
	}
	slices.SortFunc(pairs, func(a, b *api.KVPair) int { return cmp.Compare(a.CreateIndex, b.CreateIndex) })
	return pairs, nil
}

// enqueue joins the queue: an entry named by the candidate's queue session
// and held by it. Entries are ordered by CreateIndex, a Raft index: a new
// one always comes last.
func (t *candidate) enqueue(ctx context.Context) error {
	p := &api.KVPair{Key: t.l.queuePrefix() + t.qsession, Value: []byte(t.claim.Identity), Session: t.qsession}
	ok, _, err := t.l.s.client.KV().Acquire(p, (&api.WriteOptions{}).WithContext(ctx))
	switch {
	case err != nil && strings.Contains(strings.ToLower(err.Error()), "invalid session"):
		return errSessionGone
	case err == nil && !ok:
		// Nobody else can hold an entry named by our session: an answer
		// that is not "true" (cut short, or not Consul's) is an error.
		err = fmt.Errorf("the agent did not acknowledge the entry %s", p.Key)
	}
	if err != nil {
		return t.l.s.failed("join the queue of", t.l.key, err)
	}
	return nil
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

// ahead lists the queue and returns the live entry just ahead of ours, or
// nil if ours is first. Dead entries (released when their session ended:
// an older leaderrun's) are skipped and deleted, unless they changed since.
// Our entry gone (deleted by hand) ends the candidacy.
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

// waitFor blocks, in blocking queries, until the entry ahead is deleted
// (its waiter took the key, left, or its session ended) or released (an
// older leaderrun's whose session ended).
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
// key is free and no lock-delay is known to run (t.retry), or an
// acquisition whose answer was lost went through (acquiring again with
// the same session succeeds). It sleeps in a blocking query on the key,
// which Consul answers as soon as the key changes. A holder's renewals do
// not write the key, so an idle first in line sends one query per
// maxWait.
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
			// Seen going free, no earlier than it did: if its holder was
			// invalidated rather than released, its lock-delay runs from
			// about now.
			t.freed, t.holder = time.Now(), ""
		}
	}
}

// refusedFree times the next acquisition after one was refused although
// the key was free: the lock-delay of the session whose invalidation freed
// it runs. After the first refusal, that is the delay its record gave,
// from when the key was seen free (plus 5 ms: Consul counts it from the
// invalidation); else, backing off from 50 ms to 1 s, at most a second
// more than the delay itself.
func (t *candidate) refusedFree() {
	t.refused++
	t.retry = t.freed.Add(t.holderDelay + 5*time.Millisecond)
	if t.refused > 1 || t.holderDelay == 0 || !t.retry.After(time.Now()) {
		t.retry = time.Now().Add(min(50*time.Millisecond<<min(t.refused-1, 6), time.Second))
	}
}
