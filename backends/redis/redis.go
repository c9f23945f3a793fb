// Package redis is the Redis backend: the lock most cron fleets already
// keep in Redis (SET key NX PX), made as safe as Redis allows: a lease
// the server checks on every renewal, a fencing token granted in the same
// step as the lock, and the limits of an asynchronously replicated store
// said where a user reads them (docs/backends/redis.md).
//
// # Keys
//
// For the lock L with prefix P ("leaderrun/" by default), all in the
// database the URL selects:
//
//	P L             the lock: JSON {"identity","nonce","token","lease_ms"},
//	                with a PX expiry of the lease; absent when free
//	P L :token      the token counter (INCR); never expired or deleted by
//	                leaderrun
//	P L :history    sorted set of the last 100 terms (JSON), by token
//	P L :done:KEY   a completion marker (JSON), with a PX expiry
//	P L :probe      a lease's tracking probe (track.go), expiring in 2 s
//	P :waiters: L   the queue: sorted set of waiting candidates' nonces,
//	                by the server's clock (microseconds) when they joined
//	P :alive: L     each waiter's liveness deadline (server milliseconds)
//
// and the pub/sub channels P L :wake:NONCE, one per waiting candidate.
// Lock names have no colon, so no lock's keys can be another's, and the
// queue's keys start with no lock's key (a leader tracks every key that
// starts with its own).
//
// # Scripts
//
// Every change is one Lua script (scripts.go), atomic on the server:
//
//   - Acquire: if the lock is free and the candidate is first in the
//     queue (or the queue is empty), INCR the token counter and SET the
//     lock NX PX lease with a value that holds the identity, a random
//     nonce of this candidacy, the token and the lease. The grant and its
//     token are one step: no grant without its token, no token without
//     its grant.
//   - Renew: PEXPIRE the lock only if it still holds our value. A
//     renewal that finds another value, or none, is a loss (S3).
//   - Release: DEL the lock only if it still holds our value, append the
//     term to the history and trim it, and PUBLISH on the first waiter's
//     channel.
//   - Complete: SET the marker only if the lock holds our value.
//
// # Tokens
//
// The token is the counter's value after INCR, taken in the same script
// that grants the lock, so every grant's token is greater than every
// earlier grant's, for as long as the server never forgets an INCR it
// acknowledged: a single primary with the append-only file and
// appendfsync always (every write on disk before the answer) keeps that
// across restarts and crashes. Without persistence a restart starts the
// counter again at 1 (if the counter alone is deleted by hand, the next
// grant goes on from the newest term in the history). An asynchronously
// replicated primary that fails over can forget a grant and its token:
// see docs/backends/redis.md, and Config.MinReplicas.
//
// Expiry is timed by the server, on its own clock: PX and PEXPIRE count
// from when the server runs the command, after the send time the runner
// counts its deadline from. Redis keeps expiries as wall-clock times, so
// a server whose clock jumps forward expires leases early: run the
// server's clock slewed (NTP), never stepped.
//
// # Waiting, without a herd
//
// A waiting candidate joins the queue and subscribes to its own wake
// channel. Only the first live waiter may take a free lock, and the
// release script publishes to it alone: one waiter acts on a release,
// whatever the queue's length. The first waiter also sleeps until the
// holder's lease expires by the server's clock (PTTL, as the last attempt
// read it), so a holder that died is replaced when its lease runs out,
// without keyspace notifications (off by default, and a server-wide
// setting an application should not change). Every waiter runs its
// attempt again every retry period (jittered), which refreshes its
// liveness deadline (three retry periods): a waiter that died leaves the
// queue when its deadline passes, and no one waits behind it longer.
// Without pub/sub (a proxy that does not forward it, a connection that
// is down) a waiter still tries every retry period.
//
// # Loss
//
// A lease tracks its key (track.go): Redis announces every change of a
// key under the lock's key on the lease's tracking connection, and the
// lease then reads the key, and closes Lost when it holds another value
// or none, within milliseconds (S3). Until tracking is proved to work, or
// where it does not (a server before 6.0, an ACL without CLIENT TRACKING,
// a proxy without pub/sub), the lease reads its key every 500 ms.
//
// # Replicas
//
// With Config.MinReplicas N > 0, a grant counts only once N replicas
// acknowledged it (WAIT after a renewal that follows the grant, on the
// same connection): if fewer do within the retry period (at most 1 s),
// the candidate frees the lock and waits again; no child starts. Every
// renewal is followed by the same WAIT, and counts as acknowledged only
// if N replicas acknowledged it, so the runner's deadline runs from
// renewals the replicas hold too. That narrows what a failover can lose;
// it does not close it (see docs/backends/redis.md).
//
// # Connections and bounds
//
// One pool of at most four connections (a renewal, the loss check, a
// release), one pub/sub connection while a candidate waits, and a
// lease's tracking connection while it leads. The
// backend speaks RESP2, and every connection passes what the server
// sends through a guard (guard.go) that refuses a reply over 8 MiB, a
// string over 1 MiB, or arrays nested deeper than 8, before go-redis
// allocates for it. Redis Cluster is not supported (the scripts use
// several keys, which would need one hash slot).
package redis

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/leaderrun/leaderrun/backends"
)

