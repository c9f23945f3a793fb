package consul

import (
	"context"
	"encoding/json"
	"fmt"
	"time"

	"github.com/hashicorp/consul/api"

	"github.com/leaderrun/leaderrun/backends"
)

// recordFlags, in the flags of the lock key, marks its value as a record
// (format 2: its holder does not write the key at renewals). A value
// without them was written by another tool or an older leaderrun, and is
// read as the holder's identity.
const recordFlags uint64 = 0x6c72756e_00000002 // "lrun", format 2

// record is the value of the lock key while leaderrun holds it, in JSON so
// that `consul kv get` shows it.
type record struct {
	Identity string `json:"identity"`
	// Token is 0 in the record the acquisition writes, which cannot know
	// it: the key's ModifyIndex is the token then. The release writes it.
	Token uint64 `json:"token,omitempty"`
	// TTL and LockDelay are those of the holder's session: the lock-delay
	// tells the first in line how long an invalidated key stays refused.
	TTL       string `json:"ttl"`
	LockDelay string `json:"lock_delay"`
	// Holders is the size of the holder's pool, absent for one holder.
	Holders int `json:"holders,omitempty"`
}

func (r record) encode() []byte {
	data, _ := json.Marshal(r)
	return data
}

// holderOf reads the held key pair: who holds it, as Status tells it, and
// its lock-delay. A value that is not a record is the holder's identity;
// the TTL and lock-delay are then 0 (unknown).
func holderOf(pair *api.KVPair) (st backends.Status, lockDelay time.Duration) {
	st = backends.Status{Held: true, Identity: string(pair.Value), Token: pair.ModifyIndex, Remaining: -1, Waiting: -1}
	var r record
	if pair.Flags == recordFlags && json.Unmarshal(pair.Value, &r) == nil {
		st.Identity, st.Holders = r.Identity, max(r.Holders, 0)
		st.TTL, _ = time.ParseDuration(r.TTL)
		lockDelay, _ = time.ParseDuration(r.LockDelay)
		if r.Token != 0 {
			st.Token = r.Token
		}
	}
	return st, lockDelay
}

// Status implements backends.QueueLock. Waiting counts the live entries
// of the queue (a waiter that died is counted until its session ends).
// Remaining is -1: Consul does not tell when a session will expire. It
// needs key:read on the prefix; without session:read, it shows no node.
func (l *lock) Status(ctx context.Context) (backends.Status, error) {
	st := backends.Status{Remaining: -1, Waiting: -1}
	pair, _, err := l.s.get(ctx, l.key, 0, 0)
	if err != nil {
		return st, l.s.failed("read", l.key, err)
	}
	if pair != nil && pair.Session != "" {
		st, _ = holderOf(pair)
		if info, _, err := l.s.client.Session().Info(pair.Session, (&api.QueryOptions{}).WithContext(ctx)); err == nil && info != nil {
			st.Node = info.Node
			st.TTL, _ = time.ParseDuration(info.TTL)
		}
	}
	if queue, err := l.queue(ctx); err == nil {
		st.Waiting = 0
		for _, e := range queue {
			if e.Session != "" && (pair == nil || e.Session != pair.Session) {
				st.Waiting++
			}
		}
	}
	return st, nil
}

func (l *lock) docKey(name string) string { return l.key + ":" + name }

// ReadDoc implements backends.Lock: a consistent read, versioned by the
// key's ModifyIndex.
func (l *lock) ReadDoc(ctx context.Context, name string) (backends.Doc, error) {
	d, key := backends.Doc{Name: name}, l.docKey(name)
	pair, _, err := l.s.client.KV().Get(key, (&api.QueryOptions{RequireConsistent: true}).WithContext(ctx))
	switch {
	case err != nil:
		return d, l.s.failed("read", key, err)
	case pair == nil:
		return d, nil
	case len(pair.Value) > backends.MaxDoc:
		return d, fmt.Errorf("consul: %s is %d bytes, more than the %d a document may hold: %w: %w",
			key, len(pair.Value), backends.MaxDoc, backends.ErrUnavailable, backends.ErrRefused)
	}
	d.Data, d.Version = pair.Value, pair.ModifyIndex
	return d, nil
}

// WriteDoc implements backends.Lock.
func (l *lock) WriteDoc(ctx context.Context, d backends.Doc) error { return l.writeDoc(ctx, d, "") }

// writeDoc writes d if it is still at d.Version (nil: if it does not
// exist) and, with a session, only while that session holds the lock key.
func (l *lock) writeDoc(ctx context.Context, d backends.Doc, session string) error {
	key := l.docKey(d.Name)
	index, _ := d.Version.(uint64)
	ops := api.TxnOps{{KV: &api.KVTxnOp{Verb: api.KVCAS, Key: key, Value: d.Data, Index: index}}}
	if session != "" {
		ops = append(api.TxnOps{{KV: &api.KVTxnOp{Verb: api.KVCheckSession, Key: l.key, Session: session}}}, ops...)
	}
	ok, _, why, op, err := l.s.txn(ctx, ops)
	switch {
	case err != nil:
		return l.s.failed("write", key, err)
	case ok:
		return nil
	case session != "" && op == 0:
		return fmt.Errorf("consul: %s is no longer held by session %s (%s); %s not written: %w", l.key, session, why, key, backends.ErrLeaseLost)
	}
	return fmt.Errorf("consul: %s changed since it was read (%s): %w", key, why, backends.ErrConflict)
}
