//go:build linux

package e2e

import (
	"bufio"
	"bytes"
	"encoding/json"
	"errors"
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

// The watchdog holds what must hold while leaderrun itself is frozen or
// dead (docs/safety.md, S10): the renew deadline, the stop sequence, the
// whole tree, and on the local backend the lock.

// frozenTrials is how many times each frozen-leaderrun test freezes a
// leader.
const frozenTrials = 5

// frozenCase is one store for the frozen-leaderrun tests.
type frozenCase struct {
	// args are a run's flags for lock and identity, timings included.
	args func(lock, id string) []string
	// queued reports whether one candidate waits for lock.
	queued func(lock string) bool
	// deadline is --renew-deadline; freeze, how long leaderrun is frozen
	// (2 × --lease-duration).
	deadline, freeze time.Duration
	// expires: the store lets the lease go while leaderrun is frozen, so
	// the standby takes over during the freeze (a flock is held by the
	// frozen process until it resumes and releases it).
	expires bool
}

// frozenLeader freezes leaderrun alone (SIGSTOP of its process, not of its
// group: the watchdog and the child run on) while its child runs and a
// standby waits, for 2 × the lease. The watchdog must send the child the
// kill signal at the renew deadline, by its own clock, and the child's
// last record must come before the standby's child starts: on a store
// whose lease expires meanwhile, the standby takes over during the
// freeze, and without the watchdog the two jobs would run side by side.
func frozenLeader(t *testing.T, fc frozenCase) {
	for trial := range frozenTrials {
		t.Run(strconv.Itoa(trial), func(t *testing.T) {
			events := filepath.Join(t.TempDir(), "events")
			lock := fmt.Sprintf("frozen-%d-%d", time.Now().UnixNano()%1e6, trial)
			leader := start(t, childEnv(events, "forever"), append(fc.args(lock, "leader"), cmdArgs(t, nil)...)...)
			waitEvents(t, events, 10*time.Second, "the leader's child", etcdHas("start", "leader"))
			follower := start(t, childEnv(events, "forever"), append(fc.args(lock, "follower"), cmdArgs(t, nil)...)...)
			waitFor(t, 20*time.Second, "the standby to queue", func() bool { return fc.queued(lock) })
			leader.signal(syscall.SIGSTOP)
			frozen := time.Now()
			// The fault itself: leaderrun stays frozen this long.
			time.Sleep(fc.freeze)
			resumed := time.Now()
			leader.signal(syscall.SIGCONT)
			evs := waitEvents(t, events, 30*time.Second, "the standby's child", etcdHas("start", "follower"))
			next, _ := etcdFind(evs, "start", "follower")
			sig, signalled := etcdFind(evs, "signal", "leader")
			var last event
			for _, e := range evs {
				if e.ID == "leader" {
					last = e
				}
			}
			t.Logf("frozen %v; child signalled %v into the freeze, its last record %v into it (%s); standby's child started %v into it",
				resumed.Sub(frozen).Round(time.Millisecond), sig.At.Sub(frozen).Round(time.Millisecond),
				last.At.Sub(frozen).Round(time.Millisecond), last.Kind, next.At.Sub(frozen).Round(time.Millisecond))
			switch {
			case !signalled:
				t.Errorf("the child was never signalled:\n%s", formatEvents(evs))
			case sig.At.After(frozen.Add(fc.deadline + 100*time.Millisecond)):
				// The last deadline leaderrun sent was at most
				// --renew-deadline after the freeze.
				t.Errorf("the child was signalled %v into the freeze: later than --renew-deadline %v + 100ms", sig.At.Sub(frozen), fc.deadline)
			}
			if !last.At.Before(next.At) {
				t.Errorf("the frozen leader's child recorded %q %v after the standby's child started: two jobs at once\n%s",
					last.Kind, last.At.Sub(next.At), formatEvents(evs))
			}
			if fc.expires && !next.At.Before(resumed) {
				t.Errorf("the standby took over only after leaderrun resumed: the freeze did not outlast the lease")
			}
			if code := leader.wait(15 * time.Second); code != 76 {
				t.Errorf("the frozen leader exited %d, want 76", code)
			}
			follower.signal(syscall.SIGTERM)
			follower.wait(10 * time.Second)
		})
	}
}

// TestFrozenLeaderrunLocal: on the local backend a flock does not expire,
// so the standby takes over only once leaderrun resumed and released it;
// the watchdog stopped the child at the deadline all the same.
func TestFrozenLeaderrunLocal(t *testing.T) {
	dir := t.TempDir()
	frozenLeader(t, frozenCase{
		args: func(lock, id string) []string {
			return []string{"--backend", "local", "--state-dir", dir, "--lock", lock, "--identity", id,
				"--lease-duration", "2s", "--renew-deadline", "1s", "--retry-period", "200ms", "--kill-grace", "500ms"}
		},
		queued: func(lock string) bool {
			out, _ := output(t, "status", "--json", "--backend", "local", "--state-dir", dir, "--lock", lock)
			return strings.Contains(out, `"waiting":1`)
		},
		deadline: time.Second, freeze: 4 * time.Second,
	})
}

// TestFrozenLeaderrunEtcd: etcd expires the frozen leader's lease and the
// standby takes over while leaderrun is still frozen.
func TestFrozenLeaderrunEtcd(t *testing.T) {
	eps := testenv.StartEtcd(t, 1).Endpoints()
	frozenLeader(t, frozenCase{
		args: func(lock, id string) []string {
			return append([]string{"--etcd-endpoints", strings.Join(eps, ","), "--lock", lock, "--identity", id}, etcdTimings...)
		},
		queued: func(lock string) bool {
			st, _ := etcdStatusOf(t, eps, lock)
			return st.Waiting == 1
		},
		deadline: 2 * time.Second, freeze: 2 * etcdLease, expires: true,
	})
}

// nobody is the unprivileged user the tests run leaderrun as.
const nobody = 65534

// userDir is a new directory that another user may enter, with the
// leaderrun binary copied into it (the test build's own directory, like
// t.TempDir's, is root's alone).
func userDir(t *testing.T) (dir, bin string) {
	t.Helper()
	dir, err := os.MkdirTemp("", "leaderrun-e2e-")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { os.RemoveAll(dir) })
	if err := os.Chmod(dir, 0o755); err != nil {
		t.Fatal(err)
	}
	bin = filepath.Join(dir, "leaderrun")
	testenv.CopyExecutable(t, testenv.Leaderrun(t), bin)
	return dir, bin
}

