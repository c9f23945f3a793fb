//go:build linux

package e2e

import (
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

// localArgs are the flags of a local-backend run in dir.
func localArgs(dir, lock string, extra ...string) []string {
	return append([]string{"--backend", "local", "--state-dir", dir, "--lock", lock,
		"--lease-duration", "4s", "--renew-deadline", "2s", "--retry-period", "200ms", "--kill-grace", "1s"}, extra...)
}

func cmdArgs(t *testing.T, extra []string) []string {
	return append(append(extra, "--"), childArgv(t)...)
}

// TestLocalExclusionAndTokens: two instances started together never run
// their children at once, and the second leader's token is greater. Each
// child runs longer than --renew-deadline (2s), so the second waits longer
// than that too, and must still run its child.
func TestLocalExclusionAndTokens(t *testing.T) {
	dir := t.TempDir()
	events := filepath.Join(dir, "events")
	env := childEnv(events, "sleep:2500ms")
	a := start(t, env, cmdArgs(t, localArgs(dir, "pair", "--identity", "a"))...)
	b := start(t, env, cmdArgs(t, localArgs(dir, "pair", "--identity", "b"))...)
	if code := a.wait(10 * time.Second); code != 0 {
		t.Errorf("a exited %d", code)
	}
	if code := b.wait(10 * time.Second); code != 0 {
		t.Errorf("b exited %d", code)
	}
	evs := readEvents(t, events)
	ivs := checkExclusive(t, evs)
	if len(ivs) != 2 {
		t.Fatalf("%d children ran, want 2:\n%s", len(ivs), formatEvents(evs))
	}
	t.Logf("tokens %d then %d; gap between children %v", ivs[0].Token, ivs[1].Token, ivs[1].Start.Sub(ivs[0].End))
}

// TestLocalTry: --try on a held lock exits 75 within 100 ms and runs
// nothing; --conflict-exit-code changes the code; --wait gives up on time.
func TestLocalTry(t *testing.T) {
	dir := t.TempDir()
	events := filepath.Join(dir, "events")
	holder := start(t, childEnv(events, "forever"), cmdArgs(t, localArgs(dir, "held", "--identity", "holder"))...)
	waitEvents(t, events, 10*time.Second, "the holder's child", func(evs []event) bool { return count(evs, "start") == 1 })

	cases := []struct {
		name     string
		flags    []string
		wantCode int
		minTime  time.Duration
		maxTime  time.Duration
	}{
		{name: "try", flags: []string{"--try"}, wantCode: 75, maxTime: 100 * time.Millisecond},
		{name: "try conflict code 0", flags: []string{"--try", "--conflict-exit-code", "0"}, wantCode: 0, maxTime: 100 * time.Millisecond},
		{name: "wait 500ms", flags: []string{"--wait", "500ms"}, wantCode: 75, minTime: 500 * time.Millisecond, maxTime: 800 * time.Millisecond},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			begin := time.Now()
			p := start(t, childEnv(events, "exit:0"), cmdArgs(t, localArgs(dir, "held", tc.flags...))...)
			code := p.wait(10 * time.Second)
			took := time.Since(begin)
			if code != tc.wantCode {
				t.Errorf("exit code %d, want %d", code, tc.wantCode)
			}
			if took < tc.minTime || took > tc.maxTime {
				t.Errorf("took %v, want between %v and %v", took, tc.minTime, tc.maxTime)
			}
			t.Logf("exit %d after %v", code, took)
		})
	}
	if n := count(readEvents(t, events), "start"); n != 1 {
		t.Errorf("%d children started, want only the holder's", n)
	}
	holder.signal(syscall.SIGTERM)
	if code := holder.wait(10 * time.Second); code != 0 {
		t.Errorf("holder exited %d after SIGTERM, want the child's 0\n%s", code, formatEvents(readEvents(t, events)))
	}
}

