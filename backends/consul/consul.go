// Package consul is the Consul backend. A candidate creates a session whose
// TTL is the lease duration and acquires the key <prefix><lock> with it. A
// candidate that finds the key held joins a queue under
// <prefix><lock>:queue/, one key per waiter held by the waiter's own
// session; only the first in line watches the lock key, every other waiter
// watches the one just ahead of it (etcd's election and ZooKeeper's lock
// recipe work the same way), so that a change of leader wakes one or two
// waiters, not all of them. Only the first in line holds a session for the
// lock and renews it every TTL/2; the others are parked (see park) and send
// a keep-alive every few minutes, so that a change of leader is the only
// thing that makes two of them send anything.
//
// # The record, and failover within the lease
//
// The key's value is a JSON record of its holder (identity, token, session
// TTL and lock-delay, and in a pool of N > 1 holders (--holders) N), marked
// by recordFlags in the entry's flags. The slots of a pool are keys of
// their own, <prefix><lock>.slot<i> (Backend.Slot), reached through the
// one client.
//
// Each candidate registers a TTL check of its own on the agent, of the
// lease duration, and creates its session bound to that check alone. Every
// renewal of the holder renews its session and passes its check; Renew
// succeeds only if both were acknowledged. If the holder dies, hangs or
// loses its link to the agent, the agent turns the check critical a lease
// after the last pass it received, and Consul invalidates the session at
// once: the key is released, and the first waiter in line, whose blocking
// query on the key answers, acquires it once the lock-delay has passed.
// Renewals write nothing to the KV store, so waiters sleep in blocking
// queries of maxWait. docs/safety.md ("Consul: a session bound to a TTL
// check of its own") argues why the old holder's command is dead by then.
//
// Sessions are created without Consul's default serfHealth check: a
// session ends only by its check, its TTL, a destroy, or with its node's
// registration, so that an agent cut off from the servers alone cannot
// free the key while its holder's command still runs.
//
// # Fencing token
//
// The token is the key's ModifyIndex right after this session acquired it
// (returned by the acquiring transaction). ModifyIndex is a Raft index:
// every write in the datacenter gets a larger one, so a later grant always
// has a larger token, even when the key was deleted and created again in
// between. Nothing writes the key while it is held, so its ModifyIndex
// stays the token, where Status reads it (the release writes it into the
// record). LockIndex is not used: it counts
// acquisitions of one incarnation of the key and restarts at 1 when the key
// is deleted and re-created, so it can go backwards. A Raft index goes
// backwards only if the servers lose their state (a snapshot restore, or a
// dev agent restarted: its state lives in memory).
//
// # Timing
//
// Consul's servers invalidate a session between TTL and 2×TTL after its last
// renewal: they double the TTL to allow for clock skew. When a session that
// holds a lock is invalidated or destroyed, Consul refuses every
// acquisition of that key for the session's lock-delay. With its check, a
// holder that dies is replaced within a lease of its last renewal plus the
// lock-delay (within 2×TTL plus the lock-delay if its agent dies with it,
// since the check's timer runs there); a holder that releases the key first
// (leaderrun exits normally, or stops after losing leadership) hands over
// at once: lock-delay applies only to keys freed by an invalidation.
//
// Liveness of a holder is judged by the runner from acknowledged renewals;
// the lease also watches its key with a blocking query and reports loss the
// moment the key is deleted, taken by another session, or released because
// the session was destroyed.
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

// Limits Consul puts on sessions.
const (
	// MinTTL and MaxTTL bound a session TTL (Consul's session_ttl_min
	// default, and its fixed maximum).
	MinTTL = 10 * time.Second
	MaxTTL = 24 * time.Hour
	// MaxLockDelay is the largest lock-delay Consul accepts.
	MaxLockDelay = 60 * time.Second
)

const (
	// requestTimeout bounds every request that is not a blocking query, so
	// that a connection that stalls without closing cannot hang a campaign.
	requestTimeout = 10 * time.Second
	// withdrawTimeout bounds the clean-up of a cancelled candidacy: it runs
	// after the caller's context ended and must not keep it waiting.
	withdrawTimeout = 2 * time.Second
	// maxWait caps a blocking query (Consul caps it at 10 minutes).
	maxWait = 5 * time.Minute
)