// cgroup2Dir is the test process's own cgroup directory in the cgroup v2
// hierarchy (found as the watchdog finds it), "" if there is none.
func cgroup2Dir(t *testing.T) string {
	t.Helper()
	data, _ := os.ReadFile("/proc/self/cgroup")
	var path string
	for _, line := range strings.Split(string(data), "\n") {
		if p, ok := strings.CutPrefix(line, "0::"); ok {
			path = p
		}
	}
	mounts, _ := os.ReadFile("/proc/self/mountinfo")
	sc := bufio.NewScanner(bytes.NewReader(mounts))
	for sc.Scan() {
		f := strings.Fields(sc.Text())
		for i, v := range f {
			if v == "-" && i+1 < len(f) && f[i+1] == "cgroup2" && path != "" && (f[3] == "/" || strings.HasPrefix(path, f[3])) {
				return filepath.Join(f[4], strings.TrimPrefix(path, strings.TrimSuffix(f[3], "/")))
			}
		}
	}
	return ""
}

// delegatedCgroup makes a cgroup below the test's own and hands it to uid,
// as systemd does for a unit with Delegate=yes: the directory and its
// cgroup.procs, cgroup.threads and cgroup.subtree_control become uid's.
func delegatedCgroup(t *testing.T, uid int) (dir string, fd int) {
	t.Helper()
	parent := cgroup2Dir(t)
	if parent == "" {
		testenv.Missing(t, "no cgroup v2 hierarchy on this host")
	}
	dir = filepath.Join(parent, fmt.Sprintf("leaderrun-e2e-%d", os.Getpid()))
	if err := os.Mkdir(dir, 0o755); err != nil {
		t.Fatalf("make a cgroup to delegate: %v", err)
	}
	t.Cleanup(func() {
		if err := os.Remove(dir); err != nil {
			t.Errorf("remove the delegated cgroup: %v (something the command started is still in it?)", err)
		}
	})
	for _, f := range []string{"", "cgroup.procs", "cgroup.threads", "cgroup.subtree_control"} {
		if err := os.Chown(filepath.Join(dir, f), uid, uid); err != nil {
			t.Fatal(err)
		}
	}
	fd, err := syscall.Open(dir, syscall.O_RDONLY|syscall.O_DIRECTORY|syscall.O_CLOEXEC, 0)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { syscall.Close(fd) })
	return dir, fd
}

