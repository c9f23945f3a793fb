package etcd_test

import (
	"context"
	"errors"
	"fmt"
	"net"
	"strings"
	"testing"
	"time"

	clientv3 "go.etcd.io/etcd/client/v3"
	"go.uber.org/zap"

	"github.com/leaderrun/leaderrun/backends"
	"github.com/leaderrun/leaderrun/backends/backendtest"
	"github.com/leaderrun/leaderrun/backends/etcd"
	"github.com/leaderrun/leaderrun/internal/testenv"
)

// etcdGrant is what the tests need of the store's grant.
type etcdGrant interface {
	Key() string
	ID() clientv3.LeaseID
}

func grantOf(l *backends.Lease) etcdGrant { return l.Grant().(etcdGrant) }

// TestEtcd runs every test of the backend against one real etcd: starting
// one costs about a second.
func TestEtcd(t *testing.T) {
	e := testenv.StartEtcd(t, 1)
	eps := e.Endpoints()
	cli, err := clientv3.New(clientv3.Config{Endpoints: eps, DialTimeout: 5 * time.Second, Logger: zap.NewNop()})
	if err != nil {
		t.Fatal(err)
	}
	defer cli.Close()
	store := &env{eps: eps, cli: cli}
	for _, tc := range []struct {
		name string
		run  func(*testing.T, *env)
	}{
		{"Conformance", testConformance},
		{"GrantedTTL", testGrantedTTL},
		{"KeyDeleted", testKeyDeleted},
		{"KeyOverwritten", testKeyOverwritten},
		{"TryLeavesNoTrace", testTryLeavesNoTrace},
		{"WaiterSessionEnds", testWaiterSessionEnds},
		{"AcquiredAfterWaiting", testAcquiredAfterWaiting},
		{"OnlyRenewRenews", testOnlyRenewRenews},
		{"WaiterKeptAlive", testWaiterKeptAlive},
		{"CancelWhileStoreStalled", testCancelWhileStoreStalled},
		{"Unreachable", testUnreachable},
		{"Failover", testFailover},
	} {
		t.Run(tc.name, func(t *testing.T) { tc.run(t, store) })
	}
}

// env is the shared server, and a client of its own that plays the
// operator or another host.
type env struct {
	eps []string
	cli *clientv3.Client
}

// candidate campaigns for one lock through a store of its own, with the
// lease duration it was made with, as the runner would.
type candidate struct {
	s    *etcd.Store
	lock string
	ttl  time.Duration
}

// timings are valid timings around a lease of ttl.
func timings(ttl time.Duration) backends.Timings {
	return backends.Timings{LeaseDuration: ttl, RenewDeadline: ttl / 2, RetryPeriod: ttl / 5, KillGrace: ttl / 4}
}

func (c candidate) Campaign(ctx context.Context, id string, try bool) (*backends.Lease, error) {
	return backends.Campaign(ctx, c.s, c.lock, backends.Candidate{Identity: id, Try: try, Timings: timings(c.ttl)})
}

func (c candidate) Status(ctx context.Context) (backends.Status, error) {
	return backends.ReadStatus(ctx, c.s, c.lock)
}

func open(t *testing.T, eps []string, dial time.Duration) *etcd.Store {
	t.Helper()
	s, err := etcd.Open(etcd.Config{Endpoints: eps, Prefix: "leaderrun-test/", DialTimeout: dial})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { s.Close() })
	return s
}

func newBackend(t *testing.T, eps []string, lock string, ttl time.Duration) candidate {
	t.Helper()
	return candidate{s: open(t, eps, 2*time.Second), lock: lock, ttl: ttl}
}

func testConformance(t *testing.T, env *env) {
	backendtest.Run(t, backendtest.Harness{
		Open:       func(t *testing.T) backends.Store { return open(t, env.eps, 0) },
		Timings:    timings(5 * time.Second),
		SlotGrants: 200,
		Drop: func(t *testing.T, _ string, l *backends.Lease) {
			if _, err := env.cli.Revoke(context.Background(), grantOf(l).ID()); err != nil {
				t.Fatal(err)
			}
		},
	})
}

func campaign(t *testing.T, b candidate, id string) *backends.Lease {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	l, err := b.Campaign(ctx, id, false)
	if err != nil {
		t.Fatalf("%s: campaign: %v", id, err)
	}
	t.Cleanup(func() { l.Release(context.Background(), nil) })
	return l
}

