package zookeeper_test

import (
	"context"
	"errors"
	"log/slog"
	"strings"
	"testing"
	"time"

	"github.com/go-zookeeper/zk"

	"github.com/leaderrun/leaderrun/backends"
	"github.com/leaderrun/leaderrun/backends/backendtest"
	"github.com/leaderrun/leaderrun/backends/zookeeper"
	"github.com/leaderrun/leaderrun/internal/testenv"
)

// zkGrant is what the tests need of the store's grant beyond
// backends.Grant.
type zkGrant interface {
	backends.Grant
	Path() string
	SessionID() int64
	SessionTimeout() time.Duration
	Server() string
}

// lease is a lease the driver handed out, and the store's grant under it.
type lease struct {
	*backends.Lease
	g zkGrant
}

func (l lease) Path() string                  { return l.g.Path() }
func (l lease) SessionID() int64              { return l.g.SessionID() }
func (l lease) SessionTimeout() time.Duration { return l.g.SessionTimeout() }
func (l lease) Server() string                { return l.g.Server() }

const prefix = "leaderrun-test/"

// TestZooKeeper runs every test that needs one standalone server against
// the same one: a JVM takes a second or more to start.
func TestZooKeeper(t *testing.T) {
	z := testenv.StartZooKeeper(t, 1)
	store := &env{zk: z, servers: z.Servers(), admin: adminClient(t, z.Servers())}
	for _, tc := range []struct {
		name string
		run  func(*testing.T, *env)
	}{
		{"Conformance", testConformance},
		{"NegotiatedTimeout", testNegotiatedTimeout},
		{"ZnodeDeletedByHand", testZnodeDeleted},
		{"HandoversAcrossDeleteAll", testHandovers},
		{"MiddleWaiterWithdraws", testMiddleWithdraws},
		{"SessionDies", testSessionDies},
		{"DisconnectIsNotLoss", testDisconnect},
		{"TwoHundredWaiters", testHerd},
		{"DigestAuthAndACLs", testAuth},
		{"Unreachable", testUnreachable},
		{"SilentServer", testSilentServer},
		{"TryLeavesNoTrace", testTryLeavesNoTrace},
		{"LostCreateAnswer", testLostCreateAnswer},
		{"SequenceWrapped", testSequenceWrapped},
		{"GhostGoesWithRelease", testGhostAtRelease},
		{"DocumentsAreNotCandidates", testDocumentsNotCandidates},
		{"Documents", testDocuments},
		{"OlderRelease", testOlderRelease},
		{"ReaderClosesWhenIdle", testReaderIdle},
		{"RequestRates", testRates},
	} {
		t.Run(tc.name, func(t *testing.T) { tc.run(t, store) })
	}
}

// env is the shared server, and a client of its own that plays the
// operator or another host.
type env struct {
	zk      *testenv.ZooKeeper
	servers []string
	admin   *zk.Conn
}

type silent struct{}

func (silent) Printf(string, ...any) {}

// adminClient is a plain client of the library, without credentials.
func adminClient(t *testing.T, servers []string) *zk.Conn {
	t.Helper()
	c, _, err := zk.Connect(servers, 10*time.Second, zk.WithLogger(silent{}), zk.WithLogInfo(false))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(c.Close)
	return c
}

func openStore(t *testing.T, servers []string, edit ...func(*zookeeper.Config)) *zookeeper.Store {
	t.Helper()
	cfg := zookeeper.Config{Servers: servers, Prefix: prefix, ConnectTimeout: 2 * time.Second}
	for _, e := range edit {
		e(&cfg)
	}
	s, err := zookeeper.Open(cfg)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { s.Close() })
	return s
}

// candidate is a campaign's candidate whose session timeout is d. No
// retry period: the TTL then leaves out the library's ping interval, as
// it must for the tests that renew seldom or never.
func candidate(id string, d time.Duration) backends.Candidate {
	return backends.Candidate{Identity: id, Timings: backends.Timings{LeaseDuration: d}, Log: slog.New(slog.DiscardHandler)}
}

// campaignFor campaigns for lock in s and returns the lease, or the error.
func campaignFor(ctx context.Context, s backends.Store, lock string, c backends.Candidate) (lease, error) {
	l, err := backends.Campaign(ctx, s, lock, c)
	if err != nil {
		return lease{}, err
	}
	return lease{l, l.Grant().(zkGrant)}, nil
}

// campaign campaigns for lock as id, and fails the test if that does not
// succeed within 30 s; the lease is released when the test ends.
func campaign(t *testing.T, s backends.Store, lock, id string, d time.Duration) lease {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	l, err := campaignFor(ctx, s, lock, candidate(id, d))
	if err != nil {
		t.Fatalf("%s: campaign: %v", id, err)
	}
	t.Cleanup(func() { l.Release(context.Background(), nil) })
	return l
}

func status(t *testing.T, s backends.Store, lock string) backends.Status {
	t.Helper()
	st, err := backends.ReadStatus(context.Background(), s, lock)
	if err != nil {
		t.Fatalf("status of %s: %v", lock, err)
	}
	return st
}