// TestLocalExitCodes: leaderrun exits as its child did.
func TestLocalExitCodes(t *testing.T) {
	dir := t.TempDir()
	noexec := filepath.Join(dir, "noexec.sh")
	if err := os.WriteFile(noexec, []byte("#!/bin/sh\necho hi\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	cases := []struct {
		name    string
		command []string
		want    int
	}{
		{name: "exit 7", command: []string{"sh", "-c", "exit 7"}, want: 7},
		{name: "killed by SIGKILL", command: []string{"sh", "-c", "kill -9 $$"}, want: 137},
		{name: "killed by SIGTERM", command: []string{"sh", "-c", "kill -TERM $$"}, want: 143},
		{name: "not found", command: []string{filepath.Join(dir, "missing")}, want: 127},
		{name: "not found in PATH", command: []string{"leaderrun-no-such-command"}, want: 127},
		{name: "not executable", command: []string{noexec}, want: 126},
		{name: "directory", command: []string{dir}, want: 126},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			args := append(append(localArgs(dir, "codes"), "--"), tc.command...)
			if code := start(t, nil, args...).wait(10 * time.Second); code != tc.want {
				t.Errorf("exit code %d, want %d", code, tc.want)
			}
		})
	}
	// Nothing was started for the commands that do not exist: the token
	// moved only for the three that ran.
	data, err := os.ReadFile(filepath.Join(dir, "codes.token"))
	if err != nil {
		t.Fatal(err)
	}
	if got := strings.TrimSpace(string(data)); got != "3" {
		t.Errorf("token counter %s, want 3: a command that cannot run must not take leadership", got)
	}
}

// TestLocalUsageErrors: bad input exits 64 with a message naming the flag.
func TestLocalUsageErrors(t *testing.T) {
	dir := t.TempDir()
	cases := []struct {
		name string
		args []string
		want string
	}{
		{name: "no lock", args: []string{"--backend", "local", "--", "true"}, want: "--lock"},
		{name: "bad lock", args: []string{"--backend", "local", "--lock", "a/b", "--", "true"}, want: `--lock`},
		{name: "no store", args: []string{"--lock", "x", "--", "true"}, want: "--etcd-endpoints"},
		{name: "bad backend", args: []string{"--backend", "mongodb", "--lock", "x", "--", "true"}, want: `--backend "mongodb"`},
		{name: "lease too short", args: localArgs(dir, "x", "--lease-duration", "2s", "--", "true"), want: "--lease-duration (2s)"},
		{name: "retry too long", args: localArgs(dir, "x", "--retry-period", "2s", "--", "true"), want: "--retry-period (2s)"},
		{name: "negative wait", args: localArgs(dir, "x", "--wait", "-1s", "--", "true"), want: "--wait -1s"},
		{name: "try and wait", args: localArgs(dir, "x", "--try", "--wait", "1s", "--", "true"), want: "--try and --wait"},
		{name: "bad signal", args: localArgs(dir, "x", "--kill-signal", "SIGFOO", "--", "true"), want: "--kill-signal"},
		{name: "bad duration", args: localArgs(dir, "x", "--kill-grace", "soon", "--", "true"), want: "kill-grace"},
		{name: "bad conflict code", args: localArgs(dir, "x", "--conflict-exit-code", "300", "--", "true"), want: "--conflict-exit-code 300"},
		{name: "unknown flag", args: []string{"--lokc", "x", "--", "true"}, want: "lokc"},
		{name: "no command", args: localArgs(dir, "x"), want: "no command"},
		{name: "bad log format", args: localArgs(dir, "x", "--log-format", "xml", "--", "true"), want: `--log-format "xml"`},
		{name: "once-per zero", args: localArgs(dir, "x", "--once-per", "0s", "--", "true"), want: "--once-per 0s"},
		{name: "once-per negative", args: localArgs(dir, "x", "--once-per", "-4s", "--", "true"), want: "--once-per -4s"},
		{name: "once-per fraction", args: localArgs(dir, "x", "--once-per", "1500ms", "--", "true"), want: "--once-per 1.5s"},
		{name: "once-per and once-key", args: localArgs(dir, "x", "--once-per", "24h", "--once-key", "k", "--", "true"), want: "--once-per and --once-key"},
		{name: "bad once-key", args: localArgs(dir, "x", "--once-key", "a/b", "--", "true"), want: `--once-key "a/b"`},
		{name: "bad done code", args: localArgs(dir, "x", "--done-exit-code", "-1", "--", "true"), want: "--done-exit-code -1"},
		// The sum of these wraps below zero in int64 nanoseconds: the
		// bound comes first.
		{name: "overflowing timings", args: localArgs(dir, "x", "--lease-duration", "15s", "--renew-deadline", "2562047h",
			"--kill-grace", "2562047h", "--", "true"), want: "--renew-deadline 2562047h0m0s is longer than the 24h0m0s"},
		{name: "huge wait", args: localArgs(dir, "x", "--wait", "100000h", "--", "true"), want: "--wait 100000h0m0s is longer"},
		{name: "duration without a unit", args: localArgs(dir, "x", "--lease-duration", "15", "--", "true"), want: "a duration needs a unit (ms, s, m or h): 15s"},
		{name: "duration in days", args: localArgs(dir, "x", "--wait", "400d", "--", "true"), want: "not days: 400d is 9600h"},
		{name: "mistyped command", args: []string{"stauts", "--lock", "x"}, want: `unknown command "stauts": did you mean "status"?`},
		{name: "another store's flag", args: localArgs(dir, "x", "--etcd-endpoints", "http://127.0.0.1:1", "--", "true"),
			want: "--etcd-endpoints is a flag of the etcd store, but --backend is local"},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			p := start(t, nil, tc.args...)
			if code := p.wait(10 * time.Second); code != 64 {
				t.Errorf("exit code %d, want 64; output:\n%s", code, p.stderr.String())
			}
			if out := p.stderr.String(); !strings.Contains(out, tc.want) {
				t.Errorf("message does not name %q:\n%s", tc.want, out)
			}
		})
	}
}