// Defaults of Config.
const (
	// DefaultRetryPeriod is used when Config.RetryPeriod is zero.
	DefaultRetryPeriod = 2 * time.Second
	// DefaultLeaseDuration is used when a campaign asks for none.
	DefaultLeaseDuration = 15 * time.Second
	// DefaultDialTimeout bounds each connection attempt, unless the URL's
	// dial_timeout says otherwise.
	DefaultDialTimeout = 5 * time.Second
)

const (
	// requestTimeout bounds the requests the backend sends on its own
	// behalf (campaign attempts, the loss check, Status), so that a
	// connection that stalls without closing cannot hang them.
	requestTimeout = 5 * time.Second
	// withdrawTimeout bounds the clean-up of a cancelled candidacy.
	withdrawTimeout = 2 * time.Second
	// lossCheck is how often a lease reads the lock (see the package doc).
	lossCheck = 500 * time.Millisecond
	// maxWaitTimeout caps the WAIT for replicas.
	maxWaitTimeout = time.Second
)

// Config describes one lock in one Redis. The zero value of each field is
// noted.
type Config struct {
	// URL is the server: redis://[user:password@]host:port[/db],
	// rediss:// (TLS), or unix://[user:password@]/path/to/socket, with
	// go-redis's query parameters (dial_timeout, read_timeout, db, ...).
	// With Sentinels, it gives only the scheme, the user, password and
	// database of the primary, and no host (rediss://user:pass@/0); it may
	// then be empty. leaderrun sets the protocol (RESP2), the pools, the
	// client name and the dialer itself.
	URL string

	// Password is used when the URL carries none: redis-cli's
	// REDISCLI_AUTH. Zero: no password unless the URL has one.
	Password string

	// SentinelMaster and Sentinels name a Sentinel-managed primary: the
	// master name and the Sentinels' host:port. Zero: no Sentinel; URL
	// names the server.
	SentinelMaster string
	Sentinels      []string
	// SentinelPassword authenticates to the Sentinels. Zero: none.
	SentinelPassword string

	// TLS holds the CA and client certificate for rediss:// (the
	// server's name is checked as the address gives it). Zero: the
	// system's roots, no client certificate.
	TLS *TLSFiles

	// Prefix and Lock name the lock's key: Prefix + Lock. Lock is
	// required; see backends.ValidateLockName.
	Prefix, Lock string

	// MinReplicas is how many replicas must acknowledge a grant before
	// the lease is handed over, and every renewal before it counts (see
	// the package doc). Zero: none are waited for; if the server reports
	// replicas, the backend logs once what that risks.
	MinReplicas int

	// RetryPeriod is leaderrun's --retry-period: how often a waiter tries
	// again (and proves it is alive), and how long a WAIT for replicas
	// may take (at most 1 s). Zero: DefaultRetryPeriod.
	RetryPeriod time.Duration

	// Log receives the backend's lines (the replica warning, a waiter's
	// errors) and go-redis's own, at debug level. Nil: nothing is logged.
	Log *slog.Logger
}

// Backend campaigns for one lock in one Redis. Its methods are safe for
// concurrent use, but Campaign is meant for one campaign at a time.
type Backend struct {
	c         *redis.Client
	tracker   func(func(context.Context, *redis.Conn) error) *redis.Client
	root      *Backend // the backend of slot 0, for a slot's backend (Slot); nil for slot 0 itself
	prefix    string
	baseLog   *slog.Logger // the configured log, before the lock is named
	addr      string       // the server or Sentinels, for messages; never a password
	secrets   []string     // to redact, should a message ever carry one
	lock, key string
	keys      []string // lock, token, waiters, alive, history
	wakePfx   string
	minRepl   int
	retry     time.Duration
	log       *slog.Logger

	checks   sync.Once
	checkCtx context.Context
	stop     context.CancelFunc
	checkWG  sync.WaitGroup

	attempts atomic.Uint64 // runs of the acquire script, for the herd test
}

var _ backends.Backend = (*Backend)(nil)

