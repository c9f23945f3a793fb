// Package redis is the Redis store: the lock most cron fleets already
// keep in Redis (SET key PX), made as safe as Redis allows: a lease the
// server times and checks on every renewal, a fencing token granted in
// the same step as the lock, and the limits of an asynchronously
// replicated store said where a user reads them (docs/backends/redis.md,
// which also lists every key).
//
// Each lock is a backends.RecordLock on the server's clock. Its key,
// <prefix><lock>, holds the JSON value {"identity","nonce","token",
// "lease_ms"} (and "holders" in a pool) with a PX expiry of the lease;
// <key>:token is the counter the token is drawn from, never expired or
// deleted. Every change is one Lua script (scripts.go): the grant is INCR
// and SET in one step, and renewal, release and the fenced write act only
// while the key holds the holder's value, byte for byte. The history and
// the completion markers are the documents <key>:doc:history and
// <key>:doc:markers, replaced whole by a script conditional on the digest
// read.
//
// Waiters queue in two sorted sets, <prefix>:waiters:<lock> (by the
// server's clock when they joined) and <prefix>:alive:<lock> (each one's
// liveness deadline), and each listens on a pub/sub channel of its own:
// a release, or a withdrawal that leaves the lock free, wakes the first
// live waiter alone, and only that one times the holder's lease (see
// follow.go). The queue's keys start with no lock's key, so that a
// holder, which hears of every change of a key under its own (client
// tracking), does not hear of every waiter's heartbeat.
//
// The token is strictly increasing for as long as the server never
// forgets an INCR it acknowledged: one primary with appendfsync always.
// An asynchronously replicated primary that fails over can forget a grant
// and its token; Config.MinReplicas narrows that window, it does not close
// it. Redis Cluster is not supported (the scripts use several keys).
package redis

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"strings"
	"sync"
	"sync/atomic"

	"github.com/redis/go-redis/v9"

	"github.com/leaderrun/leaderrun/backends"
)

// Config describes one Redis. The zero value of each field is noted.
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

	// Prefix starts every key: a lock's key is Prefix + its name.
	// Zero: no prefix.
	Prefix string

	// MinReplicas is how many replicas must acknowledge a grant before
	// it is handed out, and every renewal before it counts (WAIT, for at
	// most the retry period and 1 s). Zero: none are waited for; if the
	// server reports replicas, the store logs once what that risks.
	MinReplicas int

	// Log receives the store's lines (the replica and persistence
	// warnings, whether a holder tracks or polls its key) and go-redis's
	// own, at debug level. Nil: nothing is logged.
	Log *slog.Logger
}

// Store is one Redis, shared by every lock the process campaigns for.
type Store struct {
	c       *redis.Client
	open    opener // for a holder's tracking connection
	prefix  string
	addr    string   // the server or Sentinels, for messages; never a password
	secrets []string // to redact, should a message ever carry one
	minRepl int
	log     *slog.Logger

	checks sync.Once
	ctx    context.Context // ended by Close, for the checks
	stop   context.CancelFunc
	wg     sync.WaitGroup

	woken atomic.Uint64 // wake-ups of waiters, for the herd test
}

// New returns the store of cfg. It parses the configuration but sends
// nothing to the server until a lock is first used.
func New(cfg Config) (*Store, error) {
	if cfg.MinReplicas < 0 {
		return nil, fmt.Errorf("redis: %d replicas to wait for: want 0 or more", cfg.MinReplicas)
	}
	if cfg.Log == nil {
		cfg.Log = slog.New(slog.DiscardHandler)
	}
	open, addr, secrets, err := newClient(cfg)
	if err != nil {
		return nil, err
	}
	s := &Store{c: open(4, nil), open: open, prefix: cfg.Prefix, addr: addr, secrets: secrets,
		minRepl: cfg.MinReplicas, log: cfg.Log.With("backend", "redis")}
	s.ctx, s.stop = context.WithCancel(context.Background())
	libraryLog.Store(s)
	libraryOnce.Do(func() { redis.SetLogger(libShim{}) })
	return s, nil
}

