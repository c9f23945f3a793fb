//go:build linux

package e2e

import (
	"bufio"
	"fmt"
	"maps"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"runtime"
	"slices"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/leaderrun/leaderrun/internal/testenv"
)

// The example units run leaderrun from here (examples/systemd/README.md).
const unitLeaderrun = "/usr/local/bin/leaderrun"

// maxExposure is the worst `systemd-analyze security` rating an example
// service may have (0 is fully locked down, 10 not at all; 9.6 UNSAFE is
// an unhardened unit).
const maxExposure = 4.0

// exampleDir is examples/<name> in this repository.
func exampleDir(t *testing.T, name string) string {
	t.Helper()
	_, file, _, _ := runtime.Caller(0)
	return filepath.Join(filepath.Dir(file), "..", "examples", name)
}

// tool finds a program the test needs: a skip locally, a failure under
// CI=true (scripts/test.sh installs it).
func tool(t *testing.T, name, pkg string) string {
	t.Helper()
	p, err := exec.LookPath(name)
	if err != nil {
		// Daemons live in sbin, which a user's PATH may lack.
		p = filepath.Join("/usr/sbin", name)
		if fi, err := os.Stat(p); err == nil && fi.Mode()&0o111 != 0 {
			return p
		}
		testenv.Missing(t, fmt.Sprintf("%s not found: install Debian's %s package (scripts/test.sh does, as root)", name, pkg))
	}
	return p
}

// unitFiles lists the example units (services and timers) whose names
// match pattern.
func unitFiles(t *testing.T, pattern string) []string {
	t.Helper()
	matches, err := filepath.Glob(filepath.Join(exampleDir(t, "systemd"), pattern))
	if err != nil {
		t.Fatal(err)
	}
	var files []string
	for _, f := range matches {
		if strings.HasSuffix(f, ".service") || strings.HasSuffix(f, ".timer") {
			files = append(files, f)
		}
	}
	if len(files) == 0 {
		t.Fatalf("no unit %s in examples/systemd", pattern)
	}
	return files
}

// unitCopies copies every example unit into a new directory, with the
// leaderrun path replaced by the test's binary: systemd-analyze verify
// requires ExecStart='s program to exist, and this one is the leaderrun
// under test. It fails if a service does not run unitLeaderrun, the path
// the README installs to.
func unitCopies(t *testing.T) string {
	t.Helper()
	dir := t.TempDir()
	for _, f := range unitFiles(t, "*") {
		data, err := os.ReadFile(f)
		if err != nil {
			t.Fatal(err)
		}
		if strings.HasSuffix(f, ".service") && !strings.Contains(string(data), "ExecStart="+unitLeaderrun+" ") {
			t.Errorf("%s: ExecStart= does not run %s", filepath.Base(f), unitLeaderrun)
		}
		data = []byte(strings.ReplaceAll(string(data), unitLeaderrun, testenv.Leaderrun(t)))
		if err := os.WriteFile(filepath.Join(dir, filepath.Base(f)), data, 0o644); err != nil {
			t.Fatal(err)
		}
	}
	return dir
}

// TestSystemdUnitsVerify: `systemd-analyze verify` has nothing to say about
// any example unit, with leaderrun where the unit expects it.
func TestSystemdUnitsVerify(t *testing.T) {
	t.Parallel()
	analyze := tool(t, "systemd-analyze", "systemd")
	dir := unitCopies(t)
	for _, f := range unitFiles(t, "*") {
		name := filepath.Base(f)
		t.Run(name, func(t *testing.T) {
			out, err := exec.Command(analyze, "verify", "--man=no", filepath.Join(dir, name)).CombinedOutput()
			if err != nil || len(out) > 0 {
				t.Errorf("systemd-analyze verify %s: %v\n%s", name, err, out)
			}
		})
	}
	// The check can fail: a unit whose leaderrun is not installed is
	// reported, as on a host where the path in the unit is wrong.
	broken := filepath.Join(t.TempDir(), "leaderrun-relay.service")
	data, err := os.ReadFile(filepath.Join(exampleDir(t, "systemd"), "leaderrun-relay.service"))
	if err != nil {
		t.Fatal(err)
	}
	data = []byte(strings.ReplaceAll(string(data), unitLeaderrun, "/nonexistent/leaderrun"))
	if err := os.WriteFile(broken, data, 0o644); err != nil {
		t.Fatal(err)
	}
	if out, _ := exec.Command(analyze, "verify", "--man=no", broken).CombinedOutput(); !strings.Contains(string(out), "/nonexistent/leaderrun") {
		t.Errorf("systemd-analyze verify did not report a missing leaderrun: %q", out)
	}
}

