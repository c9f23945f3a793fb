//go:build linux

package e2e

import (
	"encoding/json"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/leaderrun/leaderrun/internal/testenv"
)

// The escaped helper (S9): a job that starts `setsid some-daemon &`, where
// the daemon ignores SIGTERM. The whole tree, helper included, must be
// SIGKILLed no later than --kill-grace after the first kill signal: the
// validation budgets exactly one grace between the renew deadline and the
// lease (L > D + G), and these tests run with a lease that leaves only
// that: a helper given a second grace would outlive the lease and run
// beside the follower's job.

// escapeGrace is the tests' --kill-grace; escapeSlack is what the helper
// may take beyond it (the kernel, the scheduler, the test's own wake-up).
const (
	escapeGrace = 900 * time.Millisecond
	escapeSlack = 50 * time.Millisecond
)

// escapingJob is the job: it starts the helper, which records its pid in
// pidFile, then becomes the test binary's child in ignore mode, which
// records every signal it gets (the first kill signal's time) and ignores
// it, so that only SIGKILL ends it.
func escapingJob(t *testing.T, pidFile string) []string {
	t.Helper()
	if _, err := exec.LookPath("setsid"); err != nil {
		testenv.Missing(t, "setsid(1) from util-linux is not installed")
	}
	script := `setsid sh -c 'trap "" TERM INT; echo $$ > ` + pidFile + `.tmp; mv ` + pidFile + `.tmp ` + pidFile + `; exec sleep 3600' </dev/null >/dev/null 2>&1 &
while [ ! -s ` + pidFile + ` ]; do sleep 0.01; done
exec ` + childArgv(t)[0]
	return []string{"--log-format", "json", "--shell", "--", script}
}

// helper waits for the job to run (the helper started and the job became
// the recording child) and watches the helper, so that the test learns the
// moment it dies (it is not the test's child).
func helper(t *testing.T, events, id, pidFile string) *testenv.Process {
	t.Helper()
	waitEvents(t, events, 10*time.Second, "the job", etcdHas("start", id))
	var pid int
	waitFor(t, 10*time.Second, "the helper's pid", func() bool {
		data, err := os.ReadFile(pidFile)
		pid, _ = strconv.Atoi(strings.TrimSpace(string(data)))
		return err == nil && pid > 0
	})
	return testenv.Watch(t, pid)
}

// checkHelperDeath fails the test unless leaderrun sent the helper
// SIGKILL within --kill-grace + slack of the first kill signal the job
// recorded, by its own log, and the helper was seen dead soon after (the
// kernel finishing a SIGKILL, and the test's own wake-up, take a few
// milliseconds on a quiet machine, and tens on a machine loaded by parallel
// builds: deathSlack).
func checkHelperDeath(t *testing.T, leader *proc, events, id string, died time.Time) time.Time {
	t.Helper()
	evs := waitEvents(t, events, 5*time.Second, "the job's kill signal", etcdHas("signal", id))
	first, _ := etcdFind(evs, "signal", id)
	// The line is written just after the SIGKILL, which the test may see
	// take effect first.
	var killed time.Time
	waitFor(t, 5*time.Second, "leaderrun to log its SIGKILL", func() bool {
		var ok bool
		killed, ok = logTime(leader.stderr.String(), "still running at the end of --kill-grace; sent SIGKILL")
		return ok
	})
	sent, after := killed.Sub(first.At), died.Sub(first.At)
	t.Logf("first kill signal (%s) to SIGKILL: %v, to the helper's death: %v (--kill-grace %v)",
		first.Rest, sent.Round(time.Millisecond), after.Round(time.Millisecond), escapeGrace)
	if sent > escapeGrace+escapeSlack {
		t.Errorf("SIGKILL sent %v after the first kill signal: more than --kill-grace %v + %v", sent, escapeGrace, escapeSlack)
	}
	if after > escapeGrace+escapeSlack+deathSlack {
		t.Errorf("the helper died %v after the first kill signal", after)
	}
	if after < escapeGrace-escapeSlack {
		t.Errorf("the helper, which ignores SIGTERM, died %v after the first kill signal: before the grace was up", after)
	}
	return first.At
}

// deathSlack is what the kernel and the scheduler may add between a
// SIGKILL and the process being gone, on a loaded machine.
const deathSlack = 150 * time.Millisecond