// TestLocalEnvironment: the child sees its token and names, inherited
// values of the same names are replaced, NOTIFY_SOCKET is not passed, and
// no descriptor of leaderrun's leaks into it.
func TestLocalEnvironment(t *testing.T) {
	dir := t.TempDir()
	outDir := t.TempDir()
	out := filepath.Join(outDir, "env")
	fds := filepath.Join(outDir, "fds")
	// What every descriptor of the child points to: none may be one of
	// leaderrun's (the watchdog's socket, the control socket, the lock
	// file in the state directory).
	script := `for f in /proc/$$/fd/*; do readlink "$f"; done > ` + fds + `; ` +
		`echo "$FENCE_TOKEN|$LEADERRUN_LOCK|$LEADERRUN_IDENTITY|$LEADERRUN_BACKEND|${NOTIFY_SOCKET-unset}|$KEEP" > ` + out
	env := []string{"FENCE_TOKEN=999", "LEADERRUN_IDENTITY=stale", "NOTIFY_SOCKET=/run/systemd/notify", "KEEP=kept"}
	p := start(t, env, localArgs(dir, "envlock", "--identity", "me", "--shell", "--", script)...)
	if code := p.wait(10 * time.Second); code != 0 {
		t.Fatalf("exit %d", code)
	}
	data, err := os.ReadFile(out)
	if err != nil {
		t.Fatal(err)
	}
	if got, want := strings.TrimSpace(string(data)), "1|envlock|me|local|unset|kept"; got != want {
		t.Errorf("child environment %q, want %q", got, want)
	}
	data, err = os.ReadFile(fds)
	if err != nil {
		t.Fatal(err)
	}
	targets := strings.Fields(string(data))
	if len(targets) < 3 {
		t.Fatalf("child's descriptors: %q", targets)
	}
	for _, target := range targets {
		if strings.HasPrefix(target, "socket:") || strings.HasPrefix(target, dir) {
			t.Errorf("leaderrun's descriptor %s leaked into the child (all: %q)", target, targets)
		}
	}
}

// TestLocalSignalStopsChild: SIGTERM to leaderrun reaches the child, which
// exits; leaderrun exits with the child's status and releases the lock only
// after the child is gone.
func TestLocalSignalStopsChild(t *testing.T) {
	dir := t.TempDir()
	events := filepath.Join(dir, "events")
	p := start(t, childEnv(events, "forever"), cmdArgs(t, localArgs(dir, "term", "--identity", "a"))...)
	waitEvents(t, events, 10*time.Second, "child start", func(evs []event) bool { return count(evs, "start") == 1 })
	follower := start(t, childEnv(events, "exit:0"), cmdArgs(t, localArgs(dir, "term", "--identity", "b"))...)
	p.signal(syscall.SIGUSR1)
	waitEvents(t, events, 10*time.Second, "forwarded SIGUSR1", func(evs []event) bool {
		for _, e := range evs {
			if e.Kind == "signal" && strings.Contains(e.Rest, "user defined signal 1") {
				return true
			}
		}
		return false
	})
	p.signal(syscall.SIGTERM)
	if code := p.wait(10 * time.Second); code != 0 {
		t.Errorf("exit %d after SIGTERM, want the child's 0", code)
	}
	if code := follower.wait(10 * time.Second); code != 0 {
		t.Errorf("follower exit %d", code)
	}
	evs := readEvents(t, events)
	ivs := checkExclusive(t, evs)
	if len(ivs) != 2 {
		t.Fatalf("want 2 children:\n%s", formatEvents(evs))
	}
	t.Logf("follower's child started %v after the old child's exit", ivs[1].Start.Sub(ivs[0].End))
}