// startWith runs bin with args as start does, with its own process
// attributes (a user, a cgroup).
func startWith(t *testing.T, sys *syscall.SysProcAttr, bin string, args ...string) *proc {
	t.Helper()
	cmd := exec.Command(bin, args...)
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
			t.Logf("leaderrun output:\n%s", p.stderr.String())
		}
	})
	return p
}

// guardOf is the guard that leaderrun's JSON log says the run has.
func guardOf(t *testing.T, p *proc) string {
	t.Helper()
	var guard string
	waitFor(t, 10*time.Second, `the "child started" line`, func() bool {
		for _, line := range strings.Split(p.stderr.String(), "\n") {
			var l struct {
				Msg   string `json:"msg"`
				Guard string `json:"guard"`
			}
			if json.Unmarshal([]byte(line), &l) == nil && l.Msg == "child started" {
				guard = l.Guard
				return true
			}
		}
		return false
	})
	return guard
}

// TestLeaderrunKilledTreeGone (S4, S10): leaderrun killed with SIGKILL
// while its job runs a helper that left the job's session (setsid) and
// ignores SIGTERM, and the job ignores SIGTERM too: every process of the
// tree is gone within --kill-grace + 100 ms, in each environment
// docs/safety.md names: as root (a cgroup of the command's own), as a user
// in a delegated cgroup (a unit with Delegate=yes: a cgroup below it), and
// as a user without a writable cgroup (the watchdog as a child subreaper,
// the documented fallback, which promises the same).
func TestLeaderrunKilledTreeGone(t *testing.T) {
	if os.Geteuid() != 0 {
		t.Skip("needs root: it makes cgroups and runs leaderrun as another user")
	}
	if _, err := exec.LookPath("setsid"); err != nil {
		testenv.Missing(t, "setsid(1) from util-linux is not installed")
	}
	const grace = time.Second
	cases := []struct {
		name string
		// user: run leaderrun as nobody; delegate: inside a cgroup
		// delegated to nobody.
		user, delegate bool
		guard          string
	}{
		{name: "root", guard: "cgroup"},
		{name: "delegated cgroup", user: true, delegate: true, guard: "cgroup"},
		{name: "no writable cgroup", user: true, guard: "subreaper"},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			dir, bin := userDir(t)
			uid := 0
			sys := &syscall.SysProcAttr{Setpgid: true}
			if tc.user {
				uid = nobody
				sys.Credential = &syscall.Credential{Uid: nobody, Gid: nobody}
			}
			var delegated string
			if tc.delegate {
				var fd int
				delegated, fd = delegatedCgroup(t, uid)
				sys.UseCgroupFD, sys.CgroupFD = true, fd
			}
			state, pids := filepath.Join(dir, "state"), filepath.Join(dir, "pids")
			for _, d := range []string{state, pids} {
				if err := os.Mkdir(d, 0o700); err != nil {
					t.Fatal(err)
				}
				if err := os.Chown(d, uid, uid); err != nil {
					t.Fatal(err)
				}
			}
			job := `setsid sh -c 'trap "" TERM; echo $$ > ` + pids + `/helper.tmp; mv ` + pids + `/helper.tmp ` + pids + `/helper; exec sleep 3600' </dev/null >/dev/null 2>&1 &
while [ ! -s ` + pids + `/helper ]; do sleep 0.01; done
trap "" TERM; echo $$ > ` + pids + `/job.tmp; mv ` + pids + `/job.tmp ` + pids + `/job
while :; do sleep 0.05; done`
			p := startWith(t, sys, bin, "--backend", "local", "--state-dir", state, "--lock", "tree", "--log-format", "json",
				"--lease-duration", "4s", "--renew-deadline", "2s", "--retry-period", "200ms", "--kill-grace", grace.String(), "--shell", "--", job)
			guard := guardOf(t, p)
			t.Logf("guard: %s", guard)
			if !strings.HasPrefix(guard, tc.guard+" ") {
				t.Fatalf("the run's guard is %q, want %s", guard, tc.guard)
			}
			cgroup := strings.TrimSuffix(strings.TrimPrefix(guard, "cgroup ("), ")")
			if tc.delegate && !strings.HasPrefix(cgroup, delegated+"/") {
				t.Errorf("the command's cgroup %s is not below the delegated %s", cgroup, delegated)
			}
			var tree []*testenv.Process
			for _, name := range []string{"job", "helper"} {
				var pid int
				waitFor(t, 10*time.Second, "the "+name+"'s pid", func() bool {
					data, err := os.ReadFile(filepath.Join(pids, name))
					pid, _ = strconv.Atoi(strings.TrimSpace(string(data)))
					return err == nil && pid > 0
				})
				if tc.guard == "cgroup" {
					data, _ := os.ReadFile(fmt.Sprintf("/proc/%d/cgroup", pid))
					if !strings.HasSuffix(strings.TrimSpace(string(data)), "/"+filepath.Base(cgroup)) {
						t.Errorf("the %s %d is in %q, not in the command's cgroup %s", name, pid, data, cgroup)
					}
				}
				tree = append(tree, testenv.Watch(t, pid))
			}
			killed := time.Now()
			if err := p.cmd.Process.Kill(); err != nil {
				t.Fatal(err)
			}
			for _, proc := range tree {
				after := proc.Died(t, 10*time.Second).Sub(killed)
				t.Logf("process %d gone %v after the SIGKILL of leaderrun", proc.Pid, after.Round(time.Millisecond))
				if after > grace+100*time.Millisecond {
					t.Errorf("process %d of the tree gone %v after leaderrun's SIGKILL: more than --kill-grace %v + 100ms", proc.Pid, after, grace)
				}
			}
			if tc.guard == "cgroup" {
				waitFor(t, 5*time.Second, "the command's cgroup to be removed", func() bool {
					_, err := os.Stat(cgroup)
					return errors.Is(err, os.ErrNotExist)
				})
			}
			if tc.delegate {
				// The watchdog itself ran in the delegated cgroup, as
				// leaderrun did: it leaves once the tree is gone.
				waitFor(t, 5*time.Second, "the watchdog to leave the delegated cgroup", func() bool {
					data, _ := os.ReadFile(filepath.Join(delegated, "cgroup.events"))
					return strings.Contains(string(data), "populated 0")
				})
			}
		})
	}
}

