//go:build linux

package e2e

import (
	"bytes"
	"errors"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"slices"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/leaderrun/leaderrun/internal/testenv"
)

// The tests of what an operator meets (issue 43): each runs leaderrun as
// the operator did, on the local store unless the item needs another.

// lr runs leaderrun with args, env added, to the end: its stdout, its
// stderr and its exit code.
func lr(t *testing.T, env []string, args ...string) (string, string, int) {
	t.Helper()
	cmd := exec.Command(testenv.Leaderrun(t), args...)
	cmd.Env = append(os.Environ(), env...)
	var stdout, stderr bytes.Buffer
	cmd.Stdout, cmd.Stderr = &stdout, &stderr
	err := cmd.Run()
	var ee *exec.ExitError
	code := 0
	switch {
	case errors.As(err, &ee):
		code = ee.ExitCode()
	case err != nil:
		t.Fatalf("leaderrun %q: %v", args, err)
	}
	return stdout.String(), stderr.String(), code
}

// ownStateDir is a state directory of the test's, mode 0700.
func ownStateDir(t *testing.T) string {
	dir := filepath.Join(t.TempDir(), "state")
	if err := os.Mkdir(dir, 0o700); err != nil {
		t.Fatal(err)
	}
	return dir
}

// TestOperatorUnstartableTakesNoLock (item 1): a script whose #! names a
// missing interpreter exits 127, one with no #! line that is no binary
// exits 126, each naming what is missing, before the campaign: no lock
// file, no token, no history.
func TestOperatorUnstartableTakesNoLock(t *testing.T) {
	t.Parallel()
	scripts := t.TempDir()
	cases := []struct {
		name, body string
		code       int
		says       string
	}{
		{"missing interpreter", "#!/nonexistent/bin/sh\necho hi\n", 127, "interpreter /nonexistent/bin/sh"},
		{"interpreter is a directory", "#!/tmp\necho hi\n", 126, "interpreter /tmp"},
		{"no #! line", "echo hi\n", 126, "no #! line"},
		{"empty #! line", "#!\necho hi\n", 126, "#! line names no interpreter"},
	}
	for i, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			dir := ownStateDir(t)
			job := filepath.Join(scripts, "job"+string(rune('a'+i))+".sh")
			testenv.WriteExecutable(t, job, []byte(tc.body), 0o755)
			_, stderr, code := lr(t, nil, localArgs(dir, "job", "--", job)...)
			if code != tc.code || !strings.Contains(stderr, tc.says) {
				t.Errorf("exit %d, want %d, with a message naming %q:\n%s", code, tc.code, tc.says, stderr)
			}
			if entries, _ := os.ReadDir(dir); len(entries) != 0 {
				t.Errorf("the state directory holds %d files after a command that cannot start: the lock was taken", len(entries))
			}
		})
	}
	t.Run("a binary and a good script still run", func(t *testing.T) {
		dir := ownStateDir(t)
		job := filepath.Join(scripts, "good.sh")
		testenv.WriteExecutable(t, job, []byte("#!/bin/sh\nexit 0\n"), 0o755)
		for _, cmd := range [][]string{{job}, {"true"}} {
			if _, stderr, code := lr(t, nil, localArgs(dir, "good", append([]string{"--"}, cmd...)...)...); code != 0 {
				t.Errorf("%q: exit %d:\n%s", cmd, code, stderr)
			}
		}
	})
}

// TestOperatorOtherStoreFlagInferred (item 2): a flag of another store is
// refused when the store is inferred from its address, as with --backend.
func TestOperatorOtherStoreFlagInferred(t *testing.T) {
	t.Parallel()
	etcd := []string{"--etcd-endpoints", "http://127.0.0.1:1", "--lock", "x"}
	for _, extra := range [][]string{
		{"--redis-min-replicas", "2"}, {"--state-dir", t.TempDir()}, {"--consul-lock-delay", "1s"}, {"--zk-auth-file", "/dev/null"},
	} {
		t.Run(extra[0], func(t *testing.T) {
			args := append(append(append([]string{}, etcd...), extra...), "--try", "--", "true")
			_, stderr, code := lr(t, nil, args...)
			if want := extra[0] + " is a flag of the "; code != 64 || !strings.Contains(stderr, want) || !strings.Contains(stderr, "etcd") {
				t.Errorf("exit %d, want 64 with %q ... etcd:\n%s", code, want, stderr)
			}
		})
	}
}

