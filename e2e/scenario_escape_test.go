//go:build linux

package e2e

import (
	"path/filepath"
	"testing"
	"time"

	"github.com/leaderrun/leaderrun/internal/testenv"
)

// testEscapedHelper (S9): the job's helper that left its process group
// (setsid) and ignores SIGTERM is SIGKILLed within --kill-grace of the
// first kill signal (escape_test.go: escapingJob, checkHelperDeath), with
// the store's escapeTimings, whose lease leaves exactly one grace of
// margin. With the leader's link stalled, the store keeps the lock from
// the follower until the lease expired, after the old tree is dead: the
// follower's job starts only then. With the lease taken away by an
// operator (target.losses[0]), which frees it at once, only the one
// deadline is checked: the token protects the resource meanwhile. It runs
// alone among the scenarios: at a load of 13 on two cores, with the other
// stores' scenarios beside it, the watchdog's SIGKILL came 110 ms after
// the grace, past the 50 ms that escape_test.go allows.
func testEscapedHelper(t *testing.T, e *env) {
	e.timings = e.escapeTimings
	for _, tc := range []struct {
		name    string
		ordered bool
		fault   func(t *testing.T, proxy *testenv.Proxy, lock string)
	}{
		{"StalledLink", true, func(t *testing.T, proxy *testenv.Proxy, lock string) { proxy.Stall() }},
		{e.losses[0].name, false, func(t *testing.T, proxy *testenv.Proxy, lock string) { e.losses[0].do(t, e, lock) }},
	} {
		t.Run(tc.name, func(t *testing.T) {
			dir := t.TempDir()
			events, pidFile := filepath.Join(dir, "events"), filepath.Join(dir, "helper")
			lock := e.lock(tc.name)
			proxy := testenv.NewProxy(t, e.link)
			flags, env := e.via(proxy.Addr())
			leader := start(t, append(childEnv(events, "ignore:1h"), env...),
				append(e.argsWith(flags, lock, "leader"), escapingJob(t, pidFile)...)...)
			h := helper(t, events, "leader", pidFile)
			e.settle(t, leader)
			follower := e.follower(t, events, "forever", lock, "follower")
			tc.fault(t, proxy, lock)
			died := h.Died(t, 30*time.Second)
			checkHelperDeath(t, leader, events, "leader", died)
			evs := waitEvents(t, events, 30*time.Second, "the follower's job", etcdHas("start", "follower"))
			next, _ := etcdFind(evs, "start", "follower")
			t.Logf("the follower's job started %v after the helper died", next.At.Sub(died).Round(time.Millisecond))
			if tc.ordered && !next.At.After(died) {
				t.Errorf("the follower's job started %v before the helper died: two jobs at once", died.Sub(next.At))
			}
			proxy.Resume()
			if code := leader.wait(20 * time.Second); code != 76 {
				t.Errorf("leaderrun exited %d, want 76", code)
			}
			stop(t, follower)
		})
	}
}
