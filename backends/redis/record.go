package redis

import (
	"context"
	"crypto/sha1"
	"encoding/hex"
	"errors"
	"fmt"
	"strconv"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/leaderrun/leaderrun/backends"
)

// maxWaitTimeout caps the WAIT for replicas.
const maxWaitTimeout = time.Second

// Get implements backends.RecordLock with one script: the lock's value,
// what is left of its lease by the server's clock, and the live waiters.
func (l *lock) Get(ctx context.Context) (backends.Record, error) {
	res, err := getScript().Run(ctx, l.s.c, []string{l.key, l.alive}).Slice()
	if err == nil && len(res) != 3 {
		err = fmt.Errorf("the get script answered %d values, want 3", len(res))
	}
	if err != nil {
		return backends.Record{}, l.s.fail("read", l.key, err)
	}
	raw, _ := res[0].(string)
	pttl, _ := res[1].(int64)
	waiting, _ := res[2].(int64)
	rec := backends.Record{Waiting: int(waiting), Left: 0}
	if res[0] != nil && pttl != -2 {
		rec = l.parseRecord(raw, pttl)
		rec.Waiting = int(waiting)
	}
	return rec, nil
}

// Take implements backends.RecordLock: the lock is granted only if its
// key does not exist, whatever prev says (the server's clock expires a
// lease, so a lease that ran out is a key that is gone). The token comes
// from the same script.
func (l *lock) Take(ctx context.Context, _ backends.Record, c backends.Claim) (backends.Record, error) {
	l.s.startChecks()
	ms := max(c.Timings.LeaseDuration.Milliseconds(), 1)
	raw, err := takeScript().Run(ctx, l.s.c, []string{l.key, l.tokenKey(), l.docKey(backends.DocHistory), l.waiters, l.alive},
		c.Owner, c.Identity, ms, c.Holders).Text()
	switch {
	case errors.Is(err, redis.Nil):
		return backends.Record{}, fmt.Errorf("redis: %q: %w", l.key, backends.ErrConflict)
	case err != nil:
		return backends.Record{}, l.s.fail("take", l.key, err)
	}
	return l.parseRecord(raw, ms), nil
}

// Keep implements backends.RecordLock with the renew script; with
// Config.MinReplicas, followed on the same connection by a WAIT, and
// acknowledged only if enough replicas acknowledged it.
func (l *lock) Keep(ctx context.Context, held backends.Record) (backends.Record, error) {
	ms := strconv.FormatInt(max(held.TTL.Milliseconds(), 1), 10)
	if l.s.minRepl == 0 {
		res, err := renewScript().Run(ctx, l.s.c, []string{l.key}, held.Version, ms).Result()
		if err != nil {
			return held, l.s.fail("renew", l.key, err)
		}
		return held, l.renewed(res, held)
	}
	// WAIT counts the replicas that acknowledged the renewal, and with it
	// every write before it in the replication stream, the grant and its
	// token included. A pipeline runs on one connection; EVAL, not
	// EVALSHA: a pipeline cannot fall back on NOSCRIPT. The WAIT takes at
	// most half of what is left of ctx, so that its answer comes in time.
	wait := maxWaitTimeout
	if dl, ok := ctx.Deadline(); ok {
		wait = max(min(wait, time.Until(dl)/2), time.Millisecond)
	}
	var renew, acks *redis.Cmd
	_, _ = l.s.c.Pipelined(ctx, func(p redis.Pipeliner) error {
		renew = renewScript().Eval(ctx, p, []string{l.key}, held.Version, ms)
		acks = p.Do(ctx, "WAIT", l.s.minRepl, wait.Milliseconds())
		return nil
	})
	if err := renew.Err(); err != nil {
		return held, l.s.fail("renew", l.key, err)
	}
	if err := l.renewed(renew.Val(), held); err != nil {
		return held, err
	}
	n, err := acks.Int64()
	if err == nil && n < int64(l.s.minRepl) {
		err = fmt.Errorf("%d of the %d replicas asked for (--redis-min-replicas) acknowledged token %d within %v",
			n, l.s.minRepl, held.Token, wait.Round(time.Millisecond))
	}
	if err != nil {
		return held, l.s.fail("replicate", l.key, err)
	}
	return held, nil
}

// renewed reads the renew script's answer: 1, or the lock's value.
func (l *lock) renewed(res any, held backends.Record) error {
	if n, ok := res.(int64); ok && n == 1 {
		return nil
	}
	if cur, _ := res.(string); cur != "" {
		rec := l.parseRecord(cur, -1)
		return fmt.Errorf("redis: the lock %q is held by %q with token %d, not by us (token %d): %w",
			l.key, rec.Holder, rec.Token, held.Token, backends.ErrLeaseLost)
	}
	return fmt.Errorf("redis: the lock %q (token %d) is gone: deleted, or expired by the server's clock: %w",
		l.key, held.Token, backends.ErrLeaseLost)
}

// Free implements backends.RecordLock: the key is deleted if it still
// holds held's value, and the first live waiter woken. If the server
// cannot be reached, the lease expires by its clock.
func (l *lock) Free(ctx context.Context, held backends.Record) error {
	if err := l.leave(ctx, held.Version, ""); err != nil {
		return l.s.fail("release", l.key, err)
	}
	return nil
}

func (l *lock) leave(ctx context.Context, val, nonce string) error {
	return leaveScript().Run(ctx, l.s.c, []string{l.key, l.waiters, l.alive}, val, nonce, l.wakePrefix()).Err()
}

// ReadDoc implements backends.Lock. It reads at most one byte more than
// backends.MaxDoc; the version is the content's SHA-1, which the write
// script compares (redis.sha1hex). An empty string is no document.
func (l *lock) ReadDoc(ctx context.Context, name string) (backends.Doc, error) {
	d := backends.Doc{Name: name}
	key := l.docKey(name)
	s, err := l.s.c.GetRange(ctx, key, 0, backends.MaxDoc).Result()
	switch {
	case err != nil:
		return d, l.s.fail("read", key, err)
	case len(s) > backends.MaxDoc:
		return d, fmt.Errorf("redis: %q is more than the %d bytes a document may hold", key, backends.MaxDoc)
	case s != "":
		sum := sha1.Sum([]byte(s))
		d.Data, d.Version = []byte(s), hex.EncodeToString(sum[:])
	}
	return d, nil
}

// WriteDoc implements backends.Lock.
func (l *lock) WriteDoc(ctx context.Context, d backends.Doc) error {
	return l.writeDoc(ctx, d, backends.Record{})
}

// WriteDocHeld implements backends.RecordLock: the same script, which
// writes only while the lock holds held's value.
func (l *lock) WriteDocHeld(ctx context.Context, d backends.Doc, held backends.Record) error {
	return l.writeDoc(ctx, d, held)
}

func (l *lock) writeDoc(ctx context.Context, d backends.Doc, held backends.Record) error {
	key := l.docKey(d.Name)
	version, _ := d.Version.(string)
	n, err := docScript().Run(ctx, l.s.c, []string{key, l.key}, version, d.Data, held.Version).Int64()
	switch {
	case err != nil:
		return l.s.fail("write", key, err)
	case n == 0:
		return fmt.Errorf("redis: %q: %w", key, backends.ErrConflict)
	case n < 0:
		return fmt.Errorf("redis: the lock %q no longer holds token %d; %q not written: %w", l.key, held.Token, key, backends.ErrLeaseLost)
	}
	return nil
}

func msDuration(ms int64) time.Duration { return time.Duration(ms) * time.Millisecond }