// New returns a backend for cfg.Lock. It parses the configuration but
// sends nothing to the server until the first Campaign or Status.
func New(cfg Config) (*Backend, error) {
	if err := backends.ValidateLockName(cfg.Lock); err != nil {
		return nil, fmt.Errorf("redis: %w", err)
	}
	if cfg.MinReplicas < 0 {
		return nil, fmt.Errorf("redis: %d replicas to wait for: want 0 or more", cfg.MinReplicas)
	}
	if cfg.RetryPeriod <= 0 {
		cfg.RetryPeriod = DefaultRetryPeriod
	}
	if cfg.Log == nil {
		cfg.Log = slog.New(slog.DiscardHandler)
	}
	cs, err := newClient(cfg)
	if err != nil {
		return nil, err
	}
	b := &Backend{
		c:       cs.main,
		tracker: cs.tracker,
		prefix:  cfg.Prefix,
		addr:    cs.addr,
		secrets: cs.secrets,
		minRepl: cfg.MinReplicas,
		retry:   cfg.RetryPeriod,
		baseLog: cfg.Log,
	}
	b.bind(cfg.Lock, cfg.Log)
	b.checkCtx, b.stop = context.WithCancel(context.Background())
	setLibraryLog(b.log, b.redactString)
	return b, nil
}

// Name implements backends.Backend.
func (b *Backend) Name() string { return "redis" }

// Key is the lock's key.
func (b *Backend) Key() string { return b.key }

// Close implements backends.Backend. Leases must be released first.
func (b *Backend) Close() error {
	if b.root != nil {
		return nil // a slot's backend: the connections are slot 0's
	}
	b.stop()
	b.checkWG.Wait()
	return b.c.Close()
}

// bind names b's lock and the keys that follow from it.
func (b *Backend) bind(lock string, log *slog.Logger) {
	key := b.prefix + lock
	b.lock, b.key = lock, key
	// The queue's keys do not start with the lock's key: a leader tracks
	// every key that does (track.go), and must not hear of every waiter's
	// heartbeat. Lock names have no colon, so "<prefix>:" starts no lock's
	// key.
	b.keys = []string{key, key + ":token", b.prefix + ":waiters:" + lock, b.prefix + ":alive:" + lock, key + ":history"}
	b.wakePfx = key + ":wake:"
	b.log = log.With("backend", "redis", "lock", lock)
}

// Slot implements backends.Backend: slot i's backend shares b's
// connections, and its Close leaves them to slot 0's.
func (b *Backend) Slot(i int) backends.Backend {
	r := b
	if b.root != nil {
		r = b.root
	}
	if i == 0 {
		return r
	}
	s := &Backend{c: r.c, tracker: r.tracker, root: r, prefix: r.prefix, addr: r.addr, secrets: r.secrets,
		minRepl: r.minRepl, retry: r.retry, baseLog: r.baseLog, checkCtx: r.checkCtx, stop: r.stop}
	s.bind(backends.SlotLock(r.lock, i), r.baseLog)
	return s
}

// Completed implements backends.Backend. The server forgets an expired
// marker by itself.
func (b *Backend) Completed(ctx context.Context, key string) (*backends.Marker, error) {
	s, err := b.c.Get(ctx, b.markerKey(key)).Result()
	switch {
	case errors.Is(err, redis.Nil):
		return nil, nil
	case err != nil:
		return nil, b.redact(fmt.Errorf("redis at %s: read the marker %q: %w", b.addr, b.markerKey(key), err))
	}
	var m backends.Marker
	if err := json.Unmarshal([]byte(s), &m); err != nil {
		return nil, fmt.Errorf("redis: the marker %q is not leaderrun's JSON: %w", b.markerKey(key), err)
	}
	return &m, nil
}

// markerKey is where the marker of a once-key lives.
func (b *Backend) markerKey(key string) string { return b.key + ":done:" + key }

// waitTimeout is how long a WAIT for replicas may take.
func (b *Backend) waitTimeout() time.Duration { return min(b.retry, maxWaitTimeout) }

// value is the lock's value as the acquiring script writes it.
type value struct {
	Identity string `json:"identity"`
	Nonce    string `json:"nonce"`
	Token    uint64 `json:"token"`
	LeaseMS  int64  `json:"lease_ms"`
	// Holders is the pool size the holder campaigned with, when more
	// than 1 (--holders).
	Holders int `json:"holders,omitempty"`
}

func parseValue(s string) (value, error) {
	var v value
	err := json.Unmarshal([]byte(s), &v)
	return v, err
}