// TestOperatorWordBeforeFlags (item 3): a word before leaderrun's flags
// that is no program, or resembles a command, is not taken for the
// command to run: the message says how the line was read, with the line
// meant.
func TestOperatorWordBeforeFlags(t *testing.T) {
	t.Parallel()
	cases := []struct {
		args []string
		want string
	}{
		{[]string{"stat", "--lock", "x"}, "did you mean `leaderrun status --lock x`?"},
		{[]string{"hist", "--lock", "x"}, "did you mean `leaderrun history --lock x`?"},
		{[]string{"--etcd-endpoints", "http://127.0.0.1:1", "status", "--lock", "x"},
			"did you mean `leaderrun status --etcd-endpoints http://127.0.0.1:1 --lock x`?"},
		{[]string{"--backend", "local", "nosuchjob43", "--lock", "x"}, "put leaderrun's flags before the command"},
	}
	for _, tc := range cases {
		t.Run(strings.Join(tc.args, " "), func(t *testing.T) {
			_, stderr, code := lr(t, nil, tc.args...)
			if code != 64 || !strings.Contains(stderr, tc.want) || !strings.Contains(stderr, "was read as the command to run") {
				t.Errorf("exit %d, want 64 saying how the line was read and %q:\n%s", code, tc.want, stderr)
			}
		})
	}
}

// TestOperatorHelpExamplesRun (item 4): the crontab line and the systemd
// unit of leaderrun --help run as written, with their own variables, once
// the store's address is a live one (and the job is true).
func TestOperatorHelpExamplesRun(t *testing.T) {
	t.Parallel()
	help, _, code := lr(t, nil, "--help")
	if code != 0 {
		t.Fatalf("--help: exit %d", code)
	}
	etcd := testenv.StartEtcd(t, 1)
	bin := testenv.Leaderrun(t)
	assign := regexp.MustCompile(`^\s+(?:Environment=)?([A-Z_]+)=(\S+)$`)
	type example struct {
		line string
		env  []string
	}
	// Each example is a block of its own: its variables, then its line.
	var examples []example
	var env []string
	for _, l := range strings.Split(help, "\n") {
		if strings.TrimSpace(l) == "" {
			env = nil
		}
		if m := assign.FindStringSubmatch(l); m != nil && m[1] != "PATH" {
			value := m[2]
			if strings.Contains(m[1], "ENDPOINTS") {
				value = strings.Join(etcd.Endpoints(), ",")
			}
			env = append(env, m[1]+"="+value)
		}
		if i := strings.Index(l, "/usr/local/bin/leaderrun "); i >= 0 {
			line := strings.Replace(l[i:], "/usr/local/bin/leaderrun", bin, 1)
			line = regexp.MustCompile(` -- \S+$`).ReplaceAllString(line, " -- true")
			examples = append(examples, example{line, slices.Clone(env)})
		}
	}
	if len(examples) < 2 {
		t.Fatalf("found %d example lines in --help, want the crontab's and the unit's:\n%s", len(examples), help)
	}
	for _, ex := range examples {
		cmd := exec.Command("sh", "-c", ex.line)
		cmd.Env = append(os.Environ(), ex.env...)
		out, err := cmd.CombinedOutput()
		if err != nil {
			t.Errorf("%s\nwith %q: %v\n%s", ex.line, ex.env, err, out)
		}
	}
}