// Name implements backends.Store.
func (s *Store) Name() string { return "redis" }

// Close implements backends.Store. Leases must be released first.
func (s *Store) Close() error {
	s.stop()
	s.wg.Wait()
	return s.c.Close()
}

// Lock implements backends.Store.
func (s *Store) Lock(name string) backends.Lock {
	key := s.prefix + name
	// Lock names have no colon, so "<prefix>:" starts no lock's key.
	return &lock{s: s, name: name, key: key, waiters: s.prefix + ":waiters:" + name, alive: s.prefix + ":alive:" + name}
}

// lock is one lock's keys.
type lock struct {
	s              *Store
	name, key      string
	waiters, alive string
}

// Key implements backends.Lock.
func (l *lock) Key() string { return l.key }

func (l *lock) tokenKey() string         { return l.key + ":token" }
func (l *lock) docKey(doc string) string { return l.key + ":doc:" + doc }
func (l *lock) wakePrefix() string       { return l.key + ":wake:" }

// value is the lock's value as the take script writes it.
type value struct {
	Identity string `json:"identity"`
	Nonce    string `json:"nonce"`
	Token    uint64 `json:"token"`
	LeaseMS  int64  `json:"lease_ms"`
	// Holders is the pool size the holder campaigned with, when more
	// than 1 (--holders).
	Holders int `json:"holders,omitempty"`
}

// foreign is the holder of a value leaderrun did not write: held, by no
// one it knows.
const foreign = "(not leaderrun's value)"

// fail wraps an error of op on key as the store being unavailable, and
// refused when asking again cannot help. It names the server and the key,
// never a password.
func (s *Store) fail(op, key string, err error) error {
	if refused(err) {
		err = fmt.Errorf("%w: %w", backends.ErrRefused, err)
	}
	return s.redact(fmt.Errorf("redis at %s: %s %q: %w: %w", s.addr, op, key, backends.ErrUnavailable, err))
}

// redact replaces every secret in err's message; errors.Is and errors.As
// still see through it.
func (s *Store) redact(err error) error {
	if err == nil {
		return nil
	}
	msg := err.Error()
	if red := s.redactString(msg); red != msg {
		return &redacted{err: err, msg: red}
	}
	return err
}

func (s *Store) redactString(str string) string {
	for _, p := range s.secrets {
		if p != "" {
			str = strings.ReplaceAll(str, p, "xxxxx")
		}
	}
	return str
}

type redacted struct {
	err error
	msg string
}

func (r *redacted) Error() string { return r.msg }
func (r *redacted) Unwrap() error { return r.err }

// refused reports whether err is the server refusing us for good
// (credentials, ACL permissions, a command it does not know, a key of
// the wrong type, a certificate it or we do not trust) or answering as no
// Redis does (the guard's bounds), as opposed to a failure that may pass:
// the network, a restart (LOADING), a failover (READONLY, MASTERDOWN),
// too few replicas for its min-replicas-to-write (NOREPLICAS), a busy
// script (BUSY).
func refused(err error) bool {
	if certificateError(err) || errors.Is(err, errHostileReply) {
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

// parseRecord reads the lock's value, as the get script found it with
// pttl ms left, into a record; Version is the value itself, which names
// the grant (its nonce).
func (l *lock) parseRecord(raw string, pttl int64) backends.Record {
	rec := backends.Record{Left: -1, Waiting: -1, Node: l.s.addr, Version: raw}
	var v value
	if err := json.Unmarshal([]byte(raw), &v); err != nil || v.Identity == "" {
		rec.Holder = foreign
	} else {
		rec.Holder, rec.Owner, rec.Token, rec.Holders = v.Identity, v.Nonce, v.Token, v.Holders
		rec.TTL = msDuration(v.LeaseMS)
	}
	if pttl >= 0 {
		rec.Left = msDuration(pttl)
	} else {
		// No expiry (set by hand): held for ever, never taken over.
		rec.TTL = 0
	}
	return rec
}