// TestLocalKillGrace: a child that ignores the kill signal gets SIGKILL
// after --kill-grace; leaderrun exits 137.
func TestLocalKillGrace(t *testing.T) {
	dir := t.TempDir()
	events := filepath.Join(dir, "events")
	p := start(t, childEnv(events, "ignore:1h"), cmdArgs(t, localArgs(dir, "grace", "--kill-grace", "300ms"))...)
	waitEvents(t, events, 10*time.Second, "child start", func(evs []event) bool { return count(evs, "start") == 1 })
	sent := time.Now()
	p.signal(syscall.SIGTERM)
	code := p.wait(10 * time.Second)
	took := time.Since(sent)
	if code != 137 {
		t.Errorf("exit %d, want 137", code)
	}
	if took < 300*time.Millisecond || took > 2*time.Second {
		t.Errorf("stopped after %v, want about --kill-grace 300ms", took)
	}
}

// TestLocalSigkillKillsGroup: leaderrun killed with SIGKILL takes its child
// and the child's own children with it (S4).
func TestLocalSigkillKillsGroup(t *testing.T) {
	dir := t.TempDir()
	pids := filepath.Join(dir, "pids")
	script := `sleep 3600 & echo $! >> ` + pids + `; echo $$ >> ` + pids + `; wait`
	p := start(t, nil, localArgs(dir, "sigkill", "--shell", "--", script)...)
	var got []int
	waitFor(t, 10*time.Second, "the child and grandchild pids", func() bool {
		got = readPids(pids)
		return len(got) == 2
	})
	killed := time.Now()
	if err := syscall.Kill(p.pid(), syscall.SIGKILL); err != nil {
		t.Fatal(err)
	}
	p.wait(5 * time.Second)
	waitFor(t, time.Second, "child and grandchild to die", func() bool { return !alive(got[0]) && !alive(got[1]) })
	t.Logf("child and grandchild gone %v after SIGKILL of leaderrun", time.Since(killed))
}

// TestLocalStopKillsGrandchildren: stopping the child signals its whole
// process group, and grandchildren left behind by a child that exits are
// stopped before the lock is released (S5, S8).
func TestLocalStopKillsGrandchildren(t *testing.T) {
	dir := t.TempDir()
	pids := filepath.Join(dir, "pids")
	// The child leaves a grandchild behind and exits.
	script := `sleep 3600 & echo $! >> ` + pids
	p := start(t, nil, localArgs(dir, "orphans", "--shell", "--", script)...)
	if code := p.wait(10 * time.Second); code != 0 {
		t.Fatalf("exit %d", code)
	}
	got := readPids(pids)
	if len(got) != 1 {
		t.Fatalf("pids %v", got)
	}
	if alive(got[0]) {
		t.Errorf("grandchild %d outlived leaderrun", got[0])
	}
}

// TestLocalSignalWhileWaiting: a standby that gets SIGTERM withdraws at once
// and exits 143 without running anything.
func TestLocalSignalWhileWaiting(t *testing.T) {
	dir := t.TempDir()
	events := filepath.Join(dir, "events")
	holder := start(t, childEnv(events, "forever"), cmdArgs(t, localArgs(dir, "standby", "--identity", "holder"))...)
	waitEvents(t, events, 10*time.Second, "holder's child", func(evs []event) bool { return count(evs, "start") == 1 })
	standby := start(t, childEnv(events, "exit:0"), cmdArgs(t, localArgs(dir, "standby", "--identity", "standby"))...)
	waitFor(t, 10*time.Second, "the standby to queue", func() bool {
		return strings.Contains(standby.stderr.String(), "campaigning")
	})
	sent := time.Now()
	standby.signal(syscall.SIGTERM)
	if code := standby.wait(5 * time.Second); code != 143 {
		t.Errorf("standby exit %d, want 143", code)
	}
	t.Logf("standby withdrew %v after SIGTERM", time.Since(sent))
	holder.signal(syscall.SIGTERM)
	holder.wait(10 * time.Second)
	if n := count(readEvents(t, events), "start"); n != 1 {
		t.Errorf("%d children ran, want only the holder's", n)
	}
}

