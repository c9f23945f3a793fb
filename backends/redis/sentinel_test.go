package redis_test

import (
	"bytes"
	"context"
	"errors"
	"log/slog"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/leaderrun/leaderrun/backends"
	"github.com/leaderrun/leaderrun/backends/redis"
	"github.com/leaderrun/leaderrun/internal/testenv"
)

// logBuffer collects a backend's log lines.
type logBuffer struct {
	mu sync.Mutex
	b  bytes.Buffer
}

func (l *logBuffer) Write(p []byte) (int, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.b.Write(p)
}

func (l *logBuffer) String() string {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.b.String()
}

func (l *logBuffer) logger() *slog.Logger { return slog.New(slog.NewTextHandler(l, nil)) }

const master = "leaderrun-test"

// TestRedisSentinel: one primary, one replica, one Sentinel on loopback;
// leaderrun finds the primary through the Sentinel.
//
//   - With MinReplicas 1, Campaign hands the lease over only once the
//     replica acknowledged the grant: right after it returns, the replica
//     holds the lock's value and the token counter. Renewals wait for the
//     replica too (their cost is logged).
//   - With the replica stopped, no grant is handed over (the candidate
//     gives each up and waits again), and a held lease's renewals fail
//     (not a loss: the runner's deadline stops the child).
//   - With MinReplicas 0 and a replica connected, the backend logs once
//     what asynchronous replication risks.
//   - Killing the primary makes the Sentinel promote the replica, which
//     has every grant the replica acknowledged: tokens go on.
func TestRedisSentinel(t *testing.T) {
	primary := testenv.StartRedis(t, testenv.RedisOptions{Password: password, AOF: true})
	replica := testenv.StartRedis(t, testenv.RedisOptions{Password: password, AOF: true, ReplicaOf: primary})
	testenv.WaitReplicaSynced(t, replica)
	sentinel := testenv.StartSentinel(t, primary, master)
	onReplica := replica.Client(t)
	ctx := context.Background()
	const retry = 300 * time.Millisecond
	sentinelBackend := func(lock string, minReplicas int, log *logBuffer) *redis.Backend {
		cfg := redis.Config{URL: "redis://:" + password + "@", SentinelMaster: master, Sentinels: []string{sentinel.Addr()},
			Prefix: prefix, Lock: lock, MinReplicas: minReplicas, RetryPeriod: retry}
		if log != nil {
			cfg.Log = log.logger()
		}
		b, err := redis.New(cfg)
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { b.Close() })
		return b
	}

	// MinReplicas 1, the replica up.
	var log logBuffer
	b := sentinelBackend("replicated", 1, &log)
	l := campaign(t, b, "a", 10*time.Second)
	if v, err := onReplica.Get(ctx, l.Key()).Result(); err != nil || v != l.Value() {
		t.Errorf("right after the grant the replica holds %q (%v), want the lock's value %q", v, err, l.Value())
	}
	if n, err := onReplica.Get(ctx, l.Key()+":token").Uint64(); err != nil || n != l.Token() {
		t.Errorf("right after the grant the replica's token counter is %d (%v), want %d", n, err, l.Token())
	}
	plain := sentinelBackend("unreplicated", 0, nil)
	lp := campaign(t, plain, "a", 10*time.Second)
	renewals := func(l backends.Lease) time.Duration {
		var ds []time.Duration
		for range 50 {
			start := time.Now()
			if err := l.Renew(ctx); err != nil {
				t.Fatal(err)
			}
			ds = append(ds, time.Since(start))
		}
		slices.Sort(ds)
		return ds[len(ds)/2]
	}
	withWait, without := renewals(l), renewals(lp)
	t.Logf("renewal p50: %v with WAIT 1 (--redis-min-replicas 1), %v without", withWait.Round(time.Microsecond), without.Round(time.Microsecond))
	lp.Release(ctx, nil)

	// The replica stops: the held lease's renewals fail, and no new
	// grant is handed over.
	replica.Stop(t)
	err := l.Renew(ctx)
	if err == nil || errors.Is(err, backends.ErrLeaseLost) || !strings.Contains(err.Error(), "0 of the 1 replicas") {
		t.Errorf("renewal with the replica stopped: %v, want an error (not a loss) saying 0 of 1 replicas acknowledged", err)
	}
	if err := l.Release(ctx, nil); err != nil {
		t.Fatal(err)
	}
	wctx, cancel := context.WithTimeout(ctx, 3*time.Second)
	refused, err := b.Campaign(wctx, options("b", 10*time.Second))
	cancel()
	if err == nil {
		refused.Release(ctx, nil)
		t.Fatal("a grant was handed over with the only replica stopped and MinReplicas 1")
	}
	if !errors.Is(err, context.DeadlineExceeded) {
		t.Errorf("campaign with the replica stopped: %v, want it still waiting when its context ended", err)
	}
	if !strings.Contains(log.String(), "not starting the command") {
		t.Errorf("the backend did not log the refused grant:\n%s", log.String())
	}
	try := options("b", 10*time.Second)
	try.Try = true
	if _, err := b.Campaign(ctx, try); !errors.Is(err, backends.ErrUnavailable) || !strings.Contains(err.Error(), "replicas") {
		t.Errorf("--try with the replica stopped: %v, want ErrUnavailable about replicas", err)
	}
	if n, _ := primary.Client(t).Exists(ctx, prefix+"replicated").Result(); n != 0 {
		t.Errorf("a refused grant was left in place")
	}

	// The replica is back: grants are handed over again.
	replica.Start(t)
	testenv.WaitReplicaSynced(t, replica)
	l = campaign(t, b, "c", 10*time.Second)
	if v, err := onReplica.Get(ctx, l.Key()).Result(); err != nil || v != l.Value() {
		t.Errorf("after the replica came back, it holds %q (%v), want %q", v, err, l.Value())
	}
	last := l.Token()
	l.Release(ctx, nil)

	// MinReplicas 0 with a replica connected: one warning.
	var warned logBuffer
	w := sentinelBackend("warned", 0, &warned)
	campaign(t, w, "a", 10*time.Second).Release(ctx, nil)
	campaign(t, w, "a", 10*time.Second).Release(ctx, nil)
	w.Close()
	if n := strings.Count(warned.String(), "the server has replicas, and --redis-min-replicas is 0"); n != 1 {
		t.Errorf("the replica warning was logged %d times, want once:\n%s", n, warned.String())
	}

	// Failover: the primary dies, the Sentinel promotes the replica.
	primary.Kill(t)
	killed := time.Now()
	after := sentinelBackend("replicated", 0, nil)
	fctx, cancel := context.WithTimeout(ctx, 30*time.Second)
	defer cancel()
	var fl backends.Lease
	for {
		fl, err = after.Campaign(fctx, options("d", 10*time.Second))
		if err == nil || fctx.Err() != nil {
			break
		}
		time.Sleep(100 * time.Millisecond) // the Sentinel takes down-after-milliseconds and an election
	}
	if err != nil {
		t.Fatalf("no grant on the promoted replica: %v", err)
	}
	t.Logf("granted on the promoted replica %v after the primary's kill, token %d (last before: %d)",
		time.Since(killed).Round(time.Millisecond), fl.Token(), last)
	if fl.Token() <= last {
		t.Errorf("token %d on the promoted replica, not greater than %d", fl.Token(), last)
	}
	fl.Release(ctx, nil)
}