var waitFor = backendtest.WaitFor

func testConformance(t *testing.T, env *env) {
	backendtest.Run(t, backendtest.Harness{
		Open: func(t *testing.T) backends.Store {
			s, err := zookeeper.Open(zookeeper.Config{Servers: env.servers, Prefix: prefix})
			if err != nil {
				t.Fatal(err)
			}
			return s
		},
		// An operator deleting the leader's znode: the session lives
		// on, the lease does not.
		Drop: func(t *testing.T, _ string, l *backends.Lease) {
			if err := env.admin.Delete(l.Grant().(zkGrant).Path(), -1); err != nil {
				t.Fatal(err)
			}
		},
	})
}

// testNegotiatedTimeout: the ensemble clamps the session timeout to its
// bounds; the grant reports what it negotiated, and a TTL that leaves out
// how much earlier an ensemble may expire the session (the retry period,
// or the library's ping interval of a third of the timeout, and half a
// tick, a quarter of the minimum session timeout).
func testNegotiatedTimeout(t *testing.T, env *env) {
	quarterMin := testenv.ZooKeeperMinSessionTimeout / 4
	s := openStore(t, env.servers)
	for _, tc := range []struct {
		name             string
		ask, retry       time.Duration
		session, wantTTL time.Duration
	}{
		{"within the bounds", 3 * time.Second, 0, 3 * time.Second, 2*time.Second - quarterMin},
		{"renewed more often than pinged", 3 * time.Second, 500 * time.Millisecond, 3 * time.Second, 2500*time.Millisecond - quarterMin},
		{"renewed less often than pinged", 3 * time.Second, 2 * time.Second, 3 * time.Second, 2*time.Second - quarterMin},
		{"raised to the minimum", 100 * time.Millisecond, 0, testenv.ZooKeeperMinSessionTimeout,
			testenv.ZooKeeperMinSessionTimeout - testenv.ZooKeeperMinSessionTimeout/3 - quarterMin},
		{"lowered to the maximum", 2 * testenv.ZooKeeperMaxSessionTimeout, 2 * time.Second, testenv.ZooKeeperMaxSessionTimeout,
			testenv.ZooKeeperMaxSessionTimeout - 2*time.Second - quarterMin},
	} {
		t.Run(tc.name, func(t *testing.T) {
			lock := "ttl-" + strings.ReplaceAll(tc.name, " ", "-")
			c := candidate("a", tc.ask)
			c.Timings.RetryPeriod = tc.retry
			l, err := campaignFor(context.Background(), s, lock, c)
			if err != nil {
				t.Fatal(err)
			}
			defer l.Release(context.Background(), nil)
			if l.SessionTimeout() != tc.session || l.TTL() != tc.wantTTL {
				t.Errorf("asked %v, retry %v: session timeout %v, TTL %v; want %v and %v",
					tc.ask, tc.retry, l.SessionTimeout(), l.TTL(), tc.session, tc.wantTTL)
			}
			if st := status(t, s, lock); !st.Held || st.Remaining != -1 {
				t.Errorf("status %+v, want held with remaining -1 (ZooKeeper does not tell)", st)
			}
		})
	}
}

// testZnodeDeleted: deleting the leader's znode by hand (its session
// alive) is a loss, reported at once; Renew and Complete must not pretend
// otherwise, and the release after it still works.
func testZnodeDeleted(t *testing.T, env *env) {
	l := campaign(t, openStore(t, env.servers), "znode-deleted", "a", 10*time.Second)
	if err := env.admin.Delete(l.Path(), -1); err != nil {
		t.Fatal(err)
	}
	deleted := time.Now()
	select {
	case <-l.Lost():
		t.Logf("loss reported %v after the delete", time.Since(deleted))
	case <-time.After(time.Second):
		t.Fatal("Lost() not closed within 1s of deleting the leader's znode")
	}
	if err := l.Err(); !errors.Is(err, backends.ErrLeaseLost) || !strings.Contains(err.Error(), "deleted") {
		t.Errorf("Err() = %v, want ErrLeaseLost saying the znode was deleted", err)
	}
	ctx := context.Background()
	if err := l.Renew(ctx); !errors.Is(err, backends.ErrLeaseLost) {
		t.Errorf("Renew after the znode was deleted = %v, want ErrLeaseLost", err)
	}
	now := time.Now()
	err := l.Complete(ctx, backends.Marker{Key: "k", Identity: "a", Token: l.Token(), At: now, Expires: now.Add(time.Hour)})
	if !errors.Is(err, backends.ErrLeaseLost) {
		t.Errorf("Complete after the znode was deleted = %v, want ErrLeaseLost", err)
	}
	if err := l.Release(ctx, nil); err != nil {
		t.Errorf("release after loss: %v", err)
	}
	if err := l.Release(ctx, nil); err != nil {
		t.Errorf("second release: %v", err)
	}
}
