package consul

import (
	"context"
	"time"

	"github.com/hashicorp/consul/api"

	"github.com/leaderrun/leaderrun/backends"
)

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