// logTime is the time of the first JSON log line whose msg is msg.
func logTime(log, msg string) (time.Time, bool) {
	for _, line := range strings.Split(log, "\n") {
		var l struct {
			Time time.Time `json:"time"`
			Msg  string    `json:"msg"`
		}
		if json.Unmarshal([]byte(line), &l) == nil && l.Msg == msg {
			return l.Time, true
		}
	}
	return time.Time{}, false
}

// TestEscapedHelperLocal: on the local backend, with a store-reported loss
// (the lock file removed) and with SIGTERM to leaderrun; after the SIGTERM
// stop, the waiting follower's job starts only once the helper is gone.
func TestEscapedHelperLocal(t *testing.T) {
	args := func(dir, id string) []string {
		return []string{"--backend", "local", "--state-dir", dir, "--lock", "escape", "--identity", id,
			"--lease-duration", "4s", "--renew-deadline", "2s", "--retry-period", "200ms", "--kill-grace", escapeGrace.String()}
	}
	t.Run("lock file removed", func(t *testing.T) {
		dir := t.TempDir()
		events, pidFile := filepath.Join(dir, "events"), filepath.Join(dir, "helper")
		p := start(t, childEnv(events, "ignore:1h"), append(args(dir, "leader"), escapingJob(t, pidFile)...)...)
		h := helper(t, events, "leader", pidFile)
		if err := os.Remove(filepath.Join(dir, "escape.lock")); err != nil {
			t.Fatal(err)
		}
		checkHelperDeath(t, p, events, "leader", h.Died(t, 10*time.Second))
		if code := p.wait(10 * time.Second); code != 76 {
			t.Errorf("leaderrun exited %d, want 76", code)
		}
	})
	t.Run("SIGTERM", func(t *testing.T) {
		dir := t.TempDir()
		events, pidFile := filepath.Join(dir, "events"), filepath.Join(dir, "helper")
		leader := start(t, childEnv(events, "ignore:1h"), append(args(dir, "leader"), escapingJob(t, pidFile)...)...)
		h := helper(t, events, "leader", pidFile)
		follower := start(t, childEnv(events, "forever"), append(args(dir, "follower"), cmdArgs(t, nil)...)...)
		waitFor(t, 10*time.Second, "the follower to queue", func() bool {
			out, _ := output(t, "status", "--json", "--backend", "local", "--state-dir", dir, "--lock", "escape")
			return strings.Contains(out, `"waiting":1`)
		})
		leader.signal(syscall.SIGTERM)
		died := h.Died(t, 10*time.Second)
		checkHelperDeath(t, leader, events, "leader", died)
		evs := waitEvents(t, events, 10*time.Second, "the follower's job", etcdHas("start", "follower"))
		next, _ := etcdFind(evs, "start", "follower")
		t.Logf("follower's job started %v after the helper died", next.At.Sub(died).Round(time.Millisecond))
		if !next.At.After(died) {
			t.Errorf("the follower's job started %v before the helper died", died.Sub(next.At))
		}
		follower.signal(syscall.SIGTERM)
		follower.wait(10 * time.Second)
	})
}

// escapeFault is one way the leader loses its lease in the store-backed
// tests below. ordered: the store keeps the lock from the follower until
// the old tree is dead (lease expiry after a stalled link; Consul's
// lock-delay after a destroyed session), so the follower's job must start
// only after the helper died. An etcd lease revoked by an operator frees
// the key at once: there the follower may start during the grace (the
// fencing token is the protection), and only the one deadline is checked.
type escapeFault struct {
	name    string
	ordered bool
	fault   func(t *testing.T, proxy *testenv.Proxy, lock string)
}

