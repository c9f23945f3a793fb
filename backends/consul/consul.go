// Package consul is the Consul store, a backends.QueueLock: a candidate
// acquires the key <prefix><lock> with a session whose TTL is the lease
// duration, bound to a TTL check of its own (docs/safety.md, "Consul: a
// session bound to a TTL check of its own"); one that finds it held joins
// a queue under <prefix><lock>:queue/. The token is the key's ModifyIndex
// right after the acquisition. docs/backends/consul.md describes the keys,
// the queue and the token.
package consul

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"net/http"
	"strings"
	"time"

	"github.com/hashicorp/consul/api"

	"github.com/leaderrun/leaderrun/backends"
)

// Config describes one Consul datacenter.
type Config struct {
	// API says how to reach the agent; it is copied, its HttpClient not
	// used (see newClient). Nil: api.DefaultConfig(), which reads the
	// CONSUL_HTTP_* variables as the consul CLI does. An address with
	// user information is refused.
	API *api.Config
	// Prefix is prepended to a lock's name to form its key.
	Prefix string
	// LockDelay is how long Consul refuses the key to others after a
	// holder's session was invalidated, so that a holder whose session
	// someone else ended stops its command first; a crash's failover
	// waits as long. 0 (none, unlike the API's 15 s) to MaxLockDelay, or
	// DefaultLockDelay.
	LockDelay time.Duration
}

// Limits Consul puts on sessions: the TTL (session_ttl_min's default, and
// the fixed maximum) and the lock-delay.
const (
	MinTTL       = 10 * time.Second
	MaxTTL       = 24 * time.Hour
	MaxLockDelay = 60 * time.Second
	// DefaultLockDelay, as Config.LockDelay, is the kill grace plus a
	// second (at most MaxLockDelay): a holder whose session someone else
	// ended hears of it within a round trip, and stops its command.
	DefaultLockDelay time.Duration = -1
	// requestTimeout bounds every request (a blocking query: and its
	// wait), so that a stalled connection cannot hang a campaign; maxWait
	// caps a blocking query (Consul caps it at 10 minutes).
	requestTimeout, maxWait = 10 * time.Second, 5 * time.Minute
)

// Store is one Consul datacenter, reached through one agent.
type Store struct {
	client    *api.Client
	http      *http.Client
	addr      string // for messages: it has no user information
	prefix    string
	lockDelay time.Duration
}

var (
	_ backends.TimingsChecker = (*Store)(nil)
	_ backends.QueueLock      = (*lock)(nil)
)

// Open validates cfg and builds the client; it sends nothing to Consul.
func Open(cfg Config) (*Store, error) {
	if d := cfg.LockDelay; d != DefaultLockDelay && (d < 0 || d > MaxLockDelay) {
		return nil, fmt.Errorf("consul: lock-delay %v out of range: Consul accepts 0s to %v", d, MaxLockDelay)
	}
	apiCfg := *api.DefaultConfig()
	if cfg.API != nil {
		apiCfg = *cfg.API
	}
	if err := CheckAddress(apiCfg.Address); err != nil {
		return nil, fmt.Errorf("consul: %w", err)
	}
	client, hc, err := newClient(&apiCfg) // no message of it shows the token
	if err != nil {
		return nil, fmt.Errorf("consul: client for %s: %w", apiCfg.Address, err)
	}
	return &Store{client: client, http: hc, addr: apiCfg.Address, prefix: cfg.Prefix, lockDelay: cfg.LockDelay}, nil
}

func (s *Store) Name() string                   { return "consul" }
func (s *Store) Lock(name string) backends.Lock { return &lock{s: s, key: s.prefix + name} }
func (s *Store) Close() error                   { s.http.CloseIdleConnections(); return nil }

// CheckTimings: the lease is the session's TTL.
func (s *Store) CheckTimings(t backends.Timings) error {
	if d := t.LeaseDuration; d < MinTTL || d > MaxTTL {
		return fmt.Errorf("--lease-duration %v: a Consul session TTL must be within %v and %v", d, MinTTL, MaxTTL)
	}
	return nil
}

// LockDelay is the lock-delay of the sessions of candidates with timings t.
func (s *Store) LockDelay(t backends.Timings) time.Duration {
	if s.lockDelay == DefaultLockDelay {
		return min(t.KillGrace+time.Second, MaxLockDelay)
	}
	return s.lockDelay
}

// lock is one lock: its key, its queue and its documents.
type lock struct {
	s   *Store
	key string
}

func (l *lock) Key() string         { return l.key }
func (l *lock) queuePrefix() string { return l.key + ":queue/" }

// errSessionGone: a candidate's session or check is gone; it joins again.
var errSessionGone = fmt.Errorf("consul: session invalidated: %w", backends.ErrEnded)

// failed wraps an error of op on key, naming the address (never the
// token): ErrUnavailable, and ErrRefused too unless it may pass (a network
// error, a server error, rate limiting).
func (s *Store) failed(op, key string, err error) error {
	var se api.StatusError
	if errors.As(err, &se) && se.Code < 500 && se.Code != http.StatusTooManyRequests ||
		errors.Is(err, errPermissionDenied) || errors.Is(err, errRedirect) || errors.Is(err, errTooLarge) {
		err = fmt.Errorf("%w: %w", backends.ErrRefused, err)
	}
	return fmt.Errorf("consul at %s: %s %s: %w: %w", s.addr, op, key, backends.ErrUnavailable, err)
}