// TestLocalSigkillHandoverTreeGone (S10, local backend): leaderrun killed
// with SIGKILL while its job runs, with a helper that left its session and
// ignores SIGTERM, and a candidate waits: 20 times, the candidate's job,
// first thing when it starts, finds no process of the old tree running.
// The watchdog holds the lock file's descriptor until the old tree is
// gone; the kernel would otherwise hand the flock on the moment leaderrun
// died. A watchdog that kills the tree within a millisecond of leaderrun's
// death mostly wins that race anyway: the second case holds the watchdog
// back for 300 ms around leaderrun's death, as a starved one would be
// (frozen in a cgroup: a SIGSTOP would not do, the kernel sends SIGCONT to
// a stopped process whose group its parent's death orphans), which without
// the descriptor fails every trial.
func TestLocalSigkillHandoverTreeGone(t *testing.T) {
	if _, err := exec.LookPath("setsid"); err != nil {
		testenv.Missing(t, "setsid(1) from util-linux is not installed")
	}
	cases := []struct {
		name     string
		trials   int
		holdBack time.Duration
	}{
		{name: "SIGKILL", trials: 20},
		{name: "SIGKILL, watchdog held back", trials: 5, holdBack: 300 * time.Millisecond},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			if tc.holdBack > 0 && os.Geteuid() != 0 {
				t.Skip("needs root to freeze the watchdog in a cgroup")
			}
			for trial := range tc.trials {
				handoverTrial(t, trial, tc.holdBack)
			}
		})
	}
}

