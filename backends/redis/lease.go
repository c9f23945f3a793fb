package redis

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"strconv"
	"sync/atomic"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/leaderrun/leaderrun/backends"
)

// lease is a held lock: the value the acquire script wrote, which every
// later script compares. A goroutine started by newLease reads the lock
// when it may have changed (see watch) and closes Lost when it holds
// another value or none. Release stops it and waits for it.
type lease struct {
	b        *Backend
	identity string
	value    string
	token    uint64
	ttl      time.Duration
	acquired time.Time

	*backends.Loss               // Lost and Err
	check          chan struct{} // poked when the lock may have changed
	tracked        atomic.Bool   // the tracker proved announcements arrive, for tests
	stop           context.CancelFunc
	done           chan struct{}
}

var _ backends.Lease = (*lease)(nil)

func (c *candidate) newLease(a attempt) (*lease, error) {
	v, err := parseValue(a.value)
	if err != nil || v.Nonce != c.nonce {
		// Cannot be: the script wrote it. Free it rather than hold a
		// lock whose token we cannot tell.
		c.maybeHeld = true
		return nil, c.b.unavailable("acquire", fmt.Errorf("the acquire script answered a value that is not ours: %q", a.value))
	}
	ctx, stop := context.WithCancel(context.Background())
	l := &lease{
		b:        c.b,
		identity: c.identity,
		value:    a.value,
		token:    v.Token,
		ttl:      time.Duration(v.LeaseMS) * time.Millisecond,
		acquired: a.sent,
		Loss:     backends.NewLoss(),
		check:    make(chan struct{}, 1),
		stop:     stop,
		done:     make(chan struct{}),
	}
	go l.watch(ctx)
	return l, nil
}

func (l *lease) Token() uint64       { return l.token }
func (l *lease) TTL() time.Duration  { return l.ttl }
func (l *lease) Acquired() time.Time { return l.acquired }

// Key is the lock's key.
func (l *lease) Key() string { return l.b.key }

// Value is the lock's value as this lease wrote it.
func (l *lease) Value() string { return l.value }

// watch checks the lock whenever the tracker (track.go) says it changed
// or was re-tracked, and every lossCheck while tracking is not proved to
// work, until ctx ends; it records a loss when the lock holds another
// value or none. A failed read records nothing: whether the server can
// still be reached is for renewals and the runner's deadline to judge.
func (l *lease) watch(ctx context.Context) {
	defer close(l.done)
	tr := l.b.startTracker(l.poke)
	defer tr.close()
	t := time.NewTicker(lossCheck)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-l.check:
		case <-t.C:
			l.tracked.Store(tr.tracking())
			if tr.tracking() {
				continue
			}
		}
		rctx, cancel := context.WithTimeout(ctx, lossCheck)
		cur, err := l.b.c.Get(rctx, l.b.key).Result()
		cancel()
		switch {
		case errors.Is(err, redis.Nil):
			l.Set(l.lostErr(""))
			return
		case err != nil:
			continue
		case cur != l.value:
			l.Set(l.lostErr(cur))
			return
		}
	}
}

// poke asks the watcher to check the lock; it never blocks.
func (l *lease) poke() {
	select {
	case l.check <- struct{}{}:
	default:
	}
}

// lostErr says why the lock holding cur ("" for none) is not ours.
func (l *lease) lostErr(cur string) error {
	if cur == "" {
		return fmt.Errorf("redis: the lock %q (token %d) is gone: deleted, or expired by the server's clock: %w",
			l.b.key, l.token, backends.ErrLeaseLost)
	}
	v, err := parseValue(cur)
	if err != nil {
		return fmt.Errorf("redis: the lock %q (token %d) holds a value leaderrun did not write: %w", l.b.key, l.token, backends.ErrLeaseLost)
	}
	return fmt.Errorf("redis: the lock %q is held by %q with token %d, not by us (%q, token %d): %w",
		l.b.key, v.Identity, v.Token, l.identity, l.token, backends.ErrLeaseLost)
}

// Renew implements backends.Lease with the renew script; with
// Config.MinReplicas, followed on the same connection by a WAIT, and
// acknowledged only if enough replicas acknowledged it. A lease already
// known to be lost is not renewed.
func (l *lease) Renew(ctx context.Context) error {
	if err := l.Err(); err != nil {
		return err
	}
	if l.b.minRepl > 0 {
		return l.replicate(ctx)
	}
	res, err := renewScript().Run(ctx, l.b.c, []string{l.b.key}, l.value, millis(l.ttl)).Result()
	if err != nil {
		return l.b.redact(fmt.Errorf("redis at %s: renew %q (token %d): %w", l.b.addr, l.b.key, l.token, err))
	}
	return l.renewed(res)
}