// Config describes one lock in one Consul datacenter.
type Config struct {
	// API says how to reach the agent: address, ACL token, TLS, as
	// Consul's client takes them. It is copied, not kept; its HttpClient
	// is not used (the backend builds a bounded one, on a copy of its
	// Transport). Nil means api.DefaultConfig(), which reads
	// CONSUL_HTTP_ADDR, CONSUL_HTTP_TOKEN, CONSUL_HTTP_TOKEN_FILE,
	// CONSUL_CACERT, CONSUL_CLIENT_CERT, CONSUL_CLIENT_KEY and the rest as
	// the consul CLI does. An address with user information is refused.
	API *api.Config

	// Lock is the lock name; see backends.ValidateLockName.
	Lock string

	// Prefix is prepended to Lock to form the key, e.g. "leaderrun/".
	// Zero value: the key is the lock name.
	Prefix string

	// LockDelay is how long Consul refuses to hand the key to anyone else
	// after this session is invalidated or destroyed while holding it, so
	// that a holder whose session was ended by someone else (an operator's
	// destroy, its check deregistered) has time to notice and stop its
	// command: at least the kill grace and a round trip. It also delays
	// every failover from a crashed holder by as much. 0 to MaxLockDelay.
	// Zero value: no delay (unlike the Consul API, whose default is 15 s;
	// leaderrun's --consul-lock-delay defaults to --kill-grace + 1 s).
	LockDelay time.Duration
}

// Backend campaigns for one lock in Consul. Its methods are safe for
// concurrent use, but Campaign is meant for one campaign at a time.
type Backend struct {
	client    *api.Client
	http      *http.Client
	addr      string
	prefix    string // Config.Prefix
	lock      string
	key       string
	lockDelay time.Duration
	// root is the backend this one is a slot of (see Slot), nil for one
	// that New made: the client is root's.
	root *Backend
}

var (
	_ backends.Backend              = (*Backend)(nil)
	_ backends.LeaseDurationChecker = (*Backend)(nil)
)

// CheckLeaseDuration implements backends.LeaseDurationChecker: the
// session TTL, which is the lease duration, must be within MinTTL and
// MaxTTL. Consul may invalidate a session as late as twice its TTL after
// its last renewal.
func (b *Backend) CheckLeaseDuration(d time.Duration) error {
	if d < MinTTL || d > MaxTTL {
		return fmt.Errorf("a Consul session TTL must be within %v and %v", MinTTL, MaxTTL)
	}
	return nil
}

// New returns a backend for cfg.Lock. It validates cfg and builds the
// client, but sends nothing to Consul until the first Campaign or Status.
func New(cfg Config) (*Backend, error) {
	if err := backends.ValidateLockName(cfg.Lock); err != nil {
		return nil, fmt.Errorf("consul: %w", err)
	}
	if cfg.LockDelay < 0 || cfg.LockDelay > MaxLockDelay {
		return nil, fmt.Errorf("consul: lock-delay %v out of range: Consul accepts 0s to %v", cfg.LockDelay, MaxLockDelay)
	}
	var apiCfg api.Config
	if cfg.API != nil {
		apiCfg = *cfg.API
	} else {
		apiCfg = *api.DefaultConfig()
	}
	if err := CheckAddress(apiCfg.Address); err != nil {
		return nil, fmt.Errorf("consul: %w", err)
	}
	addr := backends.Redact(apiCfg.Address)
	client, hc, err := newClient(&apiCfg)
	if err != nil {
		// NewClient fails on a bad scheme, TLS files or token file; none of
		// its messages contains the token itself.
		return nil, fmt.Errorf("consul: client for %s: %w", addr, err)
	}
	if addr == "" {
		addr = apiCfg.Address
	}
	return &Backend{
		client:    client,
		http:      hc,
		addr:      addr,
		prefix:    cfg.Prefix,
		lock:      cfg.Lock,
		key:       cfg.Prefix + cfg.Lock,
		lockDelay: cfg.LockDelay,
	}, nil
}

