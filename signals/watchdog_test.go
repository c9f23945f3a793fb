package signals

import (
	"bytes"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/leaderrun/leaderrun/internal/testenv"
)

// TestMain lets the test binary act as the watchdog when the tests take
// /bin/sh away. Like leaderrun, the tests run as a subreaper: orphans of
// the commands are theirs to reap, not init's.
func TestMain(m *testing.M) {
	if IsWatchdog() {
		os.Exit(Watchdog())
	}
	if err := BecomeSubreaper(); err != nil {
		panic(err)
	}
	os.Exit(m.Run())
}

// startTree starts, under a new Supervisor, a command that leaves a
// grandchild in its group, and returns the child and the grandchild's pid.
func startTree(t *testing.T) (*Child, int) {
	t.Helper()
	pidFile := filepath.Join(t.TempDir(), "pid")
	script := `sleep 300 & echo $! > ` + pidFile + `.tmp && mv ` + pidFile + `.tmp ` + pidFile + `; wait`
	sup, err := Prepare(Spec{Path: "/bin/sh", Args: []string{"sh", "-c", script}, KillSignal: syscall.SIGALRM, KillGrace: time.Second})
	if err != nil {
		t.Fatal(err)
	}
	c, err := sup.Start(os.Environ())
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		_ = c.Signal(syscall.SIGKILL)
		c.Wait()
	})
	var grandchild int
	waitUntil(t, "the grandchild's pid", func() bool {
		data, err := os.ReadFile(pidFile)
		grandchild, _ = strconv.Atoi(strings.TrimSpace(string(data)))
		return err == nil
	})
	if pgid, _ := syscall.Getpgid(grandchild); pgid != c.Pid() {
		t.Fatalf("grandchild in group %d, want the command's %d", pgid, c.Pid())
	}
	return c, grandchild
}

// TestWatchdogKillsGroupWhenLeaderrunGoes: when leaderrun's end of the
// socket closes without a word, as at its death, the watchdog kills the
// command's whole group, grandchildren included. Before that, it ignores
// the signals that could reach it by mistake: the forwarded ones, SIGPIPE
// and the kill signal. With the built-in watchdog, with the shell, with
// bash as the shell (which must act as sh and read no start-up files), and
// with the Go fallback.
func TestWatchdogKillsGroupWhenLeaderrunGoes(t *testing.T) {
	for _, sh := range []string{"built-in", "/bin/sh", "/bin/bash", "/nonexistent/sh"} {
		t.Run(sh, func(t *testing.T) {
			if _, err := os.Stat(sh); err != nil && sh == "/bin/bash" {
				testenv.Missing(t, "bash is not installed")
			}
			if _, err := machineWatchdog(); err != nil && sh == "built-in" {
				t.Skipf("no built-in watchdog on %s/%s: %v", runtime.GOOS, runtime.GOARCH, err)
			}
			defer func(old string, b bool) { shell, builtin = old, b }(shell, builtin)
			if sh != "built-in" {
				shell, builtin = sh, false
			}
			c, grandchild := startTree(t)
			if sh == "built-in" && !strings.HasPrefix(c.s.dog.Path, "/proc/self/fd/") {
				t.Fatalf("the watchdog is %s, want the built-in one", c.s.dog.Path)
			}
			status, err := os.ReadFile("/proc/" + strconv.Itoa(c.s.dog.Process.Pid) + "/status")
			if err != nil {
				t.Fatal(err)
			}
			var ignored uint64
			for _, line := range strings.Split(string(status), "\n") {
				if v, ok := strings.CutPrefix(line, "SigIgn:"); ok {
					ignored, _ = strconv.ParseUint(strings.TrimSpace(v), 16, 64)
				}
			}
			for _, sig := range append(Forwarded, syscall.SIGPIPE, syscall.SIGALRM) {
				if n := sig.(syscall.Signal); ignored&(1<<(n-1)) == 0 {
					t.Errorf("the watchdog does not ignore %v (SigIgn %x)", Name(n), ignored)
				}
			}
			c.s.conn.Close() // what the kernel does when leaderrun dies
			if st := waitChild(t, c); st.Signal != syscall.SIGKILL {
				t.Errorf("command ended with %v, want SIGKILL", st)
			}
			waitUntil(t, "the grandchild to die", func() bool { return gone(grandchild) })
		})
	}
}