// keys lists the candidates' keys of lock, oldest first.
func keys(t *testing.T, cli *clientv3.Client, lock string) []string {
	t.Helper()
	resp, err := cli.Get(context.Background(), "leaderrun-test/"+lock+"/",
		clientv3.WithPrefix(), clientv3.WithSort(clientv3.SortByCreateRevision, clientv3.SortAscend))
	if err != nil {
		t.Fatal(err)
	}
	var ks []string
	for _, kv := range resp.Kvs {
		ks = append(ks, string(kv.Key))
	}
	return ks
}

var waitFor = backendtest.WaitFor

// testGrantedTTL: etcd grants whole seconds and raises a TTL below its
// minimum (2 s with the default election timeout); the lease reports what
// was granted, not what was asked.
func testGrantedTTL(t *testing.T, env *env) {
	for _, tc := range []struct {
		name      string
		ask, want time.Duration
	}{
		{"whole seconds", 3 * time.Second, 3 * time.Second},
		{"rounded up", 2500 * time.Millisecond, 3 * time.Second},
		{"raised to the minimum", 500 * time.Millisecond, 2 * time.Second},
	} {
		t.Run(tc.name, func(t *testing.T) {
			b := newBackend(t, env.eps, "ttl-"+strings.ReplaceAll(tc.name, " ", "-"), tc.ask)
			l := campaign(t, b, "a")
			if l.TTL() != tc.want {
				t.Errorf("asked %v, TTL() = %v, want %v", tc.ask, l.TTL(), tc.want)
			}
			st, err := b.Status(context.Background())
			if err != nil {
				t.Fatal(err)
			}
			if st.TTL != tc.want || st.Remaining <= 0 || st.Remaining > tc.want {
				t.Errorf("status TTL %v remaining %v, want %v and (0, %v]", st.TTL, st.Remaining, tc.want, tc.want)
			}
		})
	}
}

// testKeyDeleted: deleting the leader's key (lease still alive) is loss,
// reported at once, and Renew must not pretend otherwise.
func testKeyDeleted(t *testing.T, env *env) {
	cli := env.cli
	b := newBackend(t, env.eps, "key-deleted", 5*time.Second)
	l := campaign(t, b, "a")
	if _, err := cli.Delete(context.Background(), grantOf(l).Key()); err != nil {
		t.Fatal(err)
	}
	deleted := time.Now()
	select {
	case <-l.Lost():
		t.Logf("loss reported %v after the delete", time.Since(deleted))
	case <-time.After(time.Second):
		t.Fatal("Lost() not closed within 1s of deleting the key")
	}
	if err := l.Err(); !errors.Is(err, backends.ErrLeaseLost) || !strings.Contains(err.Error(), "deleted") {
		t.Errorf("Err() = %v, want ErrLeaseLost saying the key was deleted", err)
	}
	if err := l.Renew(context.Background()); !errors.Is(err, backends.ErrLeaseLost) {
		t.Errorf("Renew after the key was deleted = %v, want ErrLeaseLost", err)
	}
	if err := l.Release(context.Background(), nil); err != nil {
		t.Errorf("release after loss: %v", err)
	}
	if err := l.Release(context.Background(), nil); err != nil {
		t.Errorf("second release: %v", err)
	}
}

// testKeyOverwritten: a put on the leader's key without its lease detaches
// the key from the lease, so the lease no longer proves anything: that is
// loss too, and release deletes the key rather than leave it blocking the
// election for ever.
func testKeyOverwritten(t *testing.T, env *env) {
	lock := "key-overwritten"
	b := newBackend(t, env.eps, lock, 5*time.Second)
	l := campaign(t, b, "a")
	if _, err := env.cli.Put(context.Background(), grantOf(l).Key(), "intruder"); err != nil {
		t.Fatal(err)
	}
	select {
	case <-l.Lost():
	case <-time.After(time.Second):
		t.Fatal("Lost() not closed within 1s of overwriting the key")
	}
	if err := l.Err(); !errors.Is(err, backends.ErrLeaseLost) || !strings.Contains(err.Error(), "overwritten") {
		t.Errorf("Err() = %v, want ErrLeaseLost saying the key was overwritten", err)
	}
	if err := l.Release(context.Background(), nil); err != nil {
		t.Errorf("release: %v", err)
	}
	if ks := keys(t, env.cli, lock); len(ks) != 0 {
		t.Errorf("keys after release: %v, want none", ks)
	}
}

