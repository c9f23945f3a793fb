// Package redis is the Redis store: the lock most cron fleets already keep
// in Redis, made as safe as Redis allows. A lock is a backends.RecordLock
// on the server's clock: the key <prefix><lock> holds the holder's value
// with a PX expiry of its lease, <key>:token is the counter its tokens
// come from, and every change is one Lua script (scripts.go).
// docs/backends/redis.md lists the keys and says what holds and what does
// not (an asynchronous replica can forget a grant; Redis Cluster is not
// supported: the scripts use several keys).
package redis

import (
	"context"
	"crypto/tls"
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

// Config describes one Redis. The zero value of each field is noted.
type Config struct {
	// URL is the server: redis://[user:password@]host:port[/db], rediss://
	// or unix://[user:password@]/path, with go-redis's query parameters.
	// With Sentinels it names no host (rediss://user:pass@/0), or is empty.
	URL string
	// Password is used when the URL carries none: redis-cli's
	// REDISCLI_AUTH. Zero: none.
	Password string
	// SentinelMaster and Sentinels (host:port) name a Sentinel-managed
	// primary, SentinelPassword authenticates to the Sentinels. Zero: no
	// Sentinel.
	SentinelMaster, SentinelPassword string
	Sentinels                        []string
	// TLS is for rediss://. Nil: TLS 1.2 or later with the system's roots.
	TLS *tls.Config
	// Prefix starts every key. Zero: none.
	Prefix string
	// MinReplicas is how many replicas must acknowledge a grant before it
	// is handed out, and each renewal before it counts (WAIT). Zero: none.
	MinReplicas int
	// Log receives the store's lines, and go-redis's at debug level. Nil:
	// nothing is logged.
	Log *slog.Logger
}

// Store is one Redis, shared by every lock the process campaigns for.
type Store struct {
	c *redis.Client
	// open builds a client with a pool of its own, onConnect run on each
	// new connection: a holder's tracking connection.
	open    func(pool int, onConnect func(context.Context, *redis.Conn) error) *redis.Client
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

// Name implements backends.Store.
func (s *Store) Name() string { return "redis" }

// Close implements backends.Store. Leases must be released first.
func (s *Store) Close() error {
	s.stop()
	s.wg.Wait()
	return s.c.Close()
}

// Lock implements backends.Store. Lock names have no colon, so the
// queue's keys ("<prefix>:...") start with no lock's key: a holder hears
// of every key under its own, and must not hear of heartbeats.
func (s *Store) Lock(name string) backends.Lock {
	return &lock{s: s, name: name, key: s.prefix + name, waiters: s.prefix + ":waiters:" + name, alive: s.prefix + ":alive:" + name}
}

type lock struct {
	s                         *Store
	name, key, waiters, alive string
}

func (l *lock) Key() string              { return l.key }
func (l *lock) docKey(doc string) string { return l.key + ":doc:" + doc }
func (l *lock) wakePrefix() string       { return l.key + ":wake:" }

func (l *lock) Get(ctx context.Context) (backends.Record, error) {
	res, err := getScript().Run(ctx, l.s.c, []string{l.key, l.alive}).Slice()
	if err == nil && len(res) != 3 {
		err = fmt.Errorf("the get script answered %d values, want 3", len(res))
	}
	if err != nil {
		return backends.Record{}, l.s.fail("read", l.key, err)
	}
	rec := backends.Record{}
	if raw, ok := res[0].(string); ok {
		pttl, _ := res[1].(int64)
		rec = l.parse(raw, pttl)
	}
	waiting, _ := res[2].(int64)
	rec.Waiting = int(waiting)
	return rec, nil
}

// parse reads a value of the lock with pttl ms left (-1: no expiry, a key
// set by hand). Its Version is the value itself, which names the grant.
func (l *lock) parse(raw string, pttl int64) backends.Record {
	rec := backends.Record{Holder: "(not leaderrun's value)", Left: backends.NoClock, Node: l.s.addr, Version: raw}
	var v struct {
		Identity, Nonce string
		Token           uint64
		LeaseMS         int64 `json:"lease_ms"`
		Holders         int
	}
	if json.Unmarshal([]byte(raw), &v) == nil && v.Identity != "" {
		rec.Holder, rec.Owner, rec.Token, rec.Holders = v.Identity, v.Nonce, v.Token, v.Holders
		rec.TTL = time.Duration(v.LeaseMS) * time.Millisecond
	}
	if pttl >= 0 {
		rec.Left = time.Duration(pttl) * time.Millisecond
	} else {
		rec.TTL = 0 // held for ever, never taken over
	}
	return rec
}

// Take implements backends.RecordLock: the lock is granted only if its key
// does not exist, whatever prev says (a lease that ran out is a key gone).
func (l *lock) Take(ctx context.Context, _ backends.Record, c backends.Claim) (backends.Record, error) {
	l.s.startChecks()
	ms := max(c.Timings.LeaseDuration.Milliseconds(), 1)
	raw, err := takeScript().Run(ctx, l.s.c, []string{l.key, l.key + ":token", l.docKey(backends.DocHistory), l.waiters, l.alive},
		c.Owner, c.Identity, ms, c.Holders).Text()
	switch {
	case errors.Is(err, redis.Nil):
		return backends.Record{}, fmt.Errorf("redis: %q: %w", l.key, backends.ErrConflict)
	case err != nil:
		return backends.Record{}, l.s.fail("take", l.key, err)
	}
	return l.parse(raw, ms), nil
}

// Keep implements backends.RecordLock. With Config.MinReplicas, a WAIT on
// the same connection follows: it counts the replicas that acknowledged
// the renewal and every earlier write, the grant's included. It takes at
// most a second, and half of what is left of ctx, so that it answers in
// time.
func (l *lock) Keep(ctx context.Context, held backends.Record) (backends.Record, error) {
	cn := l.s.c.Conn()
	defer cn.Close()
	if n, err := renewScript().Run(ctx, cn, []string{l.key}, held.Version, max(held.TTL.Milliseconds(), 1)).Int64(); err != nil {
		return held, l.s.fail("renew", l.key, err)
	} else if n != 1 {
		return held, fmt.Errorf("redis: %q no longer holds token %d (deleted, expired by the server's clock, or taken): %w",
			l.key, held.Token, backends.ErrLeaseLost)
	}
	if l.s.minRepl == 0 {
		return held, nil
	}
	wait := time.Second
	if dl, ok := ctx.Deadline(); ok {
		wait = max(min(wait, time.Until(dl)/2), time.Millisecond)
	}
	n, err := cn.Do(ctx, "WAIT", l.s.minRepl, wait.Milliseconds()).Int64()
	if err == nil && n < int64(l.s.minRepl) {
		err = fmt.Errorf("%d of the %d replicas asked for (--redis-min-replicas) acknowledged token %d within %v", n, l.s.minRepl, held.Token, wait)
	}
	if err != nil {
		return held, l.s.fail("replicate", l.key, err)
	}
	return held, nil
}

// Free implements backends.RecordLock: the key is deleted if it still
// holds held's value, and the first live waiter woken.
func (l *lock) Free(ctx context.Context, held backends.Record) error {
	return l.leave(ctx, held.Version, "")
}

func (l *lock) leave(ctx context.Context, val, nonce string) error {
	if err := leaveScript().Run(ctx, l.s.c, []string{l.key, l.waiters, l.alive}, val, nonce, l.wakePrefix()).Err(); err != nil {
		return l.s.fail("leave", l.key, err)
	}
	return nil
}

// ReadDoc implements backends.Lock, reading at most one byte more than
// backends.MaxDoc. The version is the content itself, which the write
// script compares; an empty string is no document.
func (l *lock) ReadDoc(ctx context.Context, name string) (backends.Doc, error) {
	d, key := backends.Doc{Name: name}, l.docKey(name)
	s, err := l.s.c.GetRange(ctx, key, 0, backends.MaxDoc).Result()
	switch {
	case err != nil:
		return d, l.s.fail("read", key, err)
	case len(s) > backends.MaxDoc:
		return d, fmt.Errorf("redis: %q is more than the %d bytes a document may hold", key, backends.MaxDoc)
	case s != "":
		d.Data, d.Version = []byte(s), s
	}
	return d, nil
}

func (l *lock) WriteDoc(ctx context.Context, d backends.Doc) error {
	return l.WriteDocHeld(ctx, d, backends.Record{})
}

// WriteDocHeld implements backends.RecordLock: one script, which writes
// only while the lock holds held's value (any, for WriteDoc).
func (l *lock) WriteDocHeld(ctx context.Context, d backends.Doc, held backends.Record) error {
	key := l.docKey(d.Name)
	version, _ := d.Version.(string)
	n, err := docScript().Run(ctx, l.s.c, []string{key, l.key}, version, d.Data, held.Version).Int64()
	switch {
	case err != nil:
		return l.s.fail("write", key, err)
	case n == 0:
		return fmt.Errorf("redis: %q: %w", key, backends.ErrConflict)
	case n < 0:
		return fmt.Errorf("redis: %q no longer holds token %d; %q not written: %w", l.key, held.Token, key, backends.ErrLeaseLost)
	}
	return nil
}

// fail wraps an error of op on key: unavailable, and refused when asking
// again cannot help; it names no password.
func (s *Store) fail(op, key string, err error) error {
	if refused(err) {
		err = fmt.Errorf("%w: %w", backends.ErrRefused, err)
	}
	err = fmt.Errorf("redis at %s: %s %q: %w: %w", s.addr, op, key, backends.ErrUnavailable, err)
	if msg := err.Error(); s.redactString(msg) != msg {
		return &redacted{err, s.redactString(msg)}
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

// redacted is an error whose message lost its secrets.
type redacted struct {
	err error
	msg string
}

func (r *redacted) Error() string { return r.msg }
func (r *redacted) Unwrap() error { return r.err }