// TestWatchdogDeathKillsGroup: a watchdog killed on its own can no longer
// protect the group, so the group is killed.
func TestWatchdogDeathKillsGroup(t *testing.T) {
	c, grandchild := startTree(t)
	if err := syscall.Kill(c.s.dog.Process.Pid, syscall.SIGKILL); err != nil {
		t.Fatal(err)
	}
	if st := waitChild(t, c); st.Signal != syscall.SIGKILL {
		t.Errorf("command ended with %v, want SIGKILL", st)
	}
	waitUntil(t, "the grandchild to die", func() bool { return gone(grandchild) })
}

// TestGroupClearedBeforeDone: a signal to the group ends the command; what
// it left in the group is stopped, and the watchdog dismissed, before Done.
func TestGroupClearedBeforeDone(t *testing.T) {
	c, grandchild := startTree(t)
	if err := c.Signal(syscall.SIGHUP); err != nil {
		t.Fatal(err)
	}
	if st := waitChild(t, c); st.Signal != syscall.SIGHUP {
		t.Errorf("command ended with %v, want SIGHUP", st)
	}
	if !gone(grandchild) {
		t.Errorf("grandchild %d still alive after Done", grandchild)
	}
	if !gone(c.s.dog.Process.Pid) {
		t.Errorf("watchdog %d still alive after Done", c.s.dog.Process.Pid)
	}
}

// TestCommandCannotLeaveItsGroup: timeout(1) and others make themselves the
// leader of a new process group; the command already leads one, so the
// signal to its group still reaches it and its children.
func TestCommandCannotLeaveItsGroup(t *testing.T) {
	timeout, err := exec.LookPath("timeout")
	if err != nil {
		testenv.Missing(t, "timeout(1) from coreutils is not installed")
	}
	sup, err := Prepare(Spec{Path: timeout, Args: []string{"timeout", "300", "sleep", "300"}, KillGrace: time.Second})
	if err != nil {
		t.Fatal(err)
	}
	c, err := sup.Start(os.Environ())
	if err != nil {
		t.Fatal(err)
	}
	var sleep int
	waitUntil(t, "timeout's child", func() bool {
		data, _ := os.ReadFile(fmt.Sprintf("/proc/%d/task/%d/children", c.Pid(), c.Pid()))
		sleep, _ = strconv.Atoi(strings.TrimSpace(string(data)))
		return sleep > 0
	})
	if err := c.Signal(syscall.SIGTERM); err != nil {
		t.Fatal(err)
	}
	// timeout exits 124, or 128+15 when its child died of the SIGTERM
	// first, or dies of it itself: whichever came first.
	if st := waitChild(t, c); st.ExitCode() != 124 && st.ExitCode() != 143 {
		t.Errorf("timeout ended with %v, want exit 124 or 143", st)
	}
	if !gone(sleep) {
		t.Errorf("timeout's child %d still alive after Done", sleep)
	}
}

func waitChild(t *testing.T, c *Child) Status {
	t.Helper()
	select {
	case <-c.Done():
		return c.Wait()
	case <-time.After(10 * time.Second):
		t.Fatal("the command did not end")
		return Status{}
	}
}

// gone reports whether pid has exited (a zombie counts as gone).
func gone(pid int) bool {
	data, err := os.ReadFile("/proc/" + strconv.Itoa(pid) + "/stat")
	if err != nil {
		return true
	}
	i := strings.LastIndexByte(string(data), ')')
	return i >= 0 && len(data) > i+2 && (data[i+2] == 'Z' || data[i+2] == 'X')
}

