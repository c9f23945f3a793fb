//go:build linux

package e2e

import (
	"encoding/json"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/leaderrun/leaderrun/internal/testenv"
)

// The tree dies even when leaderrun and its watchdog die together
// (docs/safety.md, S11). The scenario is written for any store:
// testKilledTogether takes what it needs of one (killedTogetherStore),
// so that a table of every store can run it.

// killedTogetherStore is what the scenario needs of a store.
type killedTogetherStore struct {
	// start starts the store for the test, if it has a server, and
	// returns the flags that point leaderrun (and `leaderrun status`) at
	// it. uid is the user leaderrun will run as (a store with files of
	// its own makes them that user's).
	start func(t *testing.T, uid int) []string
	// timings are the run's timing flags, --kill-grace among them; nil:
	// killedTimings. A store that refuses those (Consul's TTL is 10 s at
	// least) gives its own.
	timings []string
}

// killedTimings leave one grace of margin (L > D + G, with G the margin):
// a tree that outlives its grace would overlap the next leader's.
var killedTimings = []string{"--lease-duration", "3s", "--renew-deadline", "2s", "--retry-period", "500ms", "--kill-grace", "500ms"}

// testKilledTogether: leaderrun and its watchdog are SIGKILLed together
// while the command runs a grandchild in its group and a helper that left
// its session (setsid) and ignores SIGTERM, and a candidate waits for the
// lock. Both are frozen first (SIGSTOP), so that neither can act on the
// other's death: what ends the tree is what S11 names, not S10. As root
// (the command's cgroup, and its keeper): every process of the tree is
// gone within --kill-grace of the SIGKILL, the candidate's command,
// first thing when it starts, finds none of them running, and the
// command's cgroup is removed. As a user without a writable cgroup (the
// documented fallback): the command and its group die, the helper that
// left the group lives on, and the candidate's command starts beside it.
func testKilledTogether(t *testing.T, st killedTogetherStore) {
	if os.Geteuid() != 0 {
		t.Skip("needs root: it runs leaderrun as root with a cgroup, and as another user without one")
	}
	if _, err := exec.LookPath("setsid"); err != nil {
		testenv.Missing(t, "setsid(1) from util-linux is not installed")
	}
	for _, tc := range []struct {
		name     string
		uid      int
		fallback bool
	}{{name: "root, cgroup"}, {name: "user without a writable cgroup", uid: nobody, fallback: true}} {
		t.Run(tc.name, func(t *testing.T) { killedTogetherTrial(t, st, tc.uid, tc.fallback) })
	}
}

