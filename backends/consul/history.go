package consul

import (
	"context"
	"encoding/json"
	"slices"

	"github.com/hashicorp/consul/api"

	"github.com/leaderrun/leaderrun/backends"
)

// History implements backends.Backend: the terms are keys under
// <prefix><lock>:history/, named by their token.
func (b *Backend) History(ctx context.Context, limit int) ([]backends.Term, error) {
	ctx, cancel := context.WithTimeout(ctx, requestTimeout)
	defer cancel()
	pairs, _, err := b.client.KV().List(b.historyPrefix(), (&api.QueryOptions{}).WithContext(ctx))
	if err != nil {
		return nil, b.unavailable("read history of", err)
	}
	terms := make([]backends.Term, 0, len(pairs))
	for _, p := range pairs {
		var t backends.Term
		if json.Unmarshal(p.Value, &t) == nil {
			terms = append(terms, t)
		}
	}
	return backends.NewestFirst(terms, limit), nil
}

// prune deletes the oldest keys under prefix once there are a tenth more
// than keep of them, keeping the newest keep (keys sort by age: tokens are
// zero-padded). Errors are ignored: the next writer prunes again.
func (b *Backend) prune(ctx context.Context, prefix string, keep int) {
	keys, _, err := b.client.KV().Keys(prefix, "", (&api.QueryOptions{}).WithContext(ctx))
	if err != nil || len(keys) <= keep+keep/10 {
		return
	}
	slices.Sort(keys)
	var ops api.TxnOps
	for _, k := range keys[:len(keys)-keep] {
		ops = append(ops, &api.TxnOp{KV: &api.KVTxnOp{Verb: api.KVDelete, Key: k}})
	}
	// Consul takes at most 64 operations per transaction.
	for len(ops) > 0 {
		n := min(len(ops), 64)
		_, _, _, _ = b.client.Txn().Txn(ops[:n], (&api.QueryOptions{}).WithContext(ctx))
		ops = ops[n:]
	}
}