// randomNonce is 128 random bits in hex: no two candidacies share one.
func randomNonce() string {
	b := make([]byte, 16)
	_, _ = rand.Read(b)
	return hex.EncodeToString(b)
}

// unavailable wraps an error met before leadership: it names the server
// and the key, and never a password.
func (b *Backend) unavailable(op string, err error) error {
	return b.redact(fmt.Errorf("redis at %s: %s %q: %w: %w", b.addr, op, b.key, backends.ErrUnavailable, err))
}

// redact replaces every secret in err's message; errors.Is and errors.As
// still see through it.
func (b *Backend) redact(err error) error {
	if err == nil {
		return nil
	}
	msg := err.Error()
	if red := b.redactString(msg); red != msg {
		return &redacted{err: err, msg: red}
	}
	return err
}

func (b *Backend) redactString(s string) string {
	for _, p := range b.secrets {
		if p != "" {
			s = strings.ReplaceAll(s, p, "xxxxx")
		}
	}
	return s
}

type redacted struct {
	err error
	msg string
}

func (r *redacted) Error() string { return r.msg }
func (r *redacted) Unwrap() error { return r.err }

// refused reports whether err is the server refusing us for good
// (credentials, ACL permissions, a command it does not know, a key of
// the wrong type, a certificate it or we do not trust), as opposed to a
// failure that may pass: the network, a restart (LOADING), a failover
// (READONLY, MASTERDOWN), too few replicas for its min-replicas-to-write
// (NOREPLICAS), a busy script (BUSY).
func refused(err error) bool {
	if certificateError(err) {
		return true
	}
	var rerr redis.Error
	if !errors.As(err, &rerr) {
		return false
	}
	msg := rerr.Error()
	for _, transient := range []string{"LOADING", "READONLY", "MASTERDOWN", "NOREPLICAS", "BUSY", "TRYAGAIN",
		"CLUSTERDOWN", "MASTER_DOWN", "ERR max number of clients"} {
		if strings.HasPrefix(msg, transient) {
			return false
		}
	}
	return true
}

// Status implements backends.Backend with one script: the lock's value,
// its PTTL by the server's clock, and the live waiters.
func (b *Backend) Status(ctx context.Context) (backends.Status, error) {
	st := backends.Status{Lock: b.lock, Backend: b.Name(), Key: b.key, Remaining: -1, Waiting: -1, Node: b.addr}
	ctx, cancel := context.WithTimeout(ctx, requestTimeout)
	defer cancel()
	res, err := statusScript().Run(ctx, b.c, []string{b.key, b.keys[3]}).Slice()
	if err == nil && len(res) != 3 {
		err = fmt.Errorf("status script answered %d values, want 3", len(res))
	}
	if err != nil {
		return st, b.unavailable("read", err)
	}
	pttl, _ := res[1].(int64)
	waiting, _ := res[2].(int64)
	st.Waiting = int(waiting)
	s, ok := res[0].(string)
	if !ok || pttl == -2 {
		return st, nil
	}
	v, err := parseValue(s)
	if err != nil {
		// Someone else's value under our key: held, by no one we know.
		st.Held, st.Identity = true, "(not leaderrun's value)"
		st.Remaining = time.Duration(max(pttl, -1)) * time.Millisecond
		return st, nil
	}
	st.Held = true
	st.Identity = v.Identity
	st.Token = v.Token
	st.TTL = time.Duration(v.LeaseMS) * time.Millisecond
	st.Remaining = time.Duration(max(pttl, -1)) * time.Millisecond
	st.Holders = v.Holders
	return st, nil
}

// History implements backends.Backend from the history's sorted set,
// newest first.
func (b *Backend) History(ctx context.Context, limit int) ([]backends.Term, error) {
	if limit <= 0 || limit > backends.HistoryLimit {
		limit = backends.HistoryLimit
	}
	ctx, cancel := context.WithTimeout(ctx, requestTimeout)
	defer cancel()
	raw, err := b.c.ZRangeArgs(ctx, redis.ZRangeArgs{Key: b.keys[4], Start: 0, Stop: int64(limit - 1), Rev: true}).Result()
	if err != nil {
		return nil, b.redact(fmt.Errorf("redis at %s: read the history %q: %w: %w", b.addr, b.keys[4], backends.ErrUnavailable, err))
	}
	terms := make([]backends.Term, 0, len(raw))
	for _, s := range raw {
		var t backends.Term
		if err := json.Unmarshal([]byte(s), &t); err != nil {
			return nil, fmt.Errorf("redis: a term in %q is not leaderrun's JSON: %w", b.keys[4], err)
		}
		terms = append(terms, t)
	}
	return backends.NewestFirst(terms, limit), nil
}