// killedTogetherTrial is one case of testKilledTogether.
func killedTogetherTrial(t *testing.T, st killedTogetherStore, uid int, fallback bool) {
	dir, bin := userDir(t)
	if err := os.Chown(dir, uid, uid); err != nil {
		t.Fatal(err)
	}
	storeFlags, timings := st.start(t, uid), st.timings
	if timings == nil {
		timings = killedTimings
	}
	flags := append(append([]string(nil), storeFlags...), timings...)
	grace, err := time.ParseDuration(timings[slices.Index(timings, "--kill-grace")+1])
	if err != nil {
		t.Fatal(err)
	}
	lock := fmt.Sprintf("together-%d", time.Now().UnixNano()%1e6)
	sys := func() *syscall.SysProcAttr {
		s := &syscall.SysProcAttr{Setpgid: true}
		if uid != 0 {
			s.Credential = &syscall.Credential{Uid: uint32(uid), Gid: uint32(uid)}
		}
		return s
	}
	old, violations, started := filepath.Join(dir, "old"), filepath.Join(dir, "violations"), filepath.Join(dir, "started")
	// The job records its grandchild's pid, its helper's and its own.
	job := `sleep 3600 & echo $! > ` + old + `.grandchild
setsid sh -c 'trap "" TERM; echo $$ > ` + old + `.helper.tmp; mv ` + old + `.helper.tmp ` + old + `.helper; exec sleep 3600' </dev/null >/dev/null 2>&1 &
echo $$ > ` + old + `.job
trap "" TERM
while :; do sleep 0.05; done`
	// Whether a process of the old tree runs: it exists and is not a
	// zombie (the state after the last ')' of its stat).
	candidateJob := `for p in $(cat ` + old + `.*); do
  s=$(sed 's/.*) //' /proc/$p/stat 2>/dev/null | cut -c1)
  if [ -n "$s" ] && [ "$s" != Z ] && [ "$s" != X ]; then echo "$p $s" >> ` + violations + `; fi
done
echo started > ` + started
	run := func(id, script string, extra ...string) *proc {
		args := append(append(append([]string{"--lock", lock, "--identity", id, "--log-format", "json"}, flags...), extra...), "--shell", "--", script)
		return startWith(t, sys(), bin, args...)
	}
	leader := run("leader", job)
	guard := guardOf(t, leader)
	if want := map[bool]string{false: "cgroup (", true: "subreaper ("}[fallback]; !strings.HasPrefix(guard, want) {
		t.Fatalf("the run's guard is %q, want %s...)", guard, want)
	}
	tree := map[string]*testenv.Process{}
	for _, name := range []string{"grandchild", "helper", "job"} {
		var pids []int
		waitFor(t, 10*time.Second, "the "+name+"'s pid", func() bool {
			pids = readPids(old + "." + name)
			return len(pids) == 1
		})
		tree[name] = testenv.Watch(t, pids[0])
	}
	helper := tree["helper"].Pid
	dog := parentOf(t, tree["job"].Pid)
	candidate := run("candidate", candidateJob, "--wait", "60s")
	waitFor(t, 20*time.Second, "the candidate to queue", func() bool { return waiting(t, bin, sys(), lock, storeFlags) == 1 })

	for _, pid := range []int{leader.cmd.Process.Pid, dog} {
		if err := syscall.Kill(pid, syscall.SIGSTOP); err != nil {
			t.Fatal(err)
		}
	}
	killed := time.Now()
	for _, pid := range []int{leader.cmd.Process.Pid, dog} {
		if err := syscall.Kill(pid, syscall.SIGKILL); err != nil {
			t.Fatal(err)
		}
	}
	t.Logf("guard %s; leaderrun %d and its watchdog %d SIGKILLed together", guard, leader.cmd.Process.Pid, dog)
	checkTreeDeath(t, tree, killed, grace, fallback)
	if code := candidate.wait(30 * time.Second); code != 0 {
		t.Fatalf("the candidate exited %d", code)
	}
	if _, err := os.Stat(started); err != nil {
		t.Fatalf("the candidate's command did not run: %v", err)
	}
	data, err := os.ReadFile(violations)
	switch {
	case !fallback && err == nil:
		t.Errorf("the candidate's command started while the old tree ran (pid state): %s", data)
	case fallback && !strings.Contains(string(data), strconv.Itoa(helper)+" "):
		t.Errorf("fallback: the candidate's command did not find the helper %d running (%q), as docs/safety.md says it does without a cgroup", helper, data)
	}
	if fallback {
		_ = syscall.Kill(helper, syscall.SIGKILL)
	}
	if cgroup, ok := strings.CutPrefix(guard, "cgroup ("); ok {
		cgroup = strings.TrimSuffix(cgroup, ")")
		waitFor(t, 5*time.Second, "the command's cgroup to be removed", func() bool {
			_, err := os.Stat(cgroup)
			return os.IsNotExist(err)
		})
	}
}

// checkTreeDeath: every process of the tree is gone within --kill-grace
// of the SIGKILL; in the fallback, all but the helper that left the group
// (which the candidate's command then finds running).
func checkTreeDeath(t *testing.T, tree map[string]*testenv.Process, killed time.Time, grace time.Duration, fallback bool) {
	t.Helper()
	for name, p := range tree {
		if fallback && name == "helper" {
			continue
		}
		after := p.Died(t, 10*time.Second).Sub(killed)
		t.Logf("%s %d gone %v after leaderrun and its watchdog", name, p.Pid, after.Round(time.Millisecond))
		if after > grace {
			t.Errorf("%s %d gone %v after leaderrun and its watchdog were SIGKILLed: more than --kill-grace %v", name, p.Pid, after, grace)
		}
	}
}

// waiting is how many candidates wait for lock, as `leaderrun status
// --json` says.
func waiting(t *testing.T, bin string, sys *syscall.SysProcAttr, lock string, flags []string) int {
	t.Helper()
	cmd := exec.Command(bin, append([]string{"status", "--json", "--lock", lock}, flags...)...)
	cmd.SysProcAttr = sys
	out, _ := cmd.Output()
	var st struct {
		Waiting int `json:"waiting"`
	}
	_ = json.Unmarshal(out, &st)
	return st.Waiting
}

// TestKilledTogetherLocal runs the scenario on the local store.
func TestKilledTogetherLocal(t *testing.T) {
	testKilledTogether(t, killedTogetherStore{start: func(t *testing.T, uid int) []string {
		state, err := os.MkdirTemp("", "leaderrun-e2e-state-")
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { os.RemoveAll(state) })
		if err := os.Chown(state, uid, uid); err != nil {
			t.Fatal(err)
		}
		return []string{"--backend", "local", "--state-dir", state}
	}})
}

// TestKilledTogetherEtcd runs the scenario on etcd.
func TestKilledTogetherEtcd(t *testing.T) {
	testKilledTogether(t, killedTogetherStore{start: func(t *testing.T, _ int) []string {
		return []string{"--etcd-endpoints", strings.Join(testenv.StartEtcd(t, 1).Endpoints(), ",")}
	}})
}
