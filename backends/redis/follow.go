package redis

import (
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"net"
	"slices"
	"sync"
	"sync/atomic"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/leaderrun/leaderrun/backends"
)

const (
	// aliveRetries is how many retry periods a waiter may stay silent
	// before the others drop it from the queue.
	aliveRetries = 3
	// pubsubPing is how long a pub/sub connection may stay silent before
	// it is pinged, so that one that died silently is replaced.
	pubsubPing = 30 * time.Second
	// lossCheck is how often a holder reads its key while Redis is not
	// known to announce its changes (S3 allows a second).
	lossCheck = 500 * time.Millisecond
)

// Follow implements backends.RecordLock (docs/backends/redis.md, "Waiting,
// without a herd" and "Loss"). A waiter (held nil) joins the queue and
// listens on a channel of its own, <key>:wake:<nonce>, on which a release
// wakes the first live waiter alone. A holder hears of every change of its
// key through client tracking on a connection of its own, and reads its
// key every lossCheck until an announcement proves that tracking works.
// With Config.MinReplicas, a holder's grant is first renewed and WAITed
// for (Keep): the driver follows every grant before it hands it out, and
// frees one that fails here.
func (l *lock) Follow(ctx context.Context, c backends.Claim, held *backends.Record) (backends.Follower, error) {
	l.s.startChecks()
	f := &follower{Wake: backends.NewWake(), l: l, claim: c, done: make(chan struct{}), since: time.Now()}
	rctx, cancel := context.WithCancel(context.Background())
	f.cancel = cancel
	if held != nil {
		if l.s.minRepl > 0 {
			if _, err := l.Keep(ctx, *held); err != nil {
				cancel()
				return nil, fmt.Errorf("not starting the command: %w", err)
			}
		}
		f.client = l.s.open(1, f.onConnect)
		f.ps = f.client.Subscribe(rctx, "__redis__:invalidate")
		go f.run(rctx, lossCheck)
		return f, nil
	}
	if err := f.queue(ctx); err != nil {
		cancel()
		return nil, err
	}
	f.ps = l.s.c.Subscribe(rctx, l.wakePrefix()+c.Owner)
	go f.run(rctx, 0)
	return f, nil
}

// follower is a waiter's place in the queue (client nil) or a holder's
// tracking of its key. run owns listening, live, since and logOnce.
type follower struct {
	backends.Wake
	l      *lock
	claim  backends.Claim
	behind atomic.Bool
	cancel context.CancelFunc
	done   chan struct{}
	ps     *redis.PubSub
	client *redis.Client // a holder's tracking connection

	listening, live bool      // a waiter's subscription is confirmed; a holder's tracking is proved
	since           time.Time // when the holder's tracking was (re)subscribed
	logOnce         sync.Once
}

func (f *follower) Behind() bool { return f.behind.Load() }

func (f *follower) poke() {
	if f.client == nil {
		f.l.s.woken.Add(1)
	}
	f.Poke()
}

// Close implements backends.Follower. A waiter leaves the queue, waking
// the next one if the lock is free (if that fails, its liveness deadline
// passes).
func (f *follower) Close() {
	f.cancel()
	_ = f.ps.Close() // ends a receive in progress
	<-f.done
	if f.client != nil {
		_ = f.client.Close()
		return
	}
	ctx, cancel := context.WithTimeout(context.Background(), f.claim.Timings.AttemptTimeout())
	defer cancel()
	_ = f.l.leave(ctx, "", f.claim.Owner)
}

