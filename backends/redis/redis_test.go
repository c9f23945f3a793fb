package redis_test

import (
	"bytes"
	"context"
	"log/slog"
	"sync"
	"testing"
	"time"

	goredis "github.com/redis/go-redis/v9"

	"github.com/leaderrun/leaderrun/backends"
	"github.com/leaderrun/leaderrun/backends/backendtest"
	"github.com/leaderrun/leaderrun/backends/redis"
	"github.com/leaderrun/leaderrun/internal/testenv"
)

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
		{"OldReleaseValue", testOldReleaseValue},
		{"TokensAcrossDeletesByHand", testTokensAcrossDeletes},
		{"CounterDeletedByHand", testCounterDeletedByHand},
		{"LossByHand", testLossByHand},
		{"LossSeenAtOnce", testLossSeenAtOnce},
		{"RenewChecksValue", testRenewChecksValue},
		{"Status", testStatus},
		{"TryLeavesNoTrace", testTryLeavesNoTrace},
		{"DeadWaiterLeavesQueue", testDeadWaiterLeavesQueue},
		{"HundredWaiters", testHerd},
		{"DocumentsBounded", testDocumentsBounded},
		{"Unreachable", testUnreachable},
		{"Refused", testRefused},
		{"StalledLink", testStalledLink},
		{"HostileServer", testHostileServer},
		{"ACL", testACL},
	} {
		t.Run(tc.name, func(t *testing.T) { tc.run(t, e) })
	}
}

// newStore opens a store on e's server; cfg.URL defaults to the plain
// one, cfg.Prefix to prefix.
func newStore(t testing.TB, e *env, cfg redis.Config) *redis.Store {
	t.Helper()
	if cfg.URL == "" {
		cfg.URL = e.r.URL()
	}
	if cfg.Prefix == "" {
		cfg.Prefix = prefix
	}
	s, err := redis.New(cfg)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { s.Close() })
	return s
}

// timings are valid timings of a lease of lease, with retry as the retry
// period (at most 5/12 of the lease).
func timings(lease, retry time.Duration) backends.Timings {
	return backends.Timings{LeaseDuration: lease, RenewDeadline: lease / 2, KillGrace: lease / 4, RetryPeriod: retry}
}

// candidate is a campaign of id with timings tm.
func candidate(id string, tm backends.Timings) backends.Candidate {
	return backends.Candidate{Identity: id, Timings: tm}
}

// campaign wins lock in s as id, with a lease of 10 s, within 30 s; the
// lease is released when the test ends.
func campaign(t testing.TB, s backends.Store, lock, id string) *backends.Lease {
	t.Helper()
	return campaignWith(t, s, lock, candidate(id, timings(10*time.Second, 300*time.Millisecond)))
}

func campaignWith(t testing.TB, s backends.Store, lock string, c backends.Candidate) *backends.Lease {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	l, err := backends.Campaign(ctx, s, lock, c)
	if err != nil {
		t.Fatalf("%s: campaign: %v", c.Identity, err)
	}
	t.Cleanup(func() { l.Release(context.Background(), nil) })
	return l
}

var waitFor = backendtest.WaitFor

// conformance runs the suite with stores built by cfg, dropping a lease
// as an operator would: DEL of the lock's key.
func conformance(t *testing.T, e *env, cfg redis.Config) {
	cfg.Prefix = prefix
	backendtest.Run(t, backendtest.Harness{
		Open: func(t *testing.T) backends.Store {
			s, err := redis.New(cfg)
			if err != nil {
				t.Fatal(err)
			}
			return s
		},
		Drop: func(t *testing.T, lock string, _ *backends.Lease) {
			if n, err := e.admin.Del(context.Background(), prefix+lock).Result(); err != nil || n != 1 {
				t.Fatalf("DEL %s: %d, %v", prefix+lock, n, err)
			}
		},
	})
}

func testConformance(t *testing.T, e *env) { conformance(t, e, redis.Config{URL: e.r.URL()}) }

// testConformanceTLS: the same over rediss://, the server's certificate
// checked against the test's CA, the password from REDISCLI_AUTH's place
// in the configuration rather than the URL.
func testConformanceTLS(t *testing.T, e *env) {
	conformance(t, e, redis.Config{URL: "rediss://" + e.r.TLSAddr(), Password: password, TLS: e.r.TLSConfig(t)})
}

// testConformanceUnix: the same over the server's unix socket.
func testConformanceUnix(t *testing.T, e *env) {
	conformance(t, e, redis.Config{URL: "unix://:" + password + "@" + e.r.SocketPath()})
}

// logBuffer collects a store's or a campaign's log lines, debug ones too.
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

func (l *logBuffer) logger() *slog.Logger {
	return slog.New(slog.NewTextHandler(l, &slog.HandlerOptions{Level: slog.LevelDebug}))
}