// testTryLeavesNoTrace: a --try on a held lock neither queues nor leaves a
// key or lease behind.
func testTryLeavesNoTrace(t *testing.T, env *env) {
	cli := env.cli
	lock := "try-no-trace"
	a, b := newBackend(t, env.eps, lock, 5*time.Second), newBackend(t, env.eps, lock, 5*time.Second)
	la := campaign(t, a, "a")
	before, err := cli.Leases(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	_, err = b.Campaign(context.Background(), "b", true)
	if !errors.Is(err, backends.ErrLocked) {
		t.Fatalf("try: %v, want ErrLocked", err)
	}
	if cause := errors.Unwrap(err); cause == nil || !strings.Contains(cause.Error(), `"a"`) {
		t.Errorf("error %q (cause %v) does not name the holder", err, cause)
	}
	if ks := keys(t, cli, lock); len(ks) != 1 || ks[0] != grantOf(la).Key() {
		t.Errorf("keys after try: %v, want only the holder's %s", ks, grantOf(la).Key())
	}
	after, err := cli.Leases(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	if len(after.Leases) > len(before.Leases) {
		t.Errorf("try left a lease behind: %d leases before, %d after", len(before.Leases), len(after.Leases))
	}
}

// testWaiterSessionEnds: a waiting candidate whose lease is revoked under it
// notices, campaigns again with a new session and still gets the lock.
func testWaiterSessionEnds(t *testing.T, env *env) {
	cli := env.cli
	lock := "waiter-session-ends"
	a, b := newBackend(t, env.eps, lock, 5*time.Second), newBackend(t, env.eps, lock, 5*time.Second)
	la := campaign(t, a, "a")
	got := make(chan *backends.Lease, 1)
	errc := make(chan error, 1)
	go func() {
		l, err := b.Campaign(context.Background(), "b", false)
		errc <- err
		got <- l
	}()
	var first string
	waitFor(t, "the waiter's key", func() bool {
		ks := keys(t, cli, lock)
		if len(ks) == 2 {
			first = ks[1]
		}
		return first != ""
	})
	var id int64
	resp, err := cli.Get(context.Background(), first)
	if err != nil || len(resp.Kvs) != 1 {
		t.Fatalf("read waiter's key: %v", err)
	}
	id = resp.Kvs[0].Lease
	if _, err := cli.Revoke(context.Background(), clientv3.LeaseID(id)); err != nil {
		t.Fatal(err)
	}
	waitFor(t, "the waiter to queue again under a new key", func() bool {
		ks := keys(t, cli, lock)
		return len(ks) == 2 && ks[1] != first
	})
	if err := la.Release(context.Background(), nil); err != nil {
		t.Fatal(err)
	}
	select {
	case err := <-errc:
		if err != nil {
			t.Fatalf("waiter: %v", err)
		}
		lb := <-got
		defer lb.Release(context.Background(), nil)
		if grantOf(lb).Key() == first {
			t.Errorf("waiter won with its revoked key %s", first)
		}
		if lb.Token() <= la.Token() {
			t.Errorf("waiter's token %d not greater than %d", lb.Token(), la.Token())
		}
	case <-time.After(10 * time.Second):
		t.Fatal("waiter did not get the lock after the holder released")
	}
}

// testAcquiredAfterWaiting: a candidate that waited reports as Acquired its
// Grant's send time, before it queued: the keep-alives of its wait do not
// count once it leads (the runner renews a grant whose proof of life is
// old before it starts the child), and the lease it won is alive and
// renewable.
func testAcquiredAfterWaiting(t *testing.T, env *env) {
	lock := "acquired-after-waiting"
	a, b := newBackend(t, env.eps, lock, 5*time.Second), newBackend(t, env.eps, lock, 5*time.Second)
	la := campaign(t, a, "a")
	got := make(chan *backends.Lease, 1)
	start := time.Now()
	go func() {
		l, err := b.Campaign(context.Background(), "b", false)
		if err != nil {
			t.Errorf("waiter: %v", err)
		}
		got <- l
	}()
	waitFor(t, "the waiter to queue", func() bool {
		st, err := a.Status(context.Background())
		return err == nil && st.Waiting == 1 && time.Since(start) > 500*time.Millisecond
	})
	if err := la.Release(context.Background(), nil); err != nil {
		t.Fatal(err)
	}
	lb := <-got
	if lb == nil {
		return
	}
	defer lb.Release(context.Background(), nil)
	if !lb.Acquired().Before(start.Add(100 * time.Millisecond)) {
		t.Errorf("Acquired is %v after the campaign started, want the Grant's send time, before the wait",
			lb.Acquired().Sub(start))
	}
	if err := lb.Renew(context.Background()); err != nil {
		t.Errorf("renewing the lease won after waiting: %v", err)
	}
}

// testCancelWhileStoreStalled: a waiting candidate whose connection to etcd
// hangs still returns promptly when its context is cancelled: the
// withdrawal (revoking its lease) is bounded and must not block on the
// dead link.
func testCancelWhileStoreStalled(t *testing.T, env *env) {
	lock := "cancel-stalled"
	proxy := testenv.NewProxy(t, strings.TrimPrefix(env.eps[0], "http://"))
	a := newBackend(t, env.eps, lock, 5*time.Second)
	b := newBackend(t, []string{"http://" + proxy.Addr()}, lock, 5*time.Second)
	campaign(t, a, "a")
	ctx, cancel := context.WithCancel(context.Background())
	errc := make(chan error, 1)
	go func() {
		_, err := b.Campaign(ctx, "b", false)
		errc <- err
	}()
	waitFor(t, "the waiter to queue", func() bool {
		st, err := a.Status(context.Background())
		return err == nil && st.Waiting == 1
	})
	proxy.Stall()
	defer proxy.Resume()
	cancelled := time.Now()
	cancel()
	select {
	case err := <-errc:
		took := time.Since(cancelled)
		t.Logf("cancelled campaign returned after %v", took)
		if !errors.Is(err, context.Canceled) {
			t.Errorf("cancelled campaign: %v, want context.Canceled", err)
		}
		if took > 3*time.Second {
			t.Errorf("cancelled campaign took %v to return, want about the withdraw timeout at most", took)
		}
	case <-time.After(10 * time.Second):
		t.Fatal("cancelled campaign still blocked 10s after cancel with etcd stalled")
	}
}

// testUnreachable: a store that cannot be reached fails a --try at once,
// naming it; a candidate that waits retries it until its --wait ends, and
// then fails the same way, since the store never answered.
func testUnreachable(t *testing.T, env *env) {
	ep := fmt.Sprintf("http://127.0.0.1:%d", testenv.FreePort(t, "127.0.0.1"))
	for _, tc := range []struct {
		name string
		try  bool
		wait time.Duration
	}{{"try", true, 0}, {"wait", false, 1500 * time.Millisecond}} {
		s := open(t, []string{ep}, 300*time.Millisecond)
		start := time.Now()
		_, err := backends.Campaign(context.Background(), s, "unreachable",
			backends.Candidate{Identity: "a", Try: tc.try, Wait: tc.wait, Timings: timings(5 * time.Second)})
		took := time.Since(start)
		if !errors.Is(err, backends.ErrUnavailable) || !strings.Contains(err.Error(), ep) {
			t.Errorf("%s: campaign: %v, want ErrUnavailable naming %s", tc.name, err, ep)
		}
		if took < tc.wait || took > tc.wait+2*time.Second {
			t.Errorf("%s: took %v to give up, want about the dial timeout after %v", tc.name, took, tc.wait)
		}
		if _, err = backends.ReadStatus(context.Background(), s, "unreachable"); !errors.Is(err, backends.ErrUnavailable) {
			t.Errorf("status: %v, want ErrUnavailable", err)
		}
	}
}

// testFailover: with several endpoints, a member that refuses connections
// or accepts them and says nothing does not keep a candidate from the
// lock: the request goes to the next member, within the dial timeout.
func testFailover(t *testing.T, env *env) {
	refused := fmt.Sprintf("http://127.0.0.1:%d", testenv.FreePort(t, "127.0.0.1"))
	silent, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer silent.Close()
	for _, tc := range []struct {
		name  string
		first string
	}{
		{"refused", refused},
		{"silent", "http://" + silent.Addr().String()},
	} {
		t.Run(tc.name, func(t *testing.T) {
			for _, try := range []bool{false, true} {
				b := newBackend(t, append([]string{tc.first}, env.eps...), "failover-"+tc.name, 5*time.Second)
				start := time.Now()
				l, err := b.Campaign(context.Background(), "a", try)
				took := time.Since(start)
				if err != nil {
					t.Fatalf("try=%v: campaign with %s first: %v", try, tc.name, err)
				}
				t.Logf("try=%v: led after %v with a %s member first", try, took.Round(time.Millisecond), tc.name)
				if took > 2*time.Second {
					t.Errorf("try=%v: took %v, want within the 2 s dial timeout", try, took)
				}
				if err := l.Renew(context.Background()); err != nil {
					t.Errorf("try=%v: renew: %v", try, err)
				}
				if err := l.Release(context.Background(), nil); err != nil {
					t.Errorf("try=%v: release: %v", try, err)
				}
			}
		})
	}
}

// remaining is the time etcd says lease id has left, in whole seconds.
func remaining(t *testing.T, cli *clientv3.Client, id clientv3.LeaseID) int64 {
	t.Helper()
	resp, err := cli.TimeToLive(context.Background(), id)
	if err != nil {
		t.Fatal(err)
	}
	return resp.TTL
}

// testOnlyRenewRenews: once Campaign has returned, nothing but Renew
// extends the lease (backends.Backend: one rule for who renews). etcd
// reports the time left in whole seconds, rounded down: a lease of 3 s
// that a keep-alive renewed every third of its TTL would never show 0 s
// left; left alone it does after 2 s, and one Renew brings it back.
func testOnlyRenewRenews(t *testing.T, env *env) {
	for _, try := range []bool{false, true} {
		t.Run(fmt.Sprintf("try=%v", try), func(t *testing.T) {
			b := newBackend(t, env.eps, fmt.Sprintf("only-renew-%v", try), 3*time.Second)
			ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
			defer cancel()
			l, err := b.Campaign(ctx, "a", try)
			if err != nil {
				t.Fatal(err)
			}
			defer l.Release(context.Background(), nil)
			won := time.Now()
			waitFor(t, "the lease to run down to less than 1 s left", func() bool { return remaining(t, env.cli, grantOf(l).ID()) == 0 })
			t.Logf("less than 1 s left %v after the campaign returned", time.Since(won).Round(time.Millisecond))
			if err := l.Renew(context.Background()); err != nil {
				t.Fatalf("renew: %v", err)
			}
			if left := remaining(t, env.cli, grantOf(l).ID()); left < 2 {
				t.Errorf("%d s left right after Renew, want the TTL back (3 s)", left)
			}
			select {
			case <-l.Lost():
				t.Fatalf("lost: %v", l.Err())
			default:
			}
		})
	}
}

// testWaiterKeptAlive: a candidate keeps its own lease alive while it
// waits, for longer than its TTL, and wins with the key it queued with.
// Nothing renews the holder's lease here (the runner's Renew is the only
// renewal during leadership), so it lasts well past the wait.
func testWaiterKeptAlive(t *testing.T, env *env) {
	lock := "waiter-kept-alive"
	a, b := newBackend(t, env.eps, lock, 30*time.Second), newBackend(t, env.eps, lock, 2*time.Second)
	la := campaign(t, a, "a")
	got := make(chan *backends.Lease, 1)
	go func() {
		l, err := b.Campaign(context.Background(), "b", false)
		if err != nil {
			t.Errorf("waiter: %v", err)
		}
		got <- l
	}()
	var queued string
	waitFor(t, "the waiter to queue", func() bool {
		if ks := keys(t, env.cli, lock); len(ks) == 2 {
			queued = ks[1]
		}
		return queued != ""
	})
	start := time.Now()
	waitFor(t, "the waiter to wait longer than twice its TTL", func() bool {
		if ks := keys(t, env.cli, lock); len(ks) != 2 || ks[1] != queued {
			t.Fatalf("keys %v while waiting, want the holder's and the waiter's first key %s", ks, queued)
		}
		return time.Since(start) > 5*time.Second
	})
	if err := la.Release(context.Background(), nil); err != nil {
		t.Fatal(err)
	}
	lb := <-got
	if lb == nil {
		return
	}
	defer lb.Release(context.Background(), nil)
	if k := grantOf(lb).Key(); k != queued {
		t.Errorf("won with %s, want the key it queued with, %s", k, queued)
	}
}