// TestLocalLockFileRemoved: removing the lock file lets a newcomer in, so
// the holder must treat it as loss: stop the child at once and exit 76.
func TestLocalLockFileRemoved(t *testing.T) {
	dir := t.TempDir()
	events := filepath.Join(dir, "events")
	p := start(t, childEnv(events, "forever"), cmdArgs(t, localArgs(dir, "removed"))...)
	waitEvents(t, events, 10*time.Second, "child start", func(evs []event) bool { return count(evs, "start") == 1 })
	removed := time.Now()
	if err := os.Remove(filepath.Join(dir, "removed.lock")); err != nil {
		t.Fatal(err)
	}
	evs := waitEvents(t, events, 2*time.Second, "child signalled", func(evs []event) bool { return count(evs, "signal") == 1 })
	for _, e := range evs {
		if e.Kind == "signal" {
			t.Logf("child signalled %v after the lock file was removed", e.At.Sub(removed))
			if e.At.Sub(removed) > time.Second {
				t.Errorf("child signalled after %v, want within 1s", e.At.Sub(removed))
			}
		}
	}
	if code := p.wait(5 * time.Second); code != 76 {
		t.Errorf("exit %d, want 76", code)
	}
}

// TestLocalMinHold: with --min-hold 3s and a 0.1 s job, an instance that
// starts 1 s later with --try finds the lock held and skips (75); one that
// starts 4 s later runs. The first exits with its child's code when the
// hold ends.
func TestLocalMinHold(t *testing.T) {
	dir := t.TempDir()
	events := filepath.Join(dir, "events")
	t0 := time.Now()
	first := start(t, childEnv(events, "sleep:100ms"), cmdArgs(t, localArgs(dir, "hold", "--min-hold", "3s", "--identity", "first"))...)
	// The sleeps below model cron firing late on other hosts: they are the
	// schedule under test, not waits for an outcome.
	time.Sleep(time.Until(t0.Add(time.Second)))
	late := start(t, childEnv(events, "exit:0"), cmdArgs(t, localArgs(dir, "hold", "--try", "--identity", "late"))...)
	if code := late.wait(5 * time.Second); code != 75 {
		t.Errorf("--try 1s later: exit %d, want 75 while the first holds", code)
	}
	if code := first.wait(10 * time.Second); code != 0 {
		t.Errorf("first exit %d, want its child's 0", code)
	}
	if held := time.Since(t0); held < 3*time.Second {
		t.Errorf("first released after %v, before --min-hold 3s", held)
	}
	time.Sleep(time.Until(t0.Add(4 * time.Second)))
	later := start(t, childEnv(events, "exit:0"), cmdArgs(t, localArgs(dir, "hold", "--try", "--identity", "later"))...)
	if code := later.wait(5 * time.Second); code != 0 {
		t.Errorf("--try 4s later: exit %d, want 0", code)
	}
	if n := count(readEvents(t, events), "start"); n != 2 {
		t.Errorf("%d children ran, want 2", n)
	}
}

// TestStatusLocal: status exits 0 with a leader and 3 without.
func TestStatusLocal(t *testing.T) {
	dir := t.TempDir()
	events := filepath.Join(dir, "events")
	status := func() (int, string) {
		p := start(t, nil, "status", "--backend", "local", "--state-dir", dir, "--lock", "st")
		code := p.wait(10 * time.Second)
		return code, p.stderr.String()
	}
	if code, out := status(); code != 3 {
		t.Errorf("status of a free lock: exit %d, want 3\n%s", code, out)
	}
	holder := start(t, childEnv(events, "forever"), cmdArgs(t, localArgs(dir, "st", "--identity", "web-1"))...)
	waitEvents(t, events, 10*time.Second, "child start", func(evs []event) bool { return count(evs, "start") == 1 })
	code, out := status()
	if code != 0 || !strings.Contains(out, "web-1") || !strings.Contains(out, "token:") {
		t.Errorf("status while held: exit %d, want 0 with identity and token:\n%s", code, out)
	}
	holder.signal(syscall.SIGTERM)
	holder.wait(10 * time.Second)
}

// TestVersion: leaderrun version prints a version line.
func TestVersion(t *testing.T) {
	p := start(t, nil, "version")
	if code := p.wait(10 * time.Second); code != 0 {
		t.Fatalf("exit %d", code)
	}
	if out := p.stderr.String(); !strings.HasPrefix(out, "leaderrun ") {
		t.Errorf("version output %q", out)
	}
}

func readPids(path string) []int {
	data, _ := os.ReadFile(path)
	var pids []int
	for _, f := range strings.Fields(string(data)) {
		if n, err := strconv.Atoi(f); err == nil {
			pids = append(pids, n)
		}
	}
	return pids
}