// errPermissionDenied is a transaction refused by the ACLs, which Consul
// reports as an error of the transaction, not as a 403.
var errPermissionDenied = errors.New("permission denied (403)")

// txn runs ops, and says if they were applied; if not, the first error
// Consul reported and its operation's index (-1: none). A refusal by the
// ACLs is an error wrapping errPermissionDenied.
func (s *Store) txn(ctx context.Context, ops api.TxnOps) (bool, *api.TxnResponse, string, int, error) {
	ok, resp, _, err := s.client.Txn().Txn(ops, (&api.QueryOptions{}).WithContext(ctx))
	if err != nil || ok || resp == nil || len(resp.Errors) == 0 {
		return ok, resp, "", -1, err
	}
	what := resp.Errors[0].What
	if strings.Contains(strings.ToLower(what), "permission denied") {
		return false, resp, what, -1, fmt.Errorf("%w: %s", errPermissionDenied, what)
	}
	return false, resp, what, resp.Errors[0].OpIndex, nil
}

// get reads key; with index > 0, once its index passes index, or after
// wait at most.
func (s *Store) get(ctx context.Context, key string, index uint64, wait time.Duration) (*api.KVPair, *api.QueryMeta, error) {
	q := (&api.QueryOptions{}).WithContext(ctx)
	if index > 0 {
		wait = min(max(wait, time.Millisecond), maxWait)
		// Consul adds a random jitter of up to 1/16 of the wait time: ask
		// for 16/17 of it so that the answer comes by wait at the latest.
		q.WaitIndex, q.WaitTime = index, max(wait-wait/17, time.Millisecond)
	}
	return s.client.KV().Get(key, q)
}

// nextIndex is the index for the next blocking query after one that
// returned got: one that went backwards (a snapshot restore) starts over
// from 0, which does not block; 0 becomes 1.
func nextIndex(prev, got uint64) uint64 {
	if got < prev {
		return 0
	}
	return max(got, 1)
}

func sleep(ctx context.Context, d time.Duration) error {
	select {
	case <-ctx.Done():
		return ctx.Err()
	case <-time.After(d):
		return nil
	}
}

// recordFlags, in the flags of the lock key, marks its value as a record
// of format 2 (its holder does not write the key at renewals); its high
// half ("lrun") marks any format. Any other value is the holder's identity.
const recordFlags uint64 = 0x6c72756e_00000002 // "lrun", format 2

// record is the lock key's value while leaderrun holds it, in JSON for
// `consul kv get`. Token is 0 until the release writes it (the key's
// ModifyIndex is the token). The lock-delay tells the first in line how
// long an invalidated key stays refused.
type record struct {
	Identity  string `json:"identity"`
	Token     uint64 `json:"token,omitempty"`
	TTL       string `json:"ttl"`
	LockDelay string `json:"lock_delay"`
	Holders   int    `json:"holders,omitempty"`
}

func (r record) encode() []byte {
	data, _ := json.Marshal(r)
	return data
}

// holderOf reads the held key pair: who holds it, and its lock-delay (0:
// unknown). A value that is no record is the holder's identity.
func holderOf(pair *api.KVPair) (st backends.Status, lockDelay time.Duration) {
	st = backends.Status{Held: true, Identity: string(pair.Value), Token: pair.ModifyIndex, Remaining: -1, Waiting: -1}
	var r record
	if pair.Flags>>32 == recordFlags>>32 && json.Unmarshal(pair.Value, &r) == nil {
		st.Identity, st.Holders = r.Identity, max(r.Holders, 0)
		st.TTL, _ = time.ParseDuration(r.TTL)
		lockDelay, _ = time.ParseDuration(r.LockDelay)
		if r.Token != 0 {
			st.Token = r.Token
		}
	}
	return st, lockDelay
}

// Status: Waiting counts the live entries of the queue; Consul does not
// tell the time left. Without session:read, it shows no node.
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
			if e.Session != "" {
				st.Waiting++
			}
		}
	}
	return st, nil
}

func (l *lock) docKey(name string) string { return l.key + ":" + name }

// ReadDoc reads consistently, versioned by ModifyIndex.
func (l *lock) ReadDoc(ctx context.Context, name string) (backends.Doc, error) {
	d, key := backends.Doc{Name: name}, l.docKey(name)
	pair, _, err := l.s.client.KV().Get(key, (&api.QueryOptions{RequireConsistent: true}).WithContext(ctx))
	switch {
	case err != nil:
		return d, l.s.failed("read", key, err)
	case pair == nil:
		return d, nil
	case len(pair.Value) > backends.MaxDoc:
		return d, fmt.Errorf("consul: %s: %d bytes, more than a document holds: %w: %w", key, len(pair.Value), backends.ErrUnavailable, backends.ErrRefused)
	}
	d.Data, d.Version = pair.Value, pair.ModifyIndex
	return d, nil
}

func (l *lock) WriteDoc(ctx context.Context, d backends.Doc) error { return l.writeDoc(ctx, d, "") }

// writeDoc writes d if it is still at d.Version (nil: absent) and, with a
// session, only while that session holds the lock key.
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