var exposureLine = regexp.MustCompile(`Overall exposure level for \S+: ([0-9.]+) (\S+)`)

// TestSystemdUnitsSecurity: `systemd-analyze security` rates every example
// service maxExposure or better. Timers have no sandbox of their own.
func TestSystemdUnitsSecurity(t *testing.T) {
	t.Parallel()
	analyze := tool(t, "systemd-analyze", "systemd")
	dir := unitCopies(t)
	for _, f := range unitFiles(t, "*.service") {
		name := filepath.Base(f)
		t.Run(name, func(t *testing.T) {
			out, err := exec.Command(analyze, "security", "--offline=true", "--no-pager", filepath.Join(dir, name)).CombinedOutput()
			m := exposureLine.FindStringSubmatch(string(out))
			if m == nil {
				t.Fatalf("systemd-analyze security %s: %v; no exposure level in:\n%s", name, err, out)
			}
			score, err := strconv.ParseFloat(m[1], 64)
			if err != nil {
				t.Fatal(err)
			}
			t.Logf("%s: exposure %.1f %s", name, score, m[2])
			if score > maxExposure {
				t.Errorf("%s: exposure %.1f %s, want %.1f or better:\n%s", name, score, m[2], maxExposure, out)
			}
		})
	}
}

// serviceSettings reads the [Service] section of a unit: every value of
// every key, in order.
func serviceSettings(t *testing.T, path string) map[string][]string {
	t.Helper()
	f, err := os.Open(path)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	settings := map[string][]string{}
	section := ""
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		line := strings.TrimSpace(sc.Text())
		switch {
		case line == "" || strings.HasPrefix(line, "#") || strings.HasPrefix(line, ";"):
		case strings.HasPrefix(line, "["):
			section = line
		case section == "[Service]":
			k, v, _ := strings.Cut(line, "=")
			settings[k] = append(settings[k], v)
		}
	}
	if err := sc.Err(); err != nil {
		t.Fatal(err)
	}
	return settings
}

// syscallGroups reads systemd's system call groups (@system-service, ...)
// from `systemd-analyze syscall-filter`.
func syscallGroups(t *testing.T, analyze string) map[string][]string {
	t.Helper()
	out, err := exec.Command(analyze, "syscall-filter", "--no-pager").Output()
	if err != nil {
		t.Fatalf("systemd-analyze syscall-filter: %v", err)
	}
	groups := map[string][]string{}
	group := ""
	for _, line := range strings.Split(string(out), "\n") {
		field := strings.TrimSpace(line)
		switch {
		case field == "" || strings.HasPrefix(field, "#"):
		case !strings.HasPrefix(line, " "):
			group = field
		case group != "":
			groups[group] = append(groups[group], strings.Fields(field)[0])
		}
	}
	if len(groups["@system-service"]) == 0 {
		t.Fatalf("no @system-service in systemd-analyze syscall-filter:\n%s", out)
	}
	return groups
}

// allowedSyscalls is the set a unit's SystemCallFilter= lines allow: the
// first list (an allow list) minus every ~list after it.
func allowedSyscalls(t *testing.T, groups map[string][]string, filters []string) map[string]bool {
	t.Helper()
	var expand func(name string, into map[string]bool, add bool)
	expand = func(name string, into map[string]bool, add bool) {
		if !strings.HasPrefix(name, "@") {
			if add {
				into[name] = true
			} else {
				delete(into, name)
			}
			return
		}
		members, ok := groups[name]
		if !ok {
			t.Fatalf("SystemCallFilter= names %s, which systemd does not know", name)
		}
		for _, m := range members {
			expand(m, into, add)
		}
	}
	allowed := map[string]bool{}
	for i, f := range filters {
		deny := strings.HasPrefix(f, "~")
		if i == 0 && deny {
			t.Fatalf("SystemCallFilter=%s: the test expects an allow list first", f)
		}
		for _, name := range strings.Fields(strings.TrimPrefix(f, "~")) {
			expand(name, allowed, !deny)
		}
	}
	return allowed
}