// waitFor polls cond, for conditions in other processes.
func waitFor(t testing.TB, timeout time.Duration, what string, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(timeout)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("timed out after %v waiting for %s", timeout, what)
		}
		time.Sleep(2 * time.Millisecond)
	}
}

// TestLocalPauseSignalsOnResume (S7): after the whole tree was stopped for
// longer than the renew deadline, the child is signalled the moment it
// resumes and leaderrun exits 76.
func TestLocalPauseSignalsOnResume(t *testing.T) {
	dir := t.TempDir()
	events := filepath.Join(dir, "events")
	p := start(t, childEnv(events, "forever"), cmdArgs(t, localArgs(dir, "pause"))...)
	evs := waitEvents(t, events, 10*time.Second, "child start", func(evs []event) bool { return count(evs, "start") == 1 })
	groups := pauseGroups(t, p.pid(), evs[0].Pid)
	for _, g := range groups {
		_ = syscall.Kill(-g, syscall.SIGSTOP)
	}
	// Paused past the 2s renew deadline. Nothing runs meanwhile: this
	// sleep is the fault being injected, not a wait for an outcome.
	time.Sleep(2500 * time.Millisecond)
	resumed := time.Now()
	for _, g := range groups {
		_ = syscall.Kill(-g, syscall.SIGCONT)
	}
	evs = waitEvents(t, events, 5*time.Second, "child signalled", func(evs []event) bool { return count(evs, "signal") == 1 })
	for _, e := range evs {
		if e.Kind == "signal" {
			d := e.At.Sub(resumed)
			t.Logf("child signalled %v after the resume", d)
			if d > 200*time.Millisecond {
				t.Errorf("child signalled %v after the resume, want within 200ms", d)
			}
		}
	}
	if code := p.wait(5 * time.Second); code != 76 {
		t.Errorf("exit %d, want 76", code)
	}
}

// pauseGroups lists the process groups of a leaderrun tree: leaderrun's
// (the test started it as a group leader), its watchdog's and the child's.
func pauseGroups(t *testing.T, leaderrun, child int) []int {
	t.Helper()
	// Children are listed per thread: any may have forked them.
	files, err := filepath.Glob(filepath.Join("/proc", strconv.Itoa(leaderrun), "task", "*", "children"))
	if err != nil || len(files) == 0 {
		t.Fatalf("list children of %d: %v", leaderrun, err)
	}
	groups := []int{leaderrun}
	add := func(pid int) {
		if pgid, err := syscall.Getpgid(pid); err == nil && !slices.Contains(groups, pgid) {
			groups = append(groups, pgid)
		}
	}
	for _, file := range files {
		data, _ := os.ReadFile(file)
		for _, f := range strings.Fields(string(data)) {
			if pid, err := strconv.Atoi(f); err == nil {
				add(pid)
			}
		}
	}
	add(child)
	if len(groups) != 3 {
		t.Fatalf("process groups of leaderrun %d and its child %d: %v, want leaderrun's, the watchdog's and the child's", leaderrun, child, groups)
	}
	return groups
}

// TestLocalSetsidEscapeeStopped: a grandchild that left the process group
// with setsid is still stopped when the command exits, before the lock is
// released: leaderrun inherits it as a subreaper.
func TestLocalSetsidEscapeeStopped(t *testing.T) {
	if _, err := exec.LookPath("setsid"); err != nil {
		testenv.Missing(t, "setsid(1) from util-linux is not installed")
	}
	dir := t.TempDir()
	pids := filepath.Join(dir, "pids")
	// The escapee records its own pid (the sleep's, after exec); the
	// command waits for that, so that it exits only once the escapee has
	// left the group.
	script := `setsid sh -c 'echo $$ > ` + pids + `.tmp; mv ` + pids + `.tmp ` + pids + `; exec sleep 3600' </dev/null >/dev/null 2>&1 & ` +
		`while [ ! -s ` + pids + ` ]; do sleep 0.01; done`
	p := start(t, nil, localArgs(dir, "escape", "--shell", "--", script)...)
	if code := p.wait(10 * time.Second); code != 0 {
		t.Fatalf("exit %d", code)
	}
	got := readPids(pids)
	if len(got) != 1 {
		t.Fatalf("pids %v", got)
	}
	if alive(got[0]) {
		_ = syscall.Kill(got[0], syscall.SIGKILL)
		t.Errorf("grandchild %d in its own session outlived leaderrun", got[0])
	}
}