// handoverTrial is one trial of TestLocalSigkillHandoverTreeGone.
func handoverTrial(t *testing.T, trial int, holdBack time.Duration) {
	t.Helper()
	dir := t.TempDir()
	old, newJob, violations := filepath.Join(dir, "old"), filepath.Join(dir, "new"), filepath.Join(dir, "violations")
	// The job records its pid first, then the helper's.
	leaderJob := `echo $$ >> ` + old + `
setsid sh -c 'trap "" TERM; echo $$ >> ` + old + `; exec sleep 3600' </dev/null >/dev/null 2>&1 &
while :; do sleep 0.05; done`
	// Whether a process of the old tree runs: it exists and is not a
	// zombie (the state after the last ')' of its stat).
	candidateJob := `for p in $(cat ` + old + `); do
  s=$(sed 's/.*) //' /proc/$p/stat 2>/dev/null | cut -c1)
  if [ -n "$s" ] && [ "$s" != Z ] && [ "$s" != X ]; then echo "$p $s" >> ` + violations + `; fi
done
echo started > ` + newJob
	leader := start(t, nil, localArgs(dir, "handover", "--identity", "leader", "--shell", "--", leaderJob)...)
	var pids []int
	waitFor(t, 10*time.Second, "the old job and its helper", func() bool {
		pids = readPids(old)
		return len(pids) == 2
	})
	candidate := start(t, nil, localArgs(dir, "handover", "--identity", "candidate", "--shell", "--", candidateJob)...)
	waitFor(t, 10*time.Second, "the candidate to queue", func() bool {
		out, _ := output(t, "status", "--json", "--backend", "local", "--state-dir", dir, "--lock", "handover")
		return strings.Contains(out, `"waiting":1`)
	})
	var thaw func()
	if holdBack > 0 {
		thaw = freeze(t, parentOf(t, pids[0]))
	}
	if err := leader.cmd.Process.Kill(); err != nil {
		t.Fatal(err)
	}
	if holdBack > 0 {
		// The fault: the watchdog gets no CPU for this long.
		time.Sleep(holdBack)
		thaw()
	}
	if code := candidate.wait(10 * time.Second); code != 0 {
		t.Fatalf("trial %d: the candidate exited %d", trial, code)
	}
	if _, err := os.Stat(newJob); err != nil {
		t.Fatalf("trial %d: the candidate's job did not run: %v", trial, err)
	}
	if data, err := os.ReadFile(violations); err == nil {
		t.Errorf("trial %d: the candidate's job started while the old tree ran (pid state): %s", trial, data)
	}
	for _, pid := range pids {
		if alive(pid) {
			t.Errorf("trial %d: process %d of the old tree outlived the handover", trial, pid)
		}
	}
}

