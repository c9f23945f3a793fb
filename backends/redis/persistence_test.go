package redis_test

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/leaderrun/leaderrun/backends"
	"github.com/leaderrun/leaderrun/backends/redis"
	"github.com/leaderrun/leaderrun/internal/testenv"
)

// TestRedisRestartWithAOF: with appendonly yes and appendfsync always,
// the server forgets nothing it acknowledged, whether it is stopped (as
// an operator restarts it) or killed with SIGKILL: every token granted
// after the restart is greater than every one before, and a lease held
// across the restart is still the holder's, renewable, if the server is
// back within the lease.
func TestRedisRestartWithAOF(t *testing.T) {
	r := testenv.StartRedis(t, testenv.RedisOptions{Password: password, AOF: true})
	e := &env{r: r, admin: r.Client(t)}
	ctx := context.Background()
	s := newStore(t, e, redis.Config{})
	var last uint64
	grants := func(n int) {
		t.Helper()
		for range n {
			l := campaign(t, s, "aof", "a")
			if l.Token() <= last {
				t.Fatalf("token %d after %d", l.Token(), last)
			}
			last = l.Token()
			if err := l.Release(ctx, nil); err != nil {
				t.Fatal(err)
			}
		}
	}
	for _, restart := range []struct {
		name string
		do   func(testing.TB)
	}{{"SIGTERM", r.Restart}, {"SIGKILL", func(t testing.TB) { r.Kill(t); r.Start(t) }}} {
		grants(100)
		held := campaign(t, s, "aof", "holder")
		began := time.Now()
		restart.do(t)
		t.Logf("%s restart took %v", restart.name, time.Since(began).Round(time.Millisecond))
		// The pooled connections are dead. A renewal's one retry goes on
		// a new one, but the client library, after the dials that failed
		// while the server was down (the loss watcher's), may answer with
		// its last dial error for up to a second before it dials again:
		// renew as the runner does, every retry period (here 200 ms)
		// until the renew deadline (here 5 s), well within the lease.
		err := renewUntil(ctx, held, 5*time.Second, 200*time.Millisecond)
		if err != nil {
			t.Errorf("after a %s restart, the held lease cannot be renewed within 5s: %v\nserver log:\n%s", restart.name, err, r.Log())
		}
		if held.Token() <= last {
			t.Fatalf("token %d after %d", held.Token(), last)
		}
		last = held.Token()
		if err := held.Release(ctx, nil); err != nil {
			t.Fatal(err)
		}
		before := last
		grants(100)
		t.Logf("%s restart: tokens went on from %d to %d", restart.name, before, last)
	}
}

// TestRedisRestartWithoutPersistence shows the failure that the docs warn
// of: a server without an append-only file (or snapshots) forgets the
// counter when it restarts, and tokens start again at 1. The test pins
// the behaviour down so that the warning stays true.
func TestRedisRestartWithoutPersistence(t *testing.T) {
	r := testenv.StartRedis(t, testenv.RedisOptions{})
	e := &env{r: r, admin: r.Client(t)}
	ctx := context.Background()
	s := newStore(t, e, redis.Config{})
	var last uint64
	for range 10 {
		l := campaign(t, s, "volatile", "a")
		last = l.Token()
		l.Release(ctx, nil)
	}
	r.Restart(t)
	if l := campaign(t, s, "volatile", "a"); l.Token() != 1 {
		t.Errorf("after a restart without persistence the token is %d (before: %d); the docs say it starts again at 1", l.Token(), last)
	}
}

// renewUntil renews l every retry until it succeeds, the lease is lost,
// or deadline has passed, as the runner's renewal loop does.
func renewUntil(ctx context.Context, l *backends.Lease, deadline, retry time.Duration) error {
	end := time.Now().Add(deadline)
	tick := time.NewTicker(retry)
	defer tick.Stop()
	for {
		rctx, cancel := context.WithDeadline(ctx, end)
		err := l.Renew(rctx)
		cancel()
		if err == nil || errors.Is(err, backends.ErrLeaseLost) || !time.Now().Before(end) {
			return err
		}
		<-tick.C
	}
}