// run pokes for what the connection hears, and ticks every period, or
// for a waiter (period 0) every retry period, jittered down by up to a
// quarter so that waiters do not march in step.
func (f *follower) run(ctx context.Context, period time.Duration) {
	defer close(f.done)
	every := func() time.Duration {
		if p := f.claim.Timings.RetryPeriod; period == 0 {
			return p - time.Duration(rand.Int64N(int64(p/4)+1))
		}
		return period
	}
	next, heard := time.Now().Add(every()), time.Now()
	for {
		msg, err := receive(ctx, f.ps, max(time.Until(next), time.Millisecond))
		if ctx.Err() != nil {
			return
		}
		var ne net.Error
		switch m := msg.(type) {
		case *redis.Subscription: // (re)subscribed: what came meanwhile is lost
			f.listening, f.live, f.since = true, false, time.Now()
			f.poke()
		case *redis.Message:
			if f.client == nil {
				// A wake-up: it goes to the first live waiter alone.
				f.behind.Store(false)
			}
			if f.client == nil || slices.Contains(m.PayloadSlice, f.l.key) || m.Payload == f.l.key {
				if f.live = f.client != nil; f.live {
					f.logOnce.Do(func() { f.l.s.log.Debug("redis: tracking the lock's key: a change is seen at once", "lock", f.l.name) })
				}
				f.poke()
			}
		}
		switch {
		case err == nil:
			heard = time.Now()
		case errors.As(err, &ne) && ne.Timeout():
			if time.Since(heard) > pubsubPing {
				_, heard = f.ps.Ping(ctx), time.Now()
			}
		default:
			// Broken, closed by the guard, or a FLUSHALL announced without
			// keys (go-redis calls that an error): look, and let go-redis
			// reconnect at the next receive.
			f.listening, f.live = false, false
			f.poke()
			select {
			case <-ctx.Done():
			case <-time.After(time.Until(next)):
			}
		}
		if !time.Now().Before(next) {
			f.tick(ctx)
			next = time.Now().Add(every())
		}
	}
}

// tick is a waiter's heartbeat, or a holder's look at its key while its
// tracking is not proved: each renewal is announced, so a holder that
// heard none in two retry periods says that it polls.
func (f *follower) tick(ctx context.Context) {
	if f.client == nil {
		qctx, cancel := context.WithTimeout(ctx, f.claim.Timings.AttemptTimeout())
		defer cancel()
		_ = f.queue(qctx)
	} else if !f.live {
		f.poke()
		if time.Since(f.since) > 2*f.claim.Timings.RetryPeriod+time.Second {
			f.logOnce.Do(func() {
				f.l.s.log.Info("redis: polling the lock's key: no change of it was announced (CLIENT TRACKING refused by the server "+
					"or the ACL, or pub/sub not passed through); a change is seen within the poll interval", "lock", f.l.name, "poll_interval", lossCheck)
			})
		}
	}
}

// queue joins the queue or refreshes the waiter's deadline there. It
// wakes the driver when the waiter became first (to time the holder), is
// first while the lock is free (a wake-up may have been lost), or has no
// confirmed subscription (it polls).
func (f *follower) queue(ctx context.Context) error {
	window := max(aliveRetries*f.claim.Timings.RetryPeriod.Milliseconds(), 1)
	res, err := queueScript().Run(ctx, f.l.s.c, []string{f.l.key, f.l.waiters, f.l.alive},
		f.claim.Owner, window, f.l.wakePrefix()).Int64Slice()
	if err == nil && len(res) != 2 {
		err = fmt.Errorf("the queue script answered %d values, want 2", len(res))
	}
	if err != nil {
		return f.l.s.fail("queue for", f.l.key, err)
	}
	if was := f.behind.Swap(res[0] != 0); res[0] == 0 && (was || res[1] == 1) || f.ps != nil && !f.listening {
		f.poke()
	}
	return nil
}

// onConnect turns tracking on for a holder's new connection. Its errors
// are not the connection's: on a Sentinel's connection, before Redis 6.0,
// or for an ACL without CLIENT TRACKING, no announcement comes.
func (f *follower) onConnect(ctx context.Context, cn *redis.Conn) error {
	if id, err := cn.ClientID(ctx).Result(); err == nil {
		_ = cn.Do(ctx, "CLIENT", "TRACKING", "ON", "REDIRECT", id, "BCAST", "PREFIX", f.l.key).Err()
	}
	return nil
}

// receive is ps.ReceiveTimeout, with a panic of go-redis's parser (its
// type assertions on what a hostile server sends) turned into an error.
func receive(ctx context.Context, ps *redis.PubSub, timeout time.Duration) (msg any, err error) {
	defer func() {
		if p := recover(); p != nil {
			msg, err = nil, fmt.Errorf("%w: a pub/sub message go-redis could not read: %v", errHostileReply, p)
		}
	}()
	return ps.ReceiveTimeout(ctx, timeout)
}