// TestOperatorPoolMismatchBothWays (item 5): a candidate without --holders
// facing a pool of 2 whose slot 1 alone is held, and a pool's candidate
// facing a lock of one holder, are both refused with 64, naming both
// sizes.
func TestOperatorPoolMismatchBothWays(t *testing.T) {
	t.Parallel()
	dir := ownStateDir(t)
	marks := t.TempDir()
	hold := func(lock string, extra ...string) *proc {
		script := `touch ` + marks + `/` + lock + `.$LEADERRUN_SLOT; exec sleep 60`
		return start(t, nil, localArgs(dir, lock, append(extra, "--", "sh", "-c", script)...)...)
	}
	marked := func(name string) func() bool {
		return func() bool { _, err := os.Stat(filepath.Join(marks, name)); return err == nil }
	}
	a := hold("pool", "--holders", "2")
	waitFor(t, 20*time.Second, "slot 0 held", marked("pool.0"))
	hold("pool", "--holders", "2")
	waitFor(t, 20*time.Second, "slot 1 held", marked("pool.1"))
	a.signal(syscall.SIGTERM)
	a.wait(20 * time.Second)
	_, stderr, code := lr(t, nil, localArgs(dir, "pool", "--try", "--", "true")...)
	if code != 64 || !strings.Contains(stderr, "--holders") || !strings.Contains(stderr, "2") {
		t.Errorf("one holder facing slot 1 of a pool of 2: exit %d, want 64 naming --holders:\n%s", code, stderr)
	}

	hold("one")
	waitFor(t, 20*time.Second, "the lock of one holder held", marked("one.0"))
	_, stderr, code = lr(t, nil, localArgs(dir, "one", "--holders", "2", "--try", "--", "true")...)
	if code != 64 || !strings.Contains(stderr, "--holders") {
		t.Errorf("a pool of 2 facing a lock of one holder: exit %d, want 64 naming --holders:\n%s", code, stderr)
	}
}

// TestOperatorReadsCreateNothing (item 6): status and history against a
// missing state directory create nothing and say that it is missing, and
// how the default is chosen.
func TestOperatorReadsCreateNothing(t *testing.T) {
	t.Parallel()
	missing := filepath.Join(t.TempDir(), "nope")
	for _, command := range []string{"status", "history"} {
		t.Run(command, func(t *testing.T) {
			_, stderr, code := lr(t, nil, command, "--backend", "local", "--state-dir", missing, "--lock", "x")
			if code != 64 || !strings.Contains(stderr, missing+" does not exist") || !strings.Contains(stderr, "the default is") {
				t.Errorf("exit %d, want 64 naming the directory and the default's rule:\n%s", code, stderr)
			}
			if _, err := os.Stat(missing); !errors.Is(err, os.ErrNotExist) {
				t.Errorf("%s created %s (%v)", command, missing, err)
			}
		})
	}
}

// TestOperatorHelp (item 7): help works as urfave/cli users expect, and
// completion offers the values of --backend and the shells.
func TestOperatorHelp(t *testing.T) {
	t.Parallel()
	out, stderr, code := lr(t, nil, "help")
	if code != 0 || !strings.Contains(out, "USAGE") || stderr != "" {
		t.Errorf("help: exit %d, stderr %q", code, stderr)
	}
	out, stderr, code = lr(t, nil, "help", "status")
	if code != 0 || !strings.Contains(out, "leaderrun status --lock NAME") || strings.Contains(out, "COMMANDS:") {
		t.Errorf("help status: exit %d, not status's help:\n%s%s", code, out, stderr)
	}
	_, stderr, code = lr(t, nil, "status", "--bogus")
	if code != 64 || !strings.Contains(stderr, "leaderrun status --help") {
		t.Errorf("status --bogus: exit %d, want 64 pointing to status's help:\n%s", code, stderr)
	}
	out, _, _ = lr(t, nil, "completion", "--generate-bash-completion")
	if got := strings.Fields(out); strings.Join(got, " ") != "bash zsh fish" {
		t.Errorf("completion <TAB> offers %q, want bash zsh fish", got)
	}
	out, _, _ = lr(t, nil, "--backend", "--generate-bash-completion")
	if got := strings.Fields(out); len(got) != 11 || got[0] != "etcd" || got[10] != "local" {
		t.Errorf("--backend <TAB> offers %q, want the eleven stores", got)
	}
}

