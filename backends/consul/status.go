package consul

import (
	"context"
	"time"

	"github.com/hashicorp/consul/api"

	"github.com/leaderrun/leaderrun/backends"
)

// Status implements backends.Backend. The token is the one in the
// holder's record, or the key's ModifyIndex (which nothing moves while the
// key is held) if the record does not hold it. Waiting counts the live entries of the queue (a
// candidate that died while waiting is counted until Consul expires its
// session). Remaining is -1: Consul does not tell when a session will
// expire.
//
// Status needs key:read on the key's prefix; without session:read as well
// it still reports the holder, token, TTL and waiters, but no node.
func (b *Backend) Status(ctx context.Context) (backends.Status, error) {
	st := backends.Status{Lock: b.lock, Backend: b.Name(), Key: b.key, Remaining: -1, Waiting: -1}
	pair, _, err := b.get(ctx, b.key, 0, 0, false)
	if err != nil {
		return st, b.unavailable("read", err)
	}
	var h holder
	if pair != nil && pair.Session != "" {
		h = parseHolder(pair)
	}
	if queue, err := b.queue(ctx); err == nil {
		st.Waiting = 0
		for _, e := range queue {
			if e.Session != "" && e.Session != h.session {
				st.Waiting++
			}
		}
	}
	if h.session == "" {
		return st, nil
	}
	st.Held = true
	st.Identity = h.identity
	st.Token = h.token
	st.TTL = h.ttl
	st.Holders = h.holders
	ictx, cancel := context.WithTimeout(ctx, requestTimeout)
	defer cancel()
	if info, _, err := b.client.Session().Info(h.session, (&api.QueryOptions{}).WithContext(ictx)); err == nil && info != nil {
		st.Node = info.Node
		st.TTL, _ = time.ParseDuration(info.TTL)
	}
	return st, nil
}