func waitUntil(t *testing.T, what string, ok func() bool) {
	t.Helper()
	for end := time.Now().Add(10 * time.Second); !ok(); time.Sleep(2 * time.Millisecond) {
		if time.Now().After(end) {
			t.Fatalf("timed out waiting for %s", what)
		}
	}
}

// TestBuiltinWatchdogIsSmall: on Linux x86-64 the watchdog is the built-in
// executable, which keeps a few pages resident instead of a shell's 1.7
// MiB; and where it cannot be executed, the shell takes its place.
func TestBuiltinWatchdogIsSmall(t *testing.T) {
	if runtime.GOOS != "linux" || runtime.GOARCH != "amd64" {
		t.Skipf("no built-in watchdog on %s/%s", runtime.GOOS, runtime.GOARCH)
	}
	c, _ := startTree(t)
	pid := strconv.Itoa(c.s.dog.Process.Pid)
	exe, err := os.Readlink("/proc/" + pid + "/exe")
	if err != nil {
		t.Fatal(err)
	}
	if !strings.HasPrefix(exe, "/memfd:leaderrun-watchdog") {
		t.Errorf("the watchdog runs %s, want the built-in /memfd:leaderrun-watchdog", exe)
	}
	if comm, _ := os.ReadFile("/proc/" + pid + "/comm"); strings.TrimSpace(string(comm)) != "leaderrun-dog" {
		t.Errorf("the watchdog is called %q in ps, want leaderrun-dog", comm)
	}
	hwm, _, err := testenv.Memory(c.s.dog.Process.Pid)
	if err != nil {
		t.Fatal(err)
	}
	if hwm > 64 {
		t.Errorf("the built-in watchdog's peak RSS is %d KiB, want at most 64", hwm)
	}
	t.Logf("built-in watchdog: peak RSS %d KiB", hwm)

	// A path that cannot be executed in place of the memfd: the shell
	// serves, and is tried first from then on.
	defer func(p string) { machine.path = p; machineFailed.Store(false) }(machine.path)
	machine.path = t.TempDir()
	c, grandchild := startTree(t)
	if c.s.dog.Path != shell {
		t.Errorf("with the built-in watchdog failing to start, the watchdog is %s, want %s", c.s.dog.Path, shell)
	}
	if dogs, err := watchdogCommands(syscall.SIGTERM); err != nil || dogs[0].Path != shell {
		t.Errorf("after the built-in watchdog failed once, the first to try is %v (%v), want %s", dogs, err, shell)
	}
	c.s.conn.Close()
	if st := waitChild(t, c); st.Signal != syscall.SIGKILL {
		t.Errorf("command ended with %v, want SIGKILL", st)
	}
	waitUntil(t, "the grandchild to die", func() bool { return gone(grandchild) })
}

// TestBuiltinWatchdogIsBuilt: the committed executable is what
// watchdog/build.sh makes of watchdog/watchdog_amd64.asm.
func TestBuiltinWatchdogIsBuilt(t *testing.T) {
	for _, tool := range []string{"as", "ld"} {
		if _, err := exec.LookPath(tool); err != nil {
			testenv.Missing(t, tool+" from GNU binutils is not installed")
		}
	}
	out := filepath.Join(t.TempDir(), "dog")
	if b, err := exec.Command("watchdog/build.sh", out).CombinedOutput(); err != nil {
		t.Fatalf("watchdog/build.sh: %v\n%s", err, b)
	}
	built, err := os.ReadFile(out)
	if err != nil {
		t.Fatal(err)
	}
	committed, err := os.ReadFile("watchdog_linux_amd64.bin")
	if err != nil {
		t.Fatal(err)
	}
	if !bytes.Equal(built, committed) {
		t.Errorf("watchdog_linux_amd64.bin (%d bytes) is not what watchdog/build.sh makes of the source (%d bytes): run it", len(committed), len(built))
	}
}
