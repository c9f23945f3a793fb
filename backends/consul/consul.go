// Package consul is the Consul store, a backends.QueueLock. A candidate
// acquires the key <prefix><lock> with a session whose TTL is the lease
// duration; one that finds it held joins a queue of keys under
// <prefix><lock>:queue/, each held by its waiter's own session, ordered by
// CreateIndex. The first in line watches the lock key, every other waiter
// the entry just ahead of its own (as etcd's election and ZooKeeper's lock
// recipe do), so that a change of leader wakes two waiters, not all.
//
// Each candidate binds its sessions to a TTL check of its own on the
// agent, which its renewals pass: if it dies, hangs or loses its link to
// the agent, the check turns critical a lease after the last pass, and
// Consul invalidates the session at once; its own session TTL, which it
// enforces only after 2×TTL, is the backstop for an agent that dies with
// its holder. No session carries serfHealth, so that an agent cut off from
// the servers does not free the key while its holder's command still runs
// (docs/safety.md, "Consul: a session bound to a TTL check of its own").
//
// The token is the key's ModifyIndex right after the acquisition: a Raft
// index, which grows even when the key is deleted and created again
// (LockIndex starts again at 1). Nothing writes the key while it is held.
// The lock's documents are the keys <prefix><lock>:history and :markers;
// lock names hold no ':', so no key of a lock meets another lock's.
package consul

import (
	"context"
	"errors"
	"fmt"
	"net/http"
	"strings"
	"time"

	"github.com/hashicorp/consul/api"

	"github.com/leaderrun/leaderrun/backends"
)

// Limits Consul puts on sessions: the TTL (session_ttl_min's default, and
// the fixed maximum) and the lock-delay.
const (
	MinTTL       = 10 * time.Second
	MaxTTL       = 24 * time.Hour
	MaxLockDelay = 60 * time.Second
)

// requestTimeout bounds every request (a blocking query: and its wait),
// so that a connection that stalls without closing cannot hang a
// campaign; maxWait caps a blocking query (Consul caps it at 10 minutes).
const requestTimeout, maxWait = 10 * time.Second, 5 * time.Minute

// DefaultLockDelay, as Config.LockDelay, is each candidate's kill grace
// plus a second, at most MaxLockDelay: a holder whose session someone else
// ended hears of it within a round trip, and its command is dead a kill
// grace later.
const DefaultLockDelay time.Duration = -1

// Config describes one Consul datacenter.
type Config struct {
	// API says how to reach the agent, as Consul's client takes it. It is
	// copied; its HttpClient is not used (the store builds a bounded one,
	// on a copy of its Transport). Nil: api.DefaultConfig(), which reads
	// CONSUL_HTTP_ADDR, CONSUL_HTTP_TOKEN, CONSUL_CACERT and the rest as
	// the consul CLI does. An address with user information is refused.
	API *api.Config
	// Prefix is prepended to a lock's name to form its key.
	Prefix string
	// LockDelay is how long Consul refuses the key to others after a
	// holder's session was invalidated or destroyed, so that a holder
	// whose session someone else ended can stop its command first; it
	// delays every failover from a crashed holder by as much. 0 to
	// MaxLockDelay, or DefaultLockDelay. Zero value: none (unlike the
	// Consul API, whose default is 15 s).
	LockDelay time.Duration
}

// Store is one Consul datacenter, reached through one agent. Its methods
// are safe for concurrent use.
type Store struct {
	client    *api.Client
	http      *http.Client
	addr      string // for messages: it has no user information
	prefix    string
	lockDelay time.Duration
}

var (
	_ backends.LeaseDurationChecker = (*Store)(nil)
	_ backends.QueueLock            = (*lock)(nil)
	_ backends.Grant                = (*candidate)(nil)
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
	client, hc, err := newClient(&apiCfg)
	if err != nil {
		// A bad scheme, TLS file or token file; no message shows the token.
		return nil, fmt.Errorf("consul: client for %s: %w", apiCfg.Address, err)
	}
	return &Store{client: client, http: hc, addr: apiCfg.Address, prefix: cfg.Prefix, lockDelay: cfg.LockDelay}, nil
}

// Name implements backends.Store.
func (s *Store) Name() string { return "consul" }

// Lock implements backends.Store.
func (s *Store) Lock(name string) backends.Lock { return &lock{s: s, key: s.prefix + name} }

// Close implements backends.Store: it closes idle connections.
func (s *Store) Close() error {
	s.http.CloseIdleConnections()
	return nil
}

// CheckLeaseDuration implements backends.LeaseDurationChecker: the lease
// duration is the session TTL.
func (s *Store) CheckLeaseDuration(d time.Duration) error {
	if d < MinTTL || d > MaxTTL {
		return fmt.Errorf("a Consul session TTL must be within %v and %v", MinTTL, MaxTTL)
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

// Key implements backends.Lock.
func (l *lock) Key() string { return l.key }

func (l *lock) queuePrefix() string { return l.key + ":queue/" }

// errSessionGone: a candidate's session or check is gone (expired,
// destroyed, deregistered); the driver joins again with new ones.
var errSessionGone = fmt.Errorf("consul: session invalidated: %w", backends.ErrEnded)

// failed wraps an error of op on key: ErrUnavailable, and ErrRefused too
// if it is refused. It names the address, never the token.
func (s *Store) failed(op, key string, err error) error {
	if mb := (*http.MaxBytesError)(nil); errors.As(err, &mb) {
		err = fmt.Errorf("%w: %v", errTooLarge, err)
	}
	if refused(err) {
		err = fmt.Errorf("%w: %w", backends.ErrRefused, err)
	}
	return fmt.Errorf("consul at %s: %s %s: %w: %w", s.addr, op, key, backends.ErrUnavailable, err)
}

// refused reports whether asking again cannot help after err: a refusal
// (403) or an answer leaderrun refuses (a redirect, one past maxAnswer),
// not a network error, a server error (no leader) or rate limiting.
func refused(err error) bool {
	var se api.StatusError
	if errors.As(err, &se) {
		return se.Code < 500 && se.Code != http.StatusTooManyRequests
	}
	mb := (*http.MaxBytesError)(nil)
	return errors.Is(err, errPermissionDenied) || errors.Is(err, errRedirect) || errors.Is(err, errTooLarge) || errors.As(err, &mb)
}

// errPermissionDenied is a transaction refused by the ACLs: Consul reports
// that as an error of the transaction, not as a 403.
var errPermissionDenied = errors.New("permission denied (403)")

// txn runs ops and says whether they were applied; if not, it returns the
// first error Consul reported and the index of its operation (-1: none).
// A refusal by the ACLs is an error wrapping errPermissionDenied.
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

// get reads key. With index > 0 it is a blocking query that returns when
// the key's index passes index, or after at most wait.
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
// returned got: an index that went backwards (a snapshot restore, a new
// dev agent) starts over from 0, which does not block; 0 becomes 1.
func nextIndex(prev, got uint64) uint64 {
	if got < prev {
		return 0
	}
	return max(got, 1)
}

// sleep pauses for d, or until ctx ends, whose error it then returns.
func sleep(ctx context.Context, d time.Duration) error {
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-ctx.Done():
		return ctx.Err()
	case <-t.C:
		return nil
	}
}