var (
	traceCall = regexp.MustCompile(`^\d+\s+([a-z0-9_]+)\(`)
	// noSyscall is how strace names system call number -1.
	noSyscall   = "syscall_0xffffffffffffffff"
	traceFamily = regexp.MustCompile(`^\d+\s+socket(?:pair)?\((AF_[A-Z0-9]+)`)
)

// outputFile is a file that a process writes its output to; the test
// prints it if it failed.
type outputFile struct {
	f    *os.File
	path string
}

func logFile(t *testing.T, path string) outputFile {
	t.Helper()
	f, err := os.Create(path)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		f.Close()
		if t.Failed() {
			data, _ := os.ReadFile(path)
			t.Logf("output:\n%s", data)
		}
	})
	return outputFile{f: f, path: path}
}

// TestSystemdSandboxCoversLeaderrun: leaderrun, its watchdog and a shell
// job that calls `leaderrun check`, traced with strace through a whole run
// on each store (leading, renewing, answering check, stopping the job on a
// lost lock or a SIGTERM, releasing), make only system calls that the
// example units' SystemCallFilter= allows and open only sockets of the
// families their RestrictAddressFamilies= allows. A call outside the
// filter would fail with EPERM under systemd and break the job; this is
// the check that the sandbox does not, without a systemd to run it in.
func TestSystemdSandboxCoversLeaderrun(t *testing.T) {
	t.Parallel()
	analyze := tool(t, "systemd-analyze", "systemd")
	strace := tool(t, "strace", "strace")
	groups := syscallGroups(t, analyze)

	var filters, families []string
	for _, f := range unitFiles(t, "*.service") {
		s := serviceSettings(t, f)
		if filters == nil {
			filters, families = s["SystemCallFilter"], s["RestrictAddressFamilies"]
		}
		if !slices.Equal(s["SystemCallFilter"], filters) || !slices.Equal(s["RestrictAddressFamilies"], families) {
			t.Fatalf("%s: SystemCallFilter=%q RestrictAddressFamilies=%q differ from the other unit's %q %q: the test checks one set",
				filepath.Base(f), s["SystemCallFilter"], s["RestrictAddressFamilies"], filters, families)
		}
	}
	if len(filters) == 0 || len(families) != 1 {
		t.Fatalf("the example services have SystemCallFilter=%q RestrictAddressFamilies=%q", filters, families)
	}
	allowed := allowedSyscalls(t, groups, filters)
	allowedFamilies := map[string]bool{}
	for _, f := range strings.Fields(families[0]) {
		allowedFamilies[f] = true
	}

	lr := testenv.Leaderrun(t)
	fast := []string{"--lease-duration", "4s", "--renew-deadline", "2s", "--retry-period", "200ms", "--kill-grace", "1s"}
	tests := []struct {
		name string
		// store starts the store and returns leaderrun's flags for it,
		// timings included (Consul's session TTL is at least 10s).
		store func(t *testing.T, dir string) []string
		// renewals is how long the job runs before it is ended: a few
		// renewals.
		renewals time.Duration
		// end ends the run once the job is up (nil: the job exits 0 by
		// itself after a few renewals).
		end  func(t *testing.T, dir string, leaderrun int)
		code int
	}{
		{name: "local, lock lost", code: 76, renewals: 700 * time.Millisecond,
			store: func(t *testing.T, dir string) []string {
				return append([]string{"--backend", "local", "--state-dir", filepath.Join(dir, "state")}, fast...)
			},
			end: func(t *testing.T, dir string, _ int) {
				if err := os.Remove(filepath.Join(dir, "state", "job.lock")); err != nil {
					t.Fatal(err)
				}
			}},
		{name: "etcd, SIGTERM", code: 143, renewals: 700 * time.Millisecond,
			store: func(t *testing.T, _ string) []string {
				return append([]string{"--etcd-endpoints", strings.Join(testenv.StartEtcd(t, 1).Endpoints(), ",")}, fast...)
			},
			end: func(t *testing.T, _ string, leaderrun int) {
				if err := syscall.Kill(leaderrun, syscall.SIGTERM); err != nil {
					t.Fatal(err)
				}
			}},
		{name: "consul, job exits", code: 0, renewals: 1500 * time.Millisecond,
			store: func(t *testing.T, _ string) []string {
				return []string{"--consul-addr", testenv.StartConsul(t, testenv.ConsulOptions{}).Addr(), "--consul-lock-delay", "0s",
					"--lease-duration", "10s", "--renew-deadline", "6s", "--retry-period", "500ms", "--kill-grace", "1s"}
			}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			dir := t.TempDir()
			pidFile := filepath.Join(dir, "leaderrun.pid")
			// $PPID of the job is leaderrun's watchdog, which forks it;
			// its parent is leaderrun.
			job := fmt.Sprintf(`%[1]s check || exit 1; sleep %.1[3]f; %[1]s check || exit 1; sed 's/.*) //' /proc/$PPID/stat | cut -d' ' -f2 > %[2]s.tmp; mv %[2]s.tmp %[2]s; `,
				lr, pidFile, tt.renewals.Seconds())
			if tt.end != nil {
				job += "exec sleep 30"
			}
			trace := filepath.Join(dir, "trace")
			args := append([]string{"-f", "-qq", "-o", trace, lr, "--lock", "job"}, tt.store(t, dir)...)
			args = append(args, "--", "/bin/sh", "-c", job)
			cmd := exec.Command(strace, args...)
			// A file, not a pipe: Wait must not wait for a job that a
			// failed run left behind.
			out := logFile(t, filepath.Join(dir, "output"))
			cmd.Stdout, cmd.Stderr = out.f, out.f
			// A group of its own, to kill strace and its tracees together
			// if the test fails half-way.
			cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true}
			if err := cmd.Start(); err != nil {
				t.Fatal(err)
			}
			done := make(chan struct{})
			var waitErr error
			go func() {
				defer close(done)
				waitErr = cmd.Wait()
			}()
			t.Cleanup(func() {
				select {
				case <-done:
				default:
					_ = syscall.Kill(-cmd.Process.Pid, syscall.SIGKILL)
					<-done
				}
			})
			var pid int
			waitFor(t, 20*time.Second, "the job (see the output below)", func() bool {
				data, err := os.ReadFile(pidFile)
				if err != nil {
					return false
				}
				pid, err = strconv.Atoi(strings.TrimSpace(string(data)))
				return err == nil
			})
			if tt.end != nil {
				tt.end(t, dir, pid)
			}
			select {
			case <-done:
			case <-time.After(20 * time.Second):
				t.Fatalf("leaderrun under strace still running after 20s")
			}
			code := 0
			if ee, ok := waitErr.(*exec.ExitError); ok {
				code = ee.ExitCode()
			} else if waitErr != nil {
				t.Fatal(waitErr)
			}
			if code != tt.code {
				t.Errorf("leaderrun exited %d, want %d", code, tt.code)
			}

			data, err := os.ReadFile(trace)
			if err != nil {
				t.Fatal(err)
			}
			used := map[string]int{}
			var denied, badFamilies []string
			seenFamilies := map[string]bool{}
			pseudo := 0
			for _, line := range strings.Split(string(data), "\n") {
				if m := traceCall.FindStringSubmatch(line); m != nil {
					if m[1] == noSyscall {
						// Not a system call: strace's name for number -1,
						// which a tracee shows at a stop where no call is
						// made (a call restarted after a signal, say);
						// SystemCallFilter= never sees it.
						pseudo++
						continue
					}
					if used[m[1]]++; used[m[1]] == 1 && !allowed[m[1]] {
						denied = append(denied, m[1])
					}
				}
				if m := traceFamily.FindStringSubmatch(line); m != nil {
					if !seenFamilies[m[1]] && !allowedFamilies[m[1]] {
						badFamilies = append(badFamilies, m[1])
					}
					seenFamilies[m[1]] = true
				}
			}
			t.Logf("%d distinct system calls in %d lines of trace (%d stops at no call), all in SystemCallFilter=%q (%d calls)",
				len(used), strings.Count(string(data), "\n"), pseudo, filters, len(allowed))
			if len(used) < 30 {
				t.Errorf("only %d system calls traced: strace did not follow the run", len(used))
			}
			names := slices.Sorted(maps.Keys(used))
			t.Logf("traced: %s; socket families: %v", strings.Join(names, " "), slices.Sorted(maps.Keys(seenFamilies)))
			// The watchdog's own calls too: its socket, its timer, the
			// command's fork; kill where the job is stopped.
			needs := []string{"prctl", "setpgid", "socketpair", "pidfd_open", "wait4", "sendmsg", "recvmsg", "timerfd_settime", "ppoll"}
			if tt.end != nil {
				needs = append(needs, "kill")
			}
			if strings.HasPrefix(tt.name, "local") {
				needs = append(needs, "flock", "inotify_add_watch")
			}
			for _, c := range needs {
				if used[c] == 0 {
					t.Errorf("no %s in the trace: the run did not do what the test means to cover", c)
				}
			}
			if len(denied) > 0 {
				t.Errorf("system calls outside the units' SystemCallFilter=: %v (they would fail with EPERM)", denied)
			}
			if len(badFamilies) > 0 {
				t.Errorf("sockets of families outside RestrictAddressFamilies=%s: %v", families[0], badFamilies)
			}
		})
	}
}