// renewed reads the renew script's answer: 1, or the lock's value.
func (l *lease) renewed(res any) error {
	if n, ok := res.(int64); ok && n == 1 {
		return nil
	}
	cur, _ := res.(string)
	l.Set(l.lostErr(cur))
	return l.Err()
}

// replicate runs the renew script and WAIT in one pipeline, on one
// connection: WAIT then counts the replicas that acknowledged the
// renewal, and with it every write before it in the replication stream,
// the grant and its token included. (A pipeline that go-redis sends again
// on a new connection after a network error sends both again: the
// renewal writes again, and WAIT waits for that write.) Too few
// replicas is an error, not a loss.
func (l *lease) replicate(ctx context.Context) error {
	var renew, wait *redis.Cmd
	_, err := l.b.c.Pipelined(ctx, func(p redis.Pipeliner) error {
		// EVAL, not EVALSHA: a pipeline cannot fall back on NOSCRIPT.
		renew = renewScript().Eval(ctx, p, []string{l.b.key}, l.value, millis(l.ttl))
		wait = p.Do(ctx, "WAIT", l.b.minRepl, l.b.waitTimeout().Milliseconds())
		return nil
	})
	if err != nil && renew.Err() == nil && wait.Err() == nil {
		return l.b.redact(fmt.Errorf("redis at %s: renew %q (token %d): %w", l.b.addr, l.b.key, l.token, err))
	}
	if err := renew.Err(); err != nil {
		return l.b.redact(fmt.Errorf("redis at %s: renew %q (token %d): %w", l.b.addr, l.b.key, l.token, err))
	}
	if err := l.renewed(renew.Val()); err != nil {
		return err
	}
	if err := wait.Err(); err != nil {
		return l.b.redact(fmt.Errorf("redis at %s: WAIT %d for the renewal of %q (token %d): %w",
			l.b.addr, l.b.minRepl, l.b.key, l.token, err))
	}
	if n, _ := wait.Int64(); n < int64(l.b.minRepl) {
		return fmt.Errorf("redis at %s: %d of the %d replicas asked for (--redis-min-replicas) acknowledged the renewal of %q (token %d) within %v",
			l.b.addr, n, l.b.minRepl, l.b.key, l.token, l.b.waitTimeout())
	}
	return nil
}

// Complete implements backends.Lease with one script that writes the
// marker only while the lock holds our value, expiring when m does.
func (l *lease) Complete(ctx context.Context, m backends.Marker) error {
	data, err := json.Marshal(m)
	if err != nil {
		return err
	}
	keep := max(time.Until(m.Expires), time.Millisecond)
	n, err := completeScript().Run(ctx, l.b.c, []string{l.b.key, l.b.markerKey(m.Key)}, l.value, string(data), millis(keep)).Int64()
	switch {
	case err != nil:
		return l.b.redact(fmt.Errorf("redis at %s: write the marker %q: %w", l.b.addr, l.b.markerKey(m.Key), err))
	case n != 1:
		l.Set(fmt.Errorf("redis: the lock %q no longer holds token %d; marker %q not written: %w",
			l.b.key, l.token, m.Key, backends.ErrLeaseLost))
		return l.Err()
	}
	return nil
}

// Release implements backends.Lease: one script frees the lock if it
// still holds our value, appends term to the history and wakes the first
// waiter. If the server cannot be reached, the lock expires after the
// lease duration.
func (l *lease) Release(ctx context.Context, term *backends.Term) error {
	if !l.BeginRelease() {
		return nil
	}
	l.stop()
	<-l.done
	var termJSON []byte
	var termToken uint64
	if term != nil {
		var err error
		if termJSON, err = json.Marshal(term); err != nil {
			return err
		}
		termToken = term.Token
	}
	err := releaseScript().Run(ctx, l.b.c, l.b.keys, l.value, string(termJSON), strconv.FormatUint(termToken, 10),
		strconv.Itoa(-(backends.HistoryLimit + 1)), l.b.wakePfx).Err()
	if err != nil {
		return l.b.redact(fmt.Errorf("redis at %s: release %q (token %d): %w", l.b.addr, l.b.key, l.token, err))
	}
	return nil
}