// escapeOnStore runs each fault with a leader whose link goes through a
// proxy and a follower that waits, both given by args(addr, lock, id).
func escapeOnStore(t *testing.T, direct, proxied string, args func(addr, lock, id string) []string,
	queued func(lock string) bool, faults []escapeFault) {
	t.Helper()
	for _, tc := range faults {
		t.Run(tc.name, func(t *testing.T) {
			dir := t.TempDir()
			events, pidFile := filepath.Join(dir, "events"), filepath.Join(dir, "helper")
			lock := "escape-" + strings.ReplaceAll(tc.name, " ", "-")
			proxy := testenv.NewProxy(t, proxied)
			leader := start(t, childEnv(events, "ignore:1h"), append(args(proxy.Addr(), lock, "leader"), escapingJob(t, pidFile)...)...)
			h := helper(t, events, "leader", pidFile)
			follower := start(t, childEnv(events, "forever"), append(args(direct, lock, "follower"), cmdArgs(t, nil)...)...)
			waitFor(t, 20*time.Second, "the follower to queue", func() bool { return queued(lock) })
			tc.fault(t, proxy, lock)
			died := h.Died(t, 30*time.Second)
			checkHelperDeath(t, leader, events, "leader", died)
			evs := waitEvents(t, events, 30*time.Second, "the follower's job", etcdHas("start", "follower"))
			next, _ := etcdFind(evs, "start", "follower")
			t.Logf("follower's job started %v after the helper died", next.At.Sub(died).Round(time.Millisecond))
			if tc.ordered && !next.At.After(died) {
				t.Errorf("the follower's job started %v before the helper died: two jobs at once", died.Sub(next.At))
			}
			proxy.Resume()
			if code := leader.wait(15 * time.Second); code != 76 {
				t.Errorf("leaderrun exited %d, want 76", code)
			}
			follower.signal(syscall.SIGTERM)
			follower.wait(10 * time.Second)
		})
	}
}

// TestEscapedHelperEtcd: on etcd with a lease that leaves one grace of
// margin (3 s = deadline 2 s + grace 0.9 s + 0.1 s).
func TestEscapedHelperEtcd(t *testing.T) {
	eps := testenv.StartEtcd(t, 1).Endpoints()
	timings := []string{"--lease-duration", "3s", "--renew-deadline", "2s", "--retry-period", "500ms", "--kill-grace", escapeGrace.String()}
	args := func(addr, lock, id string) []string {
		return append([]string{"--etcd-endpoints", addr, "--lock", lock, "--identity", id}, timings...)
	}
	queued := func(lock string) bool {
		st, _ := etcdStatusOf(t, eps, lock)
		return st.Waiting == 1
	}
	escapeOnStore(t, eps[0], strings.TrimPrefix(eps[0], "http://"), args, queued, []escapeFault{
		{name: "stalled link", ordered: true, fault: func(t *testing.T, proxy *testenv.Proxy, lock string) { proxy.Stall() }},
		{name: "lease revoked", fault: func(t *testing.T, proxy *testenv.Proxy, lock string) {
			st, code := etcdStatusOf(t, eps, lock)
			if code != 0 {
				t.Fatalf("status exit %d", code)
			}
			if out, err := testenv.Etcdctl(t, eps, "lease", "revoke", filepath.Base(st.Key)); err != nil {
				t.Fatalf("etcdctl lease revoke: %v\n%s", err, out)
			}
		}},
	})
}

// TestEscapedHelperConsul: on Consul with a session TTL that leaves one
// grace of margin (10 s = deadline 9 s + grace 0.9 s + 0.1 s) and a
// lock-delay longer than the grace, so that a destroyed session keeps the
// key from the follower until the old tree is dead.
func TestEscapedHelperConsul(t *testing.T) {
	agent := testenv.StartConsul(t, testenv.ConsulOptions{})
	c := consulClient(t, agent.Addr())
	args := func(addr, lock, id string) []string {
		return []string{"--consul-addr", addr, "--lock", lock, "--identity", id, "--lease-duration", "10s",
			"--renew-deadline", "9s", "--retry-period", "2s", "--kill-grace", escapeGrace.String(), "--consul-lock-delay", "2s"}
	}
	queued := func(lock string) bool {
		out, _ := output(t, "status", "--json", "--consul-addr", agent.Addr(), "--lock", lock)
		return strings.Contains(out, `"waiting":1`)
	}
	escapeOnStore(t, agent.Addr(), agent.Addr(), args, queued, []escapeFault{
		{name: "stalled link", ordered: true, fault: func(t *testing.T, proxy *testenv.Proxy, lock string) { proxy.Stall() }},
		{name: "session destroyed", ordered: true, fault: func(t *testing.T, proxy *testenv.Proxy, lock string) {
			if _, err := c.Session().Destroy(consulHolder(t, c, lock), nil); err != nil {
				t.Fatal(err)
			}
		}},
	})
}
