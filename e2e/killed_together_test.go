//go:build linux

package e2e

import (
	"encoding/json"
	"errors"
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

// testKilledTogether (issue 42; docs/safety.md, S11): leaderrun and its
// watchdog are SIGKILLed together while the command runs a grandchild in
// its group and a helper that left its session (setsid) and ignores
// SIGTERM, and a candidate waits for the lock. Both are frozen first
// (SIGSTOP), so that neither can act on the other's death: what ends the
// tree is what S11 names, not S10. As root (the command's cgroup, and its
// keeper): every process of the tree is gone within --kill-grace of the
// SIGKILL, the candidate's command, first thing when it starts, finds none
// of them running, and the command's cgroup is removed. As a user without
// a writable cgroup (the documented fallback): the command and its group
// die, the helper that left the group lives on, and the candidate's
// command starts beside it. The store's own timings leave the grace of
// margin the scenario needs (lease > deadline + grace).
func testKilledTogether(t *testing.T, e *env) {
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
		t.Run(tc.name, func(t *testing.T) { killedTogetherTrial(t, e, tc.uid, tc.fallback) })
	}
}

// userFlags are the target's flags for a run as uid: a directory they
// name (the local store's --state-dir, which must be its user's) is
// replaced by a new one of uid's (own is then true); and the files that the
// flags and the environment name (a kubeconfig and the CA file it names,
// a password file), left root's, may be read by anyone, and the test's
// temporary directories above them entered.
func userFlags(t *testing.T, e *env, uid int) (flags []string, own bool) {
	t.Helper()
	tmp := filepath.Clean(os.TempDir()) + string(filepath.Separator)
	seen := map[string]bool{}
	var share func(path string, named bool)
	share = func(path string, named bool) {
		fi, err := os.Stat(path)
		if err != nil || seen[path] || !fi.Mode().IsRegular() || !strings.HasPrefix(path, tmp) {
			return
		}
		seen[path] = true
		if err := os.Chmod(path, fi.Mode().Perm()|0o004); err != nil {
			t.Fatal(err)
		}
		for dir := filepath.Dir(path); strings.HasPrefix(dir, tmp); dir = filepath.Dir(dir) {
			if di, err := os.Stat(dir); err == nil {
				if err := os.Chmod(dir, di.Mode().Perm()|0o001); err != nil {
					t.Fatal(err)
				}
			}
		}
		if !named {
			// The files a kubeconfig names (its CA file).
			data, _ := os.ReadFile(path)
			for _, line := range strings.Split(string(data), "\n") {
				if _, v, ok := strings.Cut(line, ": "); ok {
					share(strings.TrimSpace(v), true)
				}
			}
		}
	}
	for _, kv := range e.target.env {
		_, v, _ := strings.Cut(kv, "=")
		share(v, false)
	}
	for _, v := range e.flags {
		if fi, err := os.Stat(v); err == nil && fi.IsDir() && strings.HasPrefix(v, tmp) {
			d, err := os.MkdirTemp("", "leaderrun-e2e-state-")
			if err != nil {
				t.Fatal(err)
			}
			t.Cleanup(func() { os.RemoveAll(d) })
			if err := os.Chown(d, uid, uid); err != nil {
				t.Fatal(err)
			}
			v, own = d, true
		} else {
			share(v, false)
		}
		flags = append(flags, v)
	}
	return flags, own
}

// statusWaitingAs is target.waiting for a run as uid on flags: status,
// run as uid too, counts a waiter more than before.
func statusWaitingAs(t *testing.T, bin string, sys *syscall.SysProcAttr, env, flags []string, lock string) func(*proc) bool {
	t.Helper()
	count := func() int {
		cmd := exec.Command(bin, append([]string{"status", "--json", "--lock", lock}, flags...)...)
		cmd.Env, cmd.SysProcAttr = append(os.Environ(), env...), sys
		out, _ := cmd.Output()
		var st struct {
			Waiting int `json:"waiting"`
		}
		_ = json.Unmarshal(out, &st)
		return st.Waiting
	}
	before := max(count(), 0)
	waits := every(20*time.Millisecond, func() bool { return count() > before })
	return func(*proc) bool { return waits() }
}

// killedTogetherTrial is one case of testKilledTogether.
func killedTogetherTrial(t *testing.T, e *env, uid int, fallback bool) {
	dir, bin := userDir(t)
	if err := os.Chown(dir, uid, uid); err != nil {
		t.Fatal(err)
	}
	// The companion, for the stores it serves (S3, DynamoDB).
	install(t, filepath.Join(filepath.Dir(testenv.Leaderrun(t)), "leaderrun-aws"), filepath.Join(dir, "leaderrun-aws"))
	flags, ownDir := e.flags, false
	if uid != 0 {
		flags, ownDir = userFlags(t, e, uid)
	}
	grace := e.timings.grace
	lock := e.lock(map[bool]string{false: "root", true: "user"}[fallback])
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
		args := append(e.argsWith(flags, lock, id, append([]string{"--log-format", "json"}, extra...)...), "--shell", "--", script)
		return startEnv(t, sys(), bin, e.target.env, args...)
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
	waiting := e.waiting(t, lock)
	if ownDir {
		waiting = statusWaitingAs(t, bin, sys(), e.target.env, flags, lock)
	}
	candidate := run("candidate", candidateJob, "--wait", (e.takeover + 60*time.Second).String())
	waitFor(t, 20*time.Second, "the candidate to wait for the lock", func() bool { return candidate.exited() || waiting(candidate) })
	if candidate.exited() {
		t.Fatalf("the candidate exited %d instead of waiting:\n%s", candidate.code, candidate.stderr.String())
	}

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
	if code := candidate.wait(e.takeover + 30*time.Second); code != 0 {
		t.Fatalf("the candidate exited %d:\n%s", code, candidate.stderr.String())
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

// startEnv is startWith with env added to the test's environment.
func startEnv(t *testing.T, sys *syscall.SysProcAttr, bin string, env []string, args ...string) *proc {
	t.Helper()
	cmd := exec.Command(bin, args...)
	cmd.Env = append(os.Environ(), env...)
	p := &proc{t: t, cmd: cmd, stderr: &syncBuffer{}, done: make(chan struct{})}
	cmd.Stderr, cmd.Stdout, cmd.SysProcAttr = p.stderr, p.stderr, sys
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	go func() {
		defer close(p.done)
		var ee *exec.ExitError
		if err := cmd.Wait(); errors.As(err, &ee) {
			p.code = ee.ExitCode()
		}
	}()
	t.Cleanup(func() {
		_ = syscall.Kill(-cmd.Process.Pid, syscall.SIGKILL)
		<-p.done
		if t.Failed() {
			t.Logf("leaderrun %v output:\n%s", args, p.stderr.String())
		}
	})
	return p
}