// freeze moves pid into a cgroup of its own and freezes it there; thaw
// lets it run again. The cgroup goes when the test ends.
func freeze(t *testing.T, pid int) (thaw func()) {
	t.Helper()
	parent := cgroup2Dir(t)
	if parent == "" {
		testenv.Missing(t, "no cgroup v2 hierarchy on this host")
	}
	dir, err := os.MkdirTemp(parent, "leaderrun-e2e-frozen-")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		waitFor(t, 10*time.Second, "the frozen process to leave its cgroup", func() bool { return os.Remove(dir) == nil })
	})
	write := func(name, value string) {
		if err := os.WriteFile(filepath.Join(dir, name), []byte(value), 0); err != nil {
			t.Fatal(err)
		}
	}
	write("cgroup.procs", strconv.Itoa(pid))
	write("cgroup.freeze", "1")
	waitFor(t, 5*time.Second, "the cgroup to freeze", func() bool {
		data, _ := os.ReadFile(filepath.Join(dir, "cgroup.events"))
		return strings.Contains(string(data), "frozen 1")
	})
	return func() { write("cgroup.freeze", "0") }
}

// parentOf is pid's parent, from /proc/PID/stat.
func parentOf(t *testing.T, pid int) int {
	t.Helper()
	data, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", pid))
	if err != nil {
		t.Fatal(err)
	}
	f := strings.Fields(string(data[bytes.LastIndexByte(data, ')')+1:]))
	ppid, _ := strconv.Atoi(f[1])
	return ppid
}

// TestWatchdogInit: the watchdog takes the process over before the stores'
// clients, protobuf's descriptors or log/slog are initialised, in
// leaderrun and in leaderrun-aws: what they allocate would be paid
// once per leading instance (signals/watchdog/doc.go).
func TestWatchdogInit(t *testing.T) {
	bin := testenv.Leaderrun(t)
	for _, path := range []string{bin, filepath.Join(filepath.Dir(bin), "leaderrun-aws")} {
		// fd 3 is no socket: the watchdog refuses to run (exit 64), after
		// the packages before it were initialised.
		cmd := exec.Command(path, "_leaderrun_watchdog")
		cmd.Env = append(os.Environ(), "GODEBUG=inittrace=1")
		out, err := cmd.CombinedOutput()
		var exit *exec.ExitError
		if !errors.As(err, &exit) || exit.ExitCode() != 64 {
			t.Fatalf("%s _leaderrun_watchdog: %v, want exit 64\n%s", path, err, out)
		}
		// init PKG @0.5 ms, 0.02 ms clock, 48 bytes, 1 allocs
		var inits []string
		bytes := 0
		for _, line := range strings.Split(string(out), "\n") {
			if f := strings.Fields(line); len(f) > 8 && f[0] == "init" && f[8] == "bytes," {
				inits = append(inits, f[1])
				n, _ := strconv.Atoi(f[7])
				bytes += n
			}
		}
		if !slices.Contains(inits, "golang.org/x/sys/unix") {
			t.Fatalf("%s: no init trace of the watchdog's imports:\n%s", path, out)
		}
		for _, pkg := range inits {
			for _, late := range []string{"log/slog", "google.golang.org/protobuf/reflect/", "google.golang.org/protobuf/types/",
				"google.golang.org/genproto/", "go.etcd.io/", "k8s.io/", "github.com/hashicorp/", "github.com/go-zookeeper/", "github.com/aws/aws-sdk-go-v2/service/"} {
				if strings.HasPrefix(pkg, late) {
					t.Errorf("%s: %s was initialised before the watchdog took over", filepath.Base(path), pkg)
				}
			}
		}
		// 416 KB when the takeover waited for log/slog; 83 KB since.
		if bytes > 128<<10 {
			t.Errorf("%s: the packages initialised before the watchdog took over allocated %d bytes, want at most 128 KiB", filepath.Base(path), bytes)
		}
		t.Logf("%s: %d packages, %d bytes allocated, before the watchdog took over", filepath.Base(path), len(inits), bytes)
	}
}

