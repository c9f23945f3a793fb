package consul

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"slices"

	"github.com/hashicorp/consul/api"

	"github.com/leaderrun/leaderrun/backends"
)

// queue lists the entries of the lock's queue of waiters, oldest first.
func (b *Backend) queue(ctx context.Context) (api.KVPairs, error) {
	ctx, cancel := context.WithTimeout(ctx, requestTimeout)
	defer cancel()
	pairs, _, err := b.client.KV().List(b.queuePrefix(), (&api.QueryOptions{}).WithContext(ctx))
	if err != nil {
		return nil, err
	}
	slices.SortFunc(pairs, func(a, b *api.KVPair) int { return cmp.Compare(a.CreateIndex, b.CreateIndex) })
	return pairs, nil
}

// enqueue joins the queue: an entry named by the candidate's queue session
// (see newQueueSession) and held by it, so that it goes with the session.
// Entries are ordered by CreateIndex, a Raft index: a new one always comes
// last.
func (c *candidate) enqueue(ctx context.Context) error {
	ctx, cancel := context.WithTimeout(ctx, requestTimeout)
	defer cancel()
	if c.queueSession == "" {
		id, err := c.newQueueSession(ctx)
		if err != nil {
			return err
		}
		c.mu.Lock()
		c.queueSession = id
		c.mu.Unlock()
	}
	p := &api.KVPair{Key: c.b.queueKey(c.queueSession), Value: []byte(c.identity), Session: c.queueSession}
	ok, _, err := c.b.client.KV().Acquire(p, (&api.WriteOptions{}).WithContext(ctx))
	switch {
	case isInvalidSession(err):
		return errSessionGone
	case err != nil:
		return c.b.unavailable("join the queue of", err)
	case !ok:
		// The entry is named by our session: nobody else can hold it. An
		// answer that is not "true" (cut short, or not Consul's) is an
		// error, not a place in the queue.
		return c.b.unavailable("join the queue of", fmt.Errorf("the agent did not acknowledge the entry %s", p.Key))
	}
	return nil
}

// waitTurn blocks until this candidate is first in the queue and an
// acquisition may succeed. Behind others it is parked; first in line, it
// is readied before it watches the key.
func (c *candidate) waitTurn(ctx context.Context) error {
	var retry backends.Backoff
	for !c.first {
		ahead, err := c.ahead(ctx)
		if err == nil && ahead != nil {
			if err = c.park(ctx); err == nil {
				err = c.waitFor(ctx, ahead)
			}
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
	for {
		err := c.ready(ctx)
		if err == nil {
			return c.waitKey(ctx)
		}
		if err := c.tolerate(ctx, err, &retry); err != nil {
			return err
		}
	}
}

// ahead lists the queue and returns the live entry just ahead of ours, or
// nil if ours is first. Dead entries (their session is gone and Consul
// released them: an older leaderrun's) are ignored and deleted. If our entry is missing (deleted
// by hand), it joins again, at the end.
func (c *candidate) ahead(ctx context.Context) (*api.KVPair, error) {
	entries, err := c.b.queue(ctx)
	if err != nil {
		return nil, c.b.unavailable("read the queue of", err)
	}
	own := c.b.queueKey(c.queueSession)
	var prev *api.KVPair
	for _, e := range entries {
		switch {
		case e.Key == own && e.Session == c.queueSession:
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
// the entry ahead is deleted (its waiter took the key, left, or its
// session ended) or released (an older leaderrun's whose session ended).
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
