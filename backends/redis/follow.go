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
	// lossCheck is how often a holder has its key read while Redis is
	// not known to announce its changes.
	lossCheck = 500 * time.Millisecond
)

// Follow implements backends.RecordLock.
//
// A waiter (held nil) joins the queue of waiters and listens on its own
// wake channel, <key>:wake:<nonce>; only the first live waiter is woken
// when the lock frees, and only it times the holder's lease (Behind).
// Every retry period (jittered) it refreshes its liveness deadline, which
// is when a waiter that died leaves the queue, and learns whether it
// became first; without a confirmed subscription (a proxy without
// pub/sub, a connection down) it then looks at the lock, too.
//
// A holder hears of every change of its key through client tracking,
// which needs no server setting: a connection of its own turns on
// broadcast tracking of the keys that start with the lock's key,
// redirected to itself, and subscribes to __redis__:invalidate, where
// Redis announces a key as soon as it is written, deleted, expired or
// flushed; the driver then reads the key. Until an announcement of the
// key (each renewal makes one) proves that this works, and where it does
// not (a server before 6.0, an ACL without CLIENT TRACKING, a proxy
// without pub/sub), the key is read every lossCheck.
//
// With Config.MinReplicas, a holder's grant is first renewed and WAITed
// for (Keep): the driver follows every grant before it hands it out, a
// Take or one whose answer was lost, and frees one that fails here.
func (l *lock) Follow(ctx context.Context, c backends.Claim, held *backends.Record) (backends.Follower, error) {
	l.s.startChecks()
	f := &follower{l: l, claim: c, ch: make(chan struct{}, 1), done: make(chan struct{}), since: time.Now()}
	var rctx context.Context
	rctx, f.cancel = context.WithCancel(context.Background())
	if held != nil {
		if l.s.minRepl > 0 {
			if _, err := l.Keep(ctx, *held); err != nil {
				return nil, fmt.Errorf("not starting the command: %w", err)
			}
		}
		f.client = l.s.open(1, f.onConnect)
		f.ps = f.client.Subscribe(rctx, "__redis__:invalidate")
		go f.run(rctx, lossCheck)
		return f, nil
	}
	if err := f.queue(ctx); err != nil {
		return nil, err
	}
	channel := l.wakePrefix() + c.Owner
	f.ps = l.s.c.Subscribe(rctx, channel)
	// Confirmed before the driver reads the lock again, so that a
	// release after that read wakes it.
	msg, err := receive(ctx, f.ps, c.Timings.AttemptTimeout())
	if _, ok := msg.(*redis.Subscription); !ok && err == nil {
		err = fmt.Errorf("unexpected %T before the subscription", msg)
	}
	if f.listening = err == nil; err != nil {
		l.s.log.Info("redis: could not subscribe to the wake channel; looking every retry period until it works",
			"lock", l.name, "channel", channel, "err", l.s.redact(err))
	}
	go f.run(rctx, 0)
	return f, nil
}

// follower is a waiter's place in the queue (client nil) or a holder's
// tracking of its key; run owns its pub/sub connection.
type follower struct {
	l      *lock
	claim  backends.Claim
	ch     chan struct{}
	behind atomic.Bool // a waiter: another live waiter is first
	cancel context.CancelFunc
	done   chan struct{}
	ps     *redis.PubSub
	client *redis.Client // a holder's tracking client

	// Owned by run: a waiter's subscription is confirmed; a holder's
	// tracking is proved, and since when it is not.
	listening, live bool
	since           time.Time
	logOnce         sync.Once
}

func (f *follower) Changed() <-chan struct{} { return f.ch }
func (f *follower) Behind() bool             { return f.behind.Load() }

func (f *follower) poke() {
	if f.client == nil {
		f.l.s.woken.Add(1)
	}
	select {
	case f.ch <- struct{}{}:
	default:
	}
}

// Close implements backends.Follower. A waiter leaves the queue, and
// wakes the next one if the lock is free; if the server cannot be
// reached, the others drop it when its liveness deadline passes.
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

