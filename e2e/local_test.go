//go:build linux

package e2e

import (
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/leaderrun/leaderrun/internal/testenv"
)

// localStore is the local store in the scenarios' matrix: a state
// directory of the store's own. A flock never expires: the kernel drops
// it with the last descriptor of the lock file, leaderrun's at once when
// it dies, its watchdog's once it has killed the tree.
func localStore() *store {
	return &store{
		name: "local", start: startLocalStore,
		timings:  timings{lease: 4 * time.Second, deadline: 2 * time.Second, retry: 200 * time.Millisecond, grace: time.Second},
		takeover: time.Second, handover: 300 * time.Millisecond, notice: 100 * time.Millisecond,
		statusBound: 5 * time.Second, waiters: true, lostTerm: true,
		onceTimings: timings{lease: 2 * time.Second, deadline: time.Second, retry: 200 * time.Millisecond, grace: 500 * time.Millisecond},
	}
}

func startLocalStore(t *testing.T) *target {
	dir := t.TempDir()
	flags := []string{"--backend", "local", "--state-dir", dir}
	return &target{
		flags: flags, waiting: statusWaiting(flags, nil), key: func(lock string) string { return filepath.Join(dir, lock+".lock") },
		// Removing the lock file lets a newcomer in: the holder must take
		// it as a loss.
		losses: []loss{{name: "LockFileRemoved", do: func(t *testing.T, _ *env, lock string) time.Time {
			sent := time.Now()
			if err := os.Remove(filepath.Join(dir, lock+".lock")); err != nil {
				t.Fatal(err)
			}
			return sent
		}}},
		loseCommand: func(t *testing.T, lock string) string { return "rm " + filepath.Join(dir, lock+".lock") },
		record: func(t *testing.T, lock string) string {
			data, _ := os.ReadFile(filepath.Join(dir, lock+".token"))
			return strings.TrimSpace(string(data))
		},
	}
}

// TestLocalExitCodes: leaderrun exits as its child did.
func TestLocalExitCodes(t *testing.T) {
	t.Parallel()
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
	t.Parallel()
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
			"--kill-grace", "2562047h", "--", "true"), want: "--renew-deadline 2562047h is longer than the 24h"},
		{name: "huge wait", args: localArgs(dir, "x", "--wait", "100000h", "--", "true"), want: "--wait 100000h is longer"},
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
	t.Parallel()
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

// TestLocalKillGrace: a child that ignores the kill signal gets SIGKILL
// after --kill-grace; leaderrun exits 137.
func TestLocalKillGrace(t *testing.T) {
	t.Parallel()
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
	t.Parallel()
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
	t.Parallel()
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

// TestLocalMinHold: with --min-hold 3s and a 0.1 s job, an instance that
// starts 1 s later with --try finds the lock held and skips (75); one that
// starts 4 s later runs. The first exits with its child's code when the
// hold ends.
func TestLocalMinHold(t *testing.T) {
	t.Parallel()
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

// TestVersion: leaderrun version prints a version line.
func TestVersion(t *testing.T) {
	t.Parallel()
	p := start(t, nil, "version")
	if code := p.wait(10 * time.Second); code != 0 {
		t.Fatalf("exit %d", code)
	}
	if out := p.stderr.String(); !strings.HasPrefix(out, "leaderrun ") {
		t.Errorf("version output %q", out)
	}
}

// TestLocalSetsidEscapeeStopped: a grandchild that left the process group
// with setsid is still stopped when the command exits, before the lock is
// released: leaderrun inherits it as a subreaper.
func TestLocalSetsidEscapeeStopped(t *testing.T) {
	t.Parallel()
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
