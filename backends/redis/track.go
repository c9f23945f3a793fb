package redis

import (
	"context"
	"errors"
	"net"
	"slices"
	"sync"
	"sync/atomic"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/leaderrun/leaderrun/backends"
)

// A lease hears of a change of its key through Redis's client tracking,
// which is on in every Redis since 6.0 and needs no server setting: the
// tracker's connection of its own turns on broadcast tracking of every
// key that starts with the lock's key, redirected to itself
// (CLIENT TRACKING ON REDIRECT <its id> BCAST PREFIX <key>), and
// subscribes to __redis__:invalidate, where Redis announces each key
// that changed (written, deleted, expired, or flushed) as soon as it
// changed. The lease then reads its key: an announcement is a hint, the
// key is the truth. The queue's keys do not start with the lock's key, so
// waiters' heartbeats are not announced to the leader.
//
// The tracker proves that announcements arrive before it relies on them:
// it writes a probe key under the prefix (<key>:probe, expiring in 2 s)
// and waits for its announcement, each time it (re)subscribes. Until then,
// or if none comes (tracking refused by the server or by the user's ACL,
// a proxy that does not pass pub/sub), the lease reads its key every
// lossCheck.

const (
	// invalidations is the channel of tracking's announcements.
	invalidations = "__redis__:invalidate"
	// probeTimeout is how long the tracker waits for its probe's
	// announcement.
	probeTimeout = 2 * time.Second
)

// tracker is one lease's tracking connection; run owns it.
type tracker struct {
	b      *Backend
	poke   func() // the lease checks its key; never blocks
	probe  string // the probe key
	live   atomic.Bool
	cancel context.CancelFunc
	done   chan struct{}

	mu sync.Mutex
	ps *redis.PubSub // closed by close, to end a receive in progress

	logOnce sync.Once
}

// startTracker starts tracking b's key for a lease that poke checks.
func (b *Backend) startTracker(poke func()) *tracker {
	ctx, cancel := context.WithCancel(context.Background())
	t := &tracker{b: b, poke: poke, probe: b.key + ":probe", cancel: cancel, done: make(chan struct{})}
	go t.run(ctx)
	return t
}

// tracking reports whether announcements are proved to arrive.
func (t *tracker) tracking() bool { return t.live.Load() }

// close stops the tracker and waits for it.
func (t *tracker) close() {
	t.cancel()
	t.mu.Lock()
	if t.ps != nil {
		_ = t.ps.Close()
	}
	t.mu.Unlock()
	<-t.done
}

// onConnect turns tracking on for a new connection, redirected to
// itself. Errors are not the connection's: on a Sentinel's connection,
// on a server before 6.0, or for a user whose ACL does not allow CLIENT
// TRACKING it fails, and the probe tells.
func (t *tracker) onConnect(ctx context.Context, cn *redis.Conn) error {
	id, err := cn.ClientID(ctx).Result()
	if err == nil {
		_ = cn.Do(ctx, "CLIENT", "TRACKING", "ON", "REDIRECT", id, "BCAST", "PREFIX", t.b.key).Err()
	}
	return nil
}

func (t *tracker) run(ctx context.Context) {
	defer close(t.done)
	c := t.b.tracker(t.onConnect)
	defer c.Close()
	ps := c.Subscribe(ctx, invalidations)
	defer ps.Close()
	t.mu.Lock()
	t.ps = ps
	t.mu.Unlock()
	var (
		backoff backends.Backoff
		pr      probe
	)
	for {
		wait := pubsubPing
		if !pr.at.IsZero() {
			wait = max(time.Until(pr.at.Add(probeTimeout)), time.Millisecond)
		}
		msg, err := receive(ctx, ps, wait)
		if ctx.Err() != nil {
			return
		}
		t.handle(ctx, msg, &pr)
		var ne net.Error
		switch {
		case err == nil:
			backoff.Reset()
		case errors.Is(err, errHostileReply):
			t.live.Store(false)
			t.logMode(err)
			return
		case errors.As(err, &ne) && ne.Timeout():
			if pr.at.IsZero() {
				_ = ps.Ping(ctx) // idle: is the connection still there?
			}
		default:
			// A FLUSHALL is announced without keys (go-redis calls that
			// an error), or the connection broke: either way, look.
			t.live.Store(false)
			t.poke()
			if backoff.Sleep(ctx) != nil {
				return
			}
		}
		t.expire(ctx, &pr)
	}
}

// probe is the tracker's pending probe.
type probe struct {
	at time.Time // when it was written; zero: none pending
	n  int       // probes written since the last subscription
}

// handle acts on one message of the tracking connection.
func (t *tracker) handle(ctx context.Context, msg any, pr *probe) {
	switch m := msg.(type) {
	case *redis.Subscription:
		// (Re)subscribed, tracking (re)enabled or not: until the probe
		// comes back, the lease reads its key as it polls, and once now
		// for what it may have missed.
		t.live.Store(false)
		t.poke()
		*pr = probe{at: t.writeProbe(ctx), n: 1}
	case *redis.Message:
		keys := m.PayloadSlice
		if m.Payload != "" {
			keys = append(keys, m.Payload)
		}
		if !pr.at.IsZero() && slices.Contains(keys, t.probe) {
			pr.at = time.Time{}
			t.live.Store(true)
			t.logMode(nil)
		}
		if slices.Contains(keys, t.b.key) {
			t.poke()
		}
	}
}

// expire gives up on a probe whose announcement did not come in time: a
// write may have failed, or an announcement been lost to a reconnection,
// so it writes another, three in all per subscription.
func (t *tracker) expire(ctx context.Context, pr *probe) {
	if pr.at.IsZero() || time.Since(pr.at) < probeTimeout {
		return
	}
	if pr.n < 3 {
		pr.at, pr.n = t.writeProbe(ctx), pr.n+1
		return
	}
	pr.at = time.Time{}
	t.logMode(errors.New("the announcement of a probe key's change did not arrive " +
		"(CLIENT TRACKING refused by the server or the ACL, or pub/sub not passed through)"))
}

// writeProbe writes the probe key, whose announcement proves that
// tracking works, and returns when. A write that failed counts as one
// whose announcement never came.
func (t *tracker) writeProbe(ctx context.Context) time.Time {
	ctx, cancel := context.WithTimeout(ctx, requestTimeout)
	defer cancel()
	at := time.Now()
	_ = t.b.c.Set(ctx, t.probe, "1", probeTimeout).Err()
	return at
}

// logMode says once whether the lease hears of changes at once or polls.
func (t *tracker) logMode(err error) {
	t.logOnce.Do(func() {
		if err == nil {
			t.b.log.Debug("redis: tracking the lock's key: a change is seen at once")
			return
		}
		t.b.log.Info("redis: polling the lock's key: a change is seen within the poll interval", "poll_interval", lossCheck,
			"reason", t.b.redact(err))
	})
}
