package kubernetes_test

import (
	"context"
	"fmt"
	"net/http"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/leaderrun/leaderrun/backends"
	"github.com/leaderrun/leaderrun/backends/backendtest"
	"github.com/leaderrun/leaderrun/internal/testenv"
)

// watchEvents is how many events of leases the apiserver has sent to
// watchers, from its own metrics.
func watchEvents(t *testing.T, k *testenv.Kube) int {
	t.Helper()
	n := 0
	for line := range strings.SplitSeq(string(k.Admin(t, http.MethodGet, "/metrics", nil)), "\n") {
		if !strings.HasPrefix(line, "apiserver_watch_events_total{") || !strings.Contains(line, `resource="leases"`) {
			continue
		}
		f := strings.Fields(line)
		if v, err := strconv.ParseFloat(f[len(f)-1], 64); err == nil {
			n += int(v)
		}
	}
	return n
}

// TestWaitersWokenPerChange measures the herd that Kubernetes watches
// make: the apiserver sends every event of an object to every watcher of
// it, so a change of the Lease wakes every waiter, not only the next in
// line. 20 waiters wait on a held Lease; in each of 5 rounds its holder
// releases it and a waiter takes it. Per round: the events the apiserver
// sent per change (release, grant), and the waiters' requests: each woken
// waiter that saw the Lease free tries to take it, and each that lost
// reads it again once. A renewal costs them nothing but the wake-up
// (TestIdleFollowerOnlyWatches).
func TestWaitersWokenPerChange(t *testing.T) {
	const waiters, rounds, lock = 20, 5, "herd"
	c := newCluster(t)
	c.k.Grant(t, c.ns, testenv.KubeOther, "get", "create", "update", "watch")
	current := campaign(t, c.store(t, testenv.KubeOther), lock, "holder", 15*time.Second)
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	won := make(chan *backends.Lease, waiters)
	watches := c.k.LeaseWatches(t)
	for i := range waiters {
		s := c.store(t, testenv.KubeLimited)
		go func() {
			if l, err := backends.Campaign(ctx, s, lock, candidate(fmt.Sprintf("waiter-%d", i), timings(15*time.Second))); err == nil {
				won <- l
			}
		}()
	}
	for end := time.Now().Add(30 * time.Second); c.k.LeaseWatches(t) < watches+waiters; time.Sleep(20 * time.Millisecond) {
		if time.Now().After(end) {
			t.Fatalf("%d of %d waiters watch the Lease", c.k.LeaseWatches(t)-watches, waiters)
		}
	}
	// requests counts the waiters' updates and reads of the Lease, from
	// the audit log, after the first skip requests.
	requests := func(skip int) (all, updates, gets int) {
		reqs := c.k.LeaseRequests(t)
		for _, r := range reqs[min(skip, len(reqs)):] {
			if r.Namespace == c.ns && r.Name == lock && r.User == testenv.KubeLimited {
				switch r.Verb {
				case "update":
					updates++
				case "get":
					gets++
				}
			}
		}
		return len(reqs), updates, gets
	}
	for round := range rounds {
		waiting := waiters - round
		events := watchEvents(t, c.k)
		skip, _, _ := requests(0)
		backendtest.Release(t, current)
		select {
		case current = <-won:
		case <-time.After(10 * time.Second):
			t.Fatalf("round %d: no waiter took the released Lease", round)
		}
		releases := 0
		if round > 0 {
			releases = 1 // by the waiter that won the round before
		}
		// Settled once every waiter that tried and lost has read the
		// Lease again, and nothing more came for a second.
		takes, gets, quiet := -1, -1, time.Now()
		for end := time.Now().Add(15 * time.Second); time.Since(quiet) < time.Second && time.Now().Before(end); time.Sleep(20 * time.Millisecond) {
			_, updates, g := requests(skip)
			if updates-releases != takes || g != gets || g != takes-1 {
				takes, gets, quiet = updates-releases, g, time.Now()
			}
		}
		perChange := float64(watchEvents(t, c.k)-events) / 2
		t.Logf("round %d: %d waiters; %.1f watch events per change; %d tried to take the Lease, %d read it again",
			round, waiting, perChange, takes, gets)
		if perChange < float64(waiting-1) {
			t.Errorf("round %d: %.1f events per change, want every one of the %d waiters woken", round, perChange, waiting)
		}
		if takes < 1 || gets != takes-1 {
			t.Errorf("round %d: %d takes and %d reads again; want every loser to read once", round, takes, gets)
		}
	}
	cancel()
	backendtest.Release(t, current)
}