// TestWatchdogLaunchedAtStart: leaderrun launches its watchdog as soon as
// cmd has decided that the command line is a run, with "--" or without,
// and the run adopts it and configures it: the command's parent is the
// watchdog that the log names, and it catches --kill-signal. A run that
// ends before it adopts the watchdog (a bad flag) leaves nothing behind
// that holds leaderrun's output open: a cron mail or a pipe ends with
// leaderrun.
func TestWatchdogLaunchedAtStart(t *testing.T) {
	bin := testenv.Leaderrun(t)
	state := t.TempDir()
	job := `echo "parent=$PPID $(cat /proc/$PPID/comm)"; grep SigCgt /proc/$PPID/status`
	run := func(args ...string) (adopted, parent int, comm string, caught uint64) {
		t.Helper()
		cmd := exec.Command(bin, append([]string{"--backend", "local", "--state-dir", state, "--lock", "early",
			"--log-level", "debug", "--log-format", "json", "--kill-signal", "SIGUSR1"}, args...)...)
		out, err := cmd.CombinedOutput()
		if err != nil {
			t.Fatalf("%v: %v\n%s", args, err, out)
		}
		for _, line := range strings.Split(string(out), "\n") {
			var rec struct {
				Msg      string `json:"msg"`
				Watchdog int    `json:"watchdog"`
			}
			if json.Unmarshal([]byte(line), &rec) == nil && rec.Msg == "adopted the watchdog launched at start" {
				adopted = rec.Watchdog
			}
			if v, ok := strings.CutPrefix(line, "parent="); ok {
				p, c, _ := strings.Cut(v, " ")
				parent, _ = strconv.Atoi(p)
				comm = c
			}
			if v, ok := strings.CutPrefix(line, "SigCgt:"); ok {
				caught, _ = strconv.ParseUint(strings.TrimSpace(v), 16, 64)
			}
		}
		if comm != "leaderrun-dog" || caught&(1<<(syscall.SIGUSR1-1)) == 0 {
			t.Errorf("%v: the command's parent is %q (SigCgt %x), want leaderrun-dog catching SIGUSR1\n%s", args, comm, caught, out)
		}
		return adopted, parent, comm, caught
	}
	for _, args := range [][]string{{"--", "sh", "-c", job}, {"sh", "-c", job}} {
		if adopted, parent, _, _ := run(args...); adopted == 0 || adopted != parent {
			t.Errorf("%v: the log names watchdog %d as adopted, the command's parent is %d; want the same, not 0", args, adopted, parent)
		}
	}

	// Refused after the launch: "15" has no unit. Both processes ran
	// (each traces the init of golang.org/x/sys/unix), and the output
	// closes with leaderrun, not WaitDelay later.
	cmd := exec.Command(bin, "--backend", "local", "--state-dir", state, "--lock", "early", "--lease-duration", "15", "--", "true")
	cmd.Env = append(os.Environ(), "GODEBUG=inittrace=1")
	cmd.WaitDelay = 10 * time.Second
	start := time.Now()
	out, err := cmd.CombinedOutput()
	took := time.Since(start)
	var exit *exec.ExitError
	if !errors.As(err, &exit) || exit.ExitCode() != 64 {
		t.Fatalf("--lease-duration 15: %v, want exit 64\n%s", err, out)
	}
	// The two processes trace their init at the same time, into the same
	// pipe, and the runtime writes each piece of a trace line ("init ",
	// the package, " @", ...) with a write of its own: their lines
	// interleave, but a package's name is never split.
	if n := strings.Count(string(out), "golang.org/x/sys/unix"); n != 2 {
		t.Errorf("--lease-duration 15: %d processes traced their init, want 2 (leaderrun and its watchdog)\n%s", n, out)
	}
	if took > 5*time.Second {
		t.Errorf("--lease-duration 15: the output closed %v after the start, want it closed with leaderrun", took)
	}
}
