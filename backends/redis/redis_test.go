package redis_test

import (
	"context"
	"testing"
	"time"

	goredis "github.com/redis/go-redis/v9"

	"github.com/leaderrun/leaderrun/backends"
	"github.com/leaderrun/leaderrun/backends/backendtest"
	"github.com/leaderrun/leaderrun/backends/redis"
	"github.com/leaderrun/leaderrun/internal/testenv"
)

// redisLease is what the tests need of the backend's lease beyond
// backends.Lease.
type redisLease interface {
	backends.Lease
	Key() string
	Value() string
}

const (
	prefix   = "leaderrun-test/"
	password = "s3cret-Pa55-redis"
)

// env is the shared server (a password, AOF with appendfsync always, TLS
// beside plain TCP), and a client of its own that plays the operator.
type env struct {
	r     *testenv.Redis
	admin *goredis.Client
}

// TestRedis runs every test that needs one server against the same one;
// tests that restart, stop or replicate a server start their own.
func TestRedis(t *testing.T) {
	r := testenv.StartRedis(t, testenv.RedisOptions{Password: password, AOF: true, TLS: true})
	e := &env{r: r, admin: r.Client(t)}
	for _, tc := range []struct {
		name string
		run  func(*testing.T, *env)
	}{
		{"Conformance", testConformance},
		{"ConformanceTLS", testConformanceTLS},
		{"ConformanceUnixSocket", testConformanceUnix},
		{"TokensAcrossDeletesByHand", testTokensAcrossDeletes},
		{"CounterDeletedByHand", testCounterDeletedByHand},
		{"LossByHand", testLossByHand},
		{"LossSeenAtOnce", testLossSeenAtOnce},
		{"RenewChecksValue", testRenewChecksValue},
		{"Status", testStatus},
		{"TryLeavesNoTrace", testTryLeavesNoTrace},
		{"DeadWaiterLeavesQueue", testDeadWaiterLeavesQueue},
		{"HundredWaiters", testHerd},
		{"Unreachable", testUnreachable},
		{"Refused", testRefused},
		{"StalledLink", testStalledLink},
		{"HostileServer", testHostileServer},
		{"ACL", testACL},
	} {
		t.Run(tc.name, func(t *testing.T) { tc.run(t, e) })
	}
}

// newBackend returns a backend for lock on e's server; cfg.URL defaults
// to the plain one, cfg.Prefix to prefix.
func newBackend(t testing.TB, e *env, lock string, cfg redis.Config) *redis.Backend {
	t.Helper()
	cfg.Lock = lock
	if cfg.URL == "" {
		cfg.URL = e.r.URL()
	}
	if cfg.Prefix == "" {
		cfg.Prefix = prefix
	}
	b, err := redis.New(cfg)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { b.Close() })
	return b
}

func options(id string, lease time.Duration) backends.CampaignOptions {
	return backends.CampaignOptions{Identity: id, LeaseDuration: lease}
}

func campaign(t testing.TB, b backends.Backend, id string, lease time.Duration) redisLease {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	l, err := b.Campaign(ctx, options(id, lease))
	if err != nil {
		t.Fatalf("%s: campaign: %v", id, err)
	}
	t.Cleanup(func() { l.Release(context.Background(), nil) })
	return l.(redisLease)
}

var waitFor = backendtest.WaitFor

// conformance runs the suite with backends built by cfg, dropping a
// lease as an operator would: DEL of the lock's key.
func conformance(t *testing.T, e *env, cfg redis.Config) {
	backendtest.Run(t, backendtest.Harness{
		New: func(t *testing.T, lock string) backends.Backend {
			c := cfg
			c.Lock, c.Prefix = lock, prefix
			b, err := redis.New(c)
			if err != nil {
				t.Fatal(err)
			}
			return b
		},
		Drop: func(t *testing.T, l backends.Lease) {
			if n, err := e.admin.Del(context.Background(), l.(redisLease).Key()).Result(); err != nil || n != 1 {
				t.Fatalf("DEL %s: %d, %v", l.(redisLease).Key(), n, err)
			}
		},
		LeaseDuration: 10 * time.Second,
	})
}

func testConformance(t *testing.T, e *env) {
	conformance(t, e, redis.Config{URL: e.r.URL(), RetryPeriod: 500 * time.Millisecond})
}

// testConformanceTLS: the same over rediss://, the server's certificate
// checked against the test's CA, the password from REDISCLI_AUTH's place
// in the configuration rather than the URL.
func testConformanceTLS(t *testing.T, e *env) {
	conformance(t, e, redis.Config{URL: "rediss://" + e.r.TLSAddr(), Password: password,
		TLS: &redis.TLSFiles{CA: e.r.CAFile()}, RetryPeriod: 500 * time.Millisecond})
}

// testConformanceUnix: the same over the server's unix socket.
func testConformanceUnix(t *testing.T, e *env) {
	conformance(t, e, redis.Config{URL: "unix://:" + password + "@" + e.r.SocketPath(), RetryPeriod: 500 * time.Millisecond})
}