// TestOperatorVersion (item 8): the README's build line, run in a clone,
// stamps the VCS revision, even where GOFLAGS turns stamping off (as it
// does on many build hosts), and version shows it.
func TestOperatorVersion(t *testing.T) {
	t.Parallel()
	readme, err := os.ReadFile("../README.md")
	if err != nil {
		t.Fatal(err)
	}
	build := regexp.MustCompile("(CGO_ENABLED=0 go build [^`&\n]*)").FindStringSubmatch(string(readme))
	if build == nil {
		t.Fatal("README has no build line (CGO_ENABLED=0 go build ...)")
	}
	clone := filepath.Join(t.TempDir(), "clone")
	if out, err := exec.Command("git", "clone", "-q", "..", clone).CombinedOutput(); err != nil {
		t.Skipf("not a git clone: %v\n%s", err, out)
	}
	rev, err := exec.Command("git", "-C", clone, "rev-parse", "HEAD").Output()
	if err != nil {
		t.Fatal(err)
	}
	bin := t.TempDir()
	line := regexp.MustCompile(`-o \S+`).ReplaceAllString(build[1], "-o "+bin+"/")
	cmd := exec.Command("sh", "-c", line)
	cmd.Dir = clone
	cmd.Env = append(os.Environ(), "GOFLAGS=-buildvcs=false")
	if out, err := cmd.CombinedOutput(); err != nil {
		t.Fatalf("%s: %v\n%s", line, err, out)
	}
	for _, name := range []string{"leaderrun", "leaderrun-aws"} {
		out, err := exec.Command(filepath.Join(bin, name), "version").Output()
		if err != nil {
			t.Fatalf("%s version: %v", name, err)
		}
		if short := strings.TrimSpace(string(rev))[:12]; !strings.Contains(string(out), short) {
			t.Errorf("%s version says %q, want the revision %s", name, out, short)
		}
	}
}

// TestOperatorMessages (item 9): a usage error is one line, "leaderrun:
// ...", naming the flag, with no Go or package internals, and exits 64.
func TestOperatorMessages(t *testing.T) {
	t.Parallel()
	tmp := t.TempDir()
	group := filepath.Join(tmp, "group")
	if err := os.Mkdir(group, 0o700); err != nil {
		t.Fatal(err)
	}
	if err := os.Chmod(group, 0o770); err != nil {
		t.Fatal(err)
	}
	dir := ownStateDir(t)
	cases := []struct {
		name string
		env  []string
		args []string
		want string
	}{
		{"state dir /tmp", nil, []string{"--backend", "local", "--state-dir", "/tmp", "--lock", "x", "--", "true"}, "--state-dir /tmp is writable by others (mode 1777)"},
		{"mode 0770", nil, []string{"--backend", "local", "--state-dir", group, "--lock", "x", "--", "true"}, "is writable by its group (mode 0770)"},
		{"state dir in /proc", nil, []string{"--backend", "local", "--state-dir", "/proc/nope", "--lock", "x", "--", "true"}, "--state-dir /proc/nope"},
		{"LEADERRUN_QUIET=yes", []string{"LEADERRUN_QUIET=yes"}, localArgs(dir, "x", "--", "true"), `"yes" in LEADERRUN_QUIET for --quiet: want true or false`},
		{"--lock -q", nil, []string{"--backend", "local", "--state-dir", dir, "--lock", "-q", "--", "true"}, "--lock needs a value"},
		{`--lock ""`, nil, []string{"--backend", "local", "--state-dir", dir, "--lock", "", "--", "true"}, "--lock is empty"},
		{"--try 10s", nil, localArgs(dir, "x", "--try", "10s"), "--wait 10s"},
		{"--try=10s", nil, localArgs(dir, "x", "--try=10s", "--", "true"), "--try takes no value"},
		{"a limit", nil, localArgs(dir, "x", "--wait", "100000h", "--", "true"), "--wait 100000h is longer than the 8784h"},
	}
	internals := regexp.MustCompile(`strconv|backends:|control:|signals:|\\n|\\t|h0m0s|ERROR`)
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			_, stderr, code := lr(t, tc.env, tc.args...)
			if code != 64 {
				t.Errorf("exit %d, want 64:\n%s", code, stderr)
			}
			if !strings.HasPrefix(stderr, "leaderrun: ") || strings.Count(stderr, "\n") != 1 || internals.MatchString(stderr) || !strings.Contains(stderr, tc.want) {
				t.Errorf("want one line \"leaderrun: ...%s...\" without Go internals, got:\n%s", tc.want, stderr)
			}
		})
	}
	_, stderr, code := lr(t, []string{"LEADERRUN_SOCKET="}, "check")
	if code != 1 || internals.MatchString(stderr) || !strings.Contains(stderr, "not inside a command started by leaderrun") {
		t.Errorf("check outside a job: exit %d:\n%s", code, stderr)
	}
	help, _, _ := lr(t, nil, "run", "--help")
	if strings.Contains(help, "(0: off) (default: 0s)") || strings.Contains(help, "(0: wait forever) (default: 0s)") {
		t.Errorf("run --help prints a default twice:\n%s", help)
	}
}