// TestSystemdStateDirectoryLayout: with DynamicUser=yes, systemd makes
// StateDirectory=leaderrun a directory /var/lib/private/leaderrun (mode
// 0700, owned by the unit's user, inside a root-only /var/lib/private) and
// /var/lib/leaderrun a symlink to it; the units pass LEADERRUN_STATE_DIR=
// %S/leaderrun, the symlink. The local backend must work there, as the
// unit's unprivileged user, and keep its token across runs. (As root, the
// test runs leaderrun as nobody, the owner of the directory, as systemd
// would run it as the dynamic user.)
func TestSystemdStateDirectoryLayout(t *testing.T) {
	t.Parallel()
	root, err := os.MkdirTemp("", "leaderrun-statedir-")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { os.RemoveAll(root) })
	uid, gid := os.Getuid(), os.Getgid()
	var cred *syscall.Credential
	if uid == 0 {
		uid, gid = 65534, 65534
		cred = &syscall.Credential{Uid: uint32(uid), Gid: uint32(gid)}
	}
	// What systemd creates (StateDirectoryMode=0700), and a place for the
	// job to write, and a copy of leaderrun the user can run.
	lib := filepath.Join(root, "var-lib")
	private := filepath.Join(lib, "private")
	state := filepath.Join(private, "leaderrun")
	work := filepath.Join(root, "work")
	for _, d := range []struct {
		path  string
		mode  os.FileMode
		owned bool
	}{{root, 0o755, false}, {lib, 0o755, false}, {private, 0o700, false}, {state, 0o700, true}, {work, 0o755, true}} {
		if err := os.MkdirAll(d.path, d.mode); err != nil {
			t.Fatal(err)
		}
		if err := os.Chmod(d.path, d.mode); err != nil {
			t.Fatal(err)
		}
		if d.owned {
			if err := os.Chown(d.path, uid, gid); err != nil {
				t.Fatal(err)
			}
		}
	}
	if err := os.Symlink("private/leaderrun", filepath.Join(lib, "leaderrun")); err != nil {
		t.Fatal(err)
	}
	data, err := os.ReadFile(testenv.Leaderrun(t))
	if err != nil {
		t.Fatal(err)
	}
	lr := filepath.Join(work, "leaderrun")
	testenv.WriteExecutable(t, lr, data, 0o755)
	if cred != nil {
		// The user cannot traverse the root-only private/ by itself: as
		// under systemd, it reaches its directory through the symlink in a
		// namespace where private/ is open to it. Here, root makes
		// private/ traversable (not listable) for the test's user.
		if err := os.Chmod(private, 0o711); err != nil {
			t.Fatal(err)
		}
	}
	tokens := filepath.Join(work, "tokens")
	for run := 1; run <= 2; run++ {
		cmd := exec.Command(lr, "--backend", "local", "--lock", "relay", "--", "/bin/sh", "-c", "echo $FENCE_TOKEN >> "+tokens)
		cmd.Env = []string{"PATH=/usr/bin:/bin", "LEADERRUN_STATE_DIR=" + filepath.Join(lib, "leaderrun"), "HOME=/"}
		cmd.Dir = "/"
		cmd.SysProcAttr = &syscall.SysProcAttr{Credential: cred}
		if out, err := cmd.CombinedOutput(); err != nil {
			t.Fatalf("run %d as uid %d: %v\n%s", run, uid, err, out)
		}
	}
	got, _ := os.ReadFile(tokens)
	if string(got) != "1\n2\n" {
		t.Errorf("tokens of two runs: %q, want 1 then 2", got)
	}
	files, _ := os.ReadDir(state)
	var names []string
	for _, f := range files {
		names = append(names, f.Name())
	}
	t.Logf("state directory %s (through the symlink %s/leaderrun) holds %v; tokens %q", state, lib, names, got)
}