// Name implements backends.Backend.
func (b *Backend) Name() string { return "consul" }

// Key is where the lock lives in Consul's KV store.
func (b *Backend) Key() string { return b.key }

// LockDelay is the lock-delay of the sessions this backend creates.
func (b *Backend) LockDelay() time.Duration { return b.lockDelay }

// Slot implements backends.Backend: slot i is the key of the lock
// backends.SlotLock(lock, i), with its own queue, markers and history,
// reached through b's client. Each candidacy has its own check and
// sessions whatever the slot; the connections to the agent are shared.
func (b *Backend) Slot(i int) backends.Backend {
	r := b
	if b.root != nil {
		r = b.root
	}
	if i == 0 {
		return r
	}
	s := *r
	s.lock = backends.SlotLock(r.lock, i)
	s.key, s.root = r.prefix+s.lock, r
	return &s
}

// Close implements backends.Backend: it closes idle connections to the
// agent, unless b is a slot backend, which has nothing of its own to
// close. Leases must be released first.
func (b *Backend) Close() error {
	if b.http != nil && b.root == nil {
		b.http.CloseIdleConnections()
	}
	return nil
}

// Keys of the lock's completion markers, history and queue of waiters.
// Lock names cannot hold ':' (backends.ValidateLockName), so these never
// meet another lock's key.
func (b *Backend) queuePrefix() string { return b.key + ":queue/" }

func (b *Backend) queueKey(session string) string { return b.queuePrefix() + session }

func (b *Backend) markerPrefix() string { return b.key + ":done/" }

func (b *Backend) markerKey(key string) string { return b.markerPrefix() + key }

func (b *Backend) historyPrefix() string { return b.key + ":history/" }

func (b *Backend) historyKey(token uint64) string {
	return fmt.Sprintf("%s%020d", b.historyPrefix(), token)
}

// sessionName is the name of every candidate's session for this lock.
// Status counts the sessions of that name to tell how many wait.
func (b *Backend) sessionName() string { return "leaderrun " + b.key }

// unavailable wraps an error met before leadership: it names the address
// and the key, and never the token.
func (b *Backend) unavailable(op string, err error) error {
	return fmt.Errorf("consul at %s: %s %s: %w: %w", b.addr, op, b.key, backends.ErrUnavailable, err)
}

// errSessionGone says that the candidate's session was invalidated (it
// expired, its node failed, or it was destroyed): campaign again with a new
// one.
var errSessionGone = errors.New("consul: session invalidated")

// isInvalidSession reports whether Consul refused a write because the
// session no longer exists ("raft apply failed: invalid session ...").
func isInvalidSession(err error) bool {
	var se api.StatusError
	return errors.As(err, &se) && strings.Contains(strings.ToLower(se.Body), "invalid session")
}

// get reads key. With index > 0 it is a blocking query that returns when
// the key's index passes index, or after at most wait.
func (b *Backend) get(ctx context.Context, key string, index uint64, wait time.Duration, consistent bool) (*api.KVPair, *api.QueryMeta, error) {
	q := &api.QueryOptions{RequireConsistent: consistent}
	timeout := requestTimeout
	if index > 0 {
		wait = min(max(wait, time.Millisecond), maxWait)
		// Consul adds a random jitter of up to 1/16 of the wait time: ask
		// for 16/17 of it so that the answer comes by wait at the latest.
		q.WaitIndex, q.WaitTime = index, max(wait-wait/17, time.Millisecond)
		timeout += wait
	}
	ctx, cancel := context.WithTimeout(ctx, timeout)
	defer cancel()
	return b.client.KV().Get(key, q.WithContext(ctx))
}

// nextIndex is the index for the next blocking query after one that
// returned got. Consul's rules: an index that went backwards (a snapshot
// restore, a new dev agent) starts over from 0, which does not block; an
// index of 0 must not be used to block, so it becomes 1.
func nextIndex(prev, got uint64) uint64 {
	if got < prev {
		return 0
	}
	return max(got, 1)
}
