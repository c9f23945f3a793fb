package redis_test

import (
	"context"
	"errors"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/leaderrun/leaderrun/backends"
	"github.com/leaderrun/leaderrun/backends/redis"
	"github.com/leaderrun/leaderrun/internal/testenv"
)

const master = "leaderrun-test"

// TestRedisSentinel: one primary, one replica, one Sentinel on loopback;
// leaderrun finds the primary through the Sentinel.
//
//   - With MinReplicas 1, Campaign hands the lease over only once the
//     replica acknowledged the grant: right after it returns, the replica
//     holds the lock's value and the token counter. Renewals wait for the
//     replica too (their cost is logged).
//   - With the replica stopped, no grant is handed over (the candidate
//     gives each up and tries again, saying why), a --try fails, and a
//     held lease's renewals fail (not a loss: the runner's deadline stops
//     the child).
//   - With MinReplicas 0 and a replica connected, the store logs once
//     what asynchronous replication risks.
//   - Killing the primary makes the Sentinel promote the replica, which
//     has every grant the replica acknowledged: a candidate waiting
//     through the failover is granted a greater token.
func TestRedisSentinel(t *testing.T) {
	primary := testenv.StartRedis(t, testenv.RedisOptions{Password: password, AOF: true})
	replica := testenv.StartRedis(t, testenv.RedisOptions{Password: password, AOF: true, ReplicaOf: primary})
	testenv.WaitReplicaSynced(t, replica)
	sentinel := testenv.StartSentinel(t, primary, master)
	onPrimary, onReplica := primary.Client(t), replica.Client(t)
	ctx := context.Background()
	tm := timings(10*time.Second, 300*time.Millisecond)
	sentinelStore := func(minReplicas int, log *logBuffer) *redis.Store {
		cfg := redis.Config{URL: "redis://:" + password + "@", SentinelMaster: master, Sentinels: []string{sentinel.Addr()},
			Prefix: prefix, MinReplicas: minReplicas}
		if log != nil {
			cfg.Log = log.logger()
		}
		s, err := redis.New(cfg)
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { s.Close() })
		return s
	}
	// replicated checks that the replica holds the lock's value and
	// token counter as the primary does.
	replicated := func(when, lock string, token uint64) {
		t.Helper()
		v, err := onPrimary.Get(ctx, prefix+lock).Result()
		if r, rerr := onReplica.Get(ctx, prefix+lock).Result(); err != nil || rerr != nil || r != v {
			t.Errorf("%s the replica holds %q (%v), want the lock's value %q (%v)", when, r, rerr, v, err)
		}
		if n, err := onReplica.Get(ctx, prefix+lock+":token").Uint64(); err != nil || n != token {
			t.Errorf("%s the replica's token counter is %d (%v), want %d", when, n, err, token)
		}
	}

	// MinReplicas 1, the replica up.
	s := sentinelStore(1, nil)
	l := campaignWith(t, s, "replicated", candidate("a", tm))
	replicated("right after the grant", "replicated", l.Token())
	lp := campaignWith(t, sentinelStore(0, nil), "unreplicated", candidate("a", tm))
	renewals := func(l *backends.Lease) time.Duration {
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
	var log logBuffer
	c := candidate("b", tm)
	c.Log = log.logger()
	wctx, cancel := context.WithTimeout(ctx, 3*time.Second)
	refused, err := backends.Campaign(wctx, s, "replicated", c)
	cancel()
	if err == nil {
		refused.Release(ctx, nil)
		t.Fatal("a grant was handed over with the only replica stopped and MinReplicas 1")
	}
	if !errors.Is(err, context.DeadlineExceeded) {
		t.Errorf("campaign with the replica stopped: %v, want it still trying when its context ended", err)
	}
	if !strings.Contains(log.String(), "not starting the command") || !strings.Contains(log.String(), "0 of the 1 replicas") {
		t.Errorf("the campaign did not log the refused grant:\n%s", log.String())
	}
	c.Try, c.Log = true, nil
	if _, err := backends.Campaign(ctx, s, "replicated", c); !errors.Is(err, backends.ErrUnavailable) || !strings.Contains(err.Error(), "replicas") {
		t.Errorf("--try with the replica stopped: %v, want ErrUnavailable about replicas", err)
	}
	if n, _ := onPrimary.Exists(ctx, prefix+"replicated").Result(); n != 0 {
		t.Errorf("a refused grant was left in place")
	}

	// The replica is back: grants are handed over again.
	replica.Start(t)
	testenv.WaitReplicaSynced(t, replica)
	l = campaignWith(t, s, "replicated", candidate("c", tm))
	replicated("after the replica came back,", "replicated", l.Token())
	last := l.Token()
	l.Release(ctx, nil)

	// MinReplicas 0 with a replica connected: one warning.
	var warned logBuffer
	w := sentinelStore(0, &warned)
	campaignWith(t, w, "warned", candidate("a", tm)).Release(ctx, nil)
	campaignWith(t, w, "warned", candidate("a", tm)).Release(ctx, nil)
	w.Close()
	if n := strings.Count(warned.String(), "the server has replicas, and --redis-min-replicas is 0"); n != 1 {
		t.Errorf("the replica warning was logged %d times, want once:\n%s", n, warned.String())
	}

	// Failover: the primary dies, the Sentinel promotes the replica; a
	// candidate retries through it.
	primary.Kill(t)
	killed := time.Now()
	fctx, cancel := context.WithTimeout(ctx, 30*time.Second)
	defer cancel()
	fl, err := backends.Campaign(fctx, sentinelStore(0, nil), "replicated", candidate("d", tm))
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