// run pokes for what its connection hears, and ticks every period: a
// waiter's heartbeat (period 0: the retry period, jittered down by up to
// a quarter so that waiters do not march in step) or a holder's look at
// its key while tracking is not proved.
func (f *follower) run(ctx context.Context, period time.Duration) {
	defer close(f.done)
	every := func() time.Duration {
		if period > 0 {
			return period
		}
		p := f.claim.Timings.RetryPeriod
		return p - time.Duration(rand.Int64N(int64(p/4)+1))
	}
	next, heard := time.Now().Add(every()), time.Now()
	for {
		msg, err := receive(ctx, f.ps, max(time.Until(next), time.Millisecond))
		if ctx.Err() != nil {
			return
		}
		f.hear(msg)
		var ne net.Error
		switch {
		case err == nil:
			heard = time.Now()
		case errors.As(err, &ne) && ne.Timeout():
			if time.Since(heard) > pubsubPing {
				_, heard = f.ps.Ping(ctx), time.Now()
			}
		default:
			// Broken, closed by the guard, or a FLUSHALL announced
			// without keys (go-redis calls that an error): look, and
			// wait for go-redis to reconnect on the next receive.
			f.listening, f.live = false, false
			f.poke()
			sleep(ctx, time.Until(next))
		}
		if !time.Now().Before(next) {
			f.tick(ctx)
			next = time.Now().Add(every())
		}
	}
}

// hear acts on one message of the connection.
func (f *follower) hear(msg any) {
	switch m := msg.(type) {
	case *redis.Subscription:
		// (Re)subscribed: what was sent meanwhile is lost. Look.
		f.listening, f.live, f.since = true, false, time.Now()
		f.poke()
	case *redis.Message:
		if f.client == nil {
			f.poke()
		} else if slices.Contains(m.PayloadSlice, f.l.key) || m.Payload == f.l.key {
			f.live = true
			f.logMode(nil)
			f.poke()
		}
	}
}

func (f *follower) tick(ctx context.Context) {
	if f.client == nil {
		qctx, cancel := context.WithTimeout(ctx, f.claim.Timings.AttemptTimeout())
		defer cancel()
		_ = f.queue(qctx)
		return
	}
	if !f.live {
		f.poke()
		// Renewals come every retry period, and each is announced.
		if time.Since(f.since) > 2*f.claim.Timings.RetryPeriod+time.Second {
			f.logMode(errors.New("no change of the key was announced " +
				"(CLIENT TRACKING refused by the server or the ACL, or pub/sub not passed through)"))
		}
	}
}

// queue joins the queue or refreshes the waiter's deadline there, and
// reads its place. It wakes the driver when the waiter became first (to
// time the holder), is first while the lock is free (its wake-up may
// have been lost), or has no confirmed subscription (it polls).
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
	was := f.behind.Swap(res[0] != 0)
	if res[0] == 0 && (was || res[1] == 1) || f.ps != nil && !f.listening {
		f.poke()
	}
	return nil
}

// onConnect turns tracking on for a holder's new connection, redirected
// to itself. Errors are not the connection's: on a Sentinel's connection,
// on a server before 6.0, or for a user whose ACL does not allow CLIENT
// TRACKING it fails, and no announcement comes.
func (f *follower) onConnect(ctx context.Context, cn *redis.Conn) error {
	if id, err := cn.ClientID(ctx).Result(); err == nil {
		_ = cn.Do(ctx, "CLIENT", "TRACKING", "ON", "REDIRECT", id, "BCAST", "PREFIX", f.l.key).Err()
	}
	return nil
}

// logMode says once whether the holder hears of changes at once or polls.
func (f *follower) logMode(err error) {
	f.logOnce.Do(func() {
		if err == nil {
			f.l.s.log.Debug("redis: tracking the lock's key: a change is seen at once", "lock", f.l.name)
			return
		}
		f.l.s.log.Info("redis: polling the lock's key: a change is seen within the poll interval", "lock", f.l.name,
			"poll_interval", lossCheck, "reason", f.l.s.redact(err))
	})
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

// sleep waits d, or until ctx ends.
func sleep(ctx context.Context, d time.Duration) {
	t := time.NewTimer(max(d, 0))
	defer t.Stop()
	select {
	case <-ctx.Done():
	case <-t.C:
	}
}
