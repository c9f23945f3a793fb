//go:build linux

package signals

import (
	"fmt"
	"os"
	"os/exec"
	"os/signal"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/leaderrun/leaderrun/internal/testenv"
	"github.com/leaderrun/leaderrun/signals/watchdog"
	// The test binary is its own watchdog, as leaderrun is.
	_ "github.com/leaderrun/leaderrun/takeover"
)

// TestMain lets the test binary act as a stand-in for leaderrun in a
// process of its own (leaderMain), which a test can freeze or kill, and as
// a command that records the signals it gets (recorderMain); it is its own
// watchdog through package takeover's init. Like leaderrun, the tests run
// as a subreaper.
func TestMain(m *testing.M) {
	if file := os.Getenv("SIGNALS_TEST_RECORD"); file != "" {
		os.Exit(recorderMain(file))
	}
	if dir := os.Getenv("SIGNALS_TEST_LEADER"); dir != "" {
		os.Exit(leaderMain(dir))
	}
	// A race-enabled watchdog or recorder would sleep a second at exit.
	if os.Getenv("GORACE") == "" {
		os.Setenv("GORACE", "atexit_sleep_ms=0")
	}
	if err := BecomeSubreaper(); err != nil {
		panic(err)
	}
	os.Exit(m.Run())
}

// leaderMain stands in for leaderrun: it starts $SIGNALS_TEST_SCRIPT
// (sh -c) under a watchdog, with --kill-grace $SIGNALS_TEST_GRACE, a first
// deadline $SIGNALS_TEST_DEADLINE from now (none if unset), renewed to
// that much from now every $SIGNALS_TEST_RENEW (never if unset), and the
// file $SIGNALS_TEST_HOLD flocked and handed to the watchdog (if set). It
// writes the pids and the guard to dir/started, and, once the tree is
// gone, whether the watchdog stopped it for the deadline to dir/done.
// After each renewal has been sent, it writes its deadline to dir/renewed.
func leaderMain(dir string) int {
	grace, _ := time.ParseDuration(os.Getenv("SIGNALS_TEST_GRACE"))
	sup, err := Prepare(Spec{Path: "/bin/sh", Args: []string{"sh", "-c", os.Getenv("SIGNALS_TEST_SCRIPT")}, KillGrace: grace})
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		return 1
	}
	var hold *os.File
	if path := os.Getenv("SIGNALS_TEST_HOLD"); path != "" {
		if hold, err = os.OpenFile(path, os.O_RDWR|os.O_CREATE, 0o600); err == nil {
			err = syscall.Flock(int(hold.Fd()), syscall.LOCK_EX)
		}
		if err != nil {
			fmt.Fprintln(os.Stderr, err)
			return 1
		}
	}
	var deadline time.Time
	offset, _ := time.ParseDuration(os.Getenv("SIGNALS_TEST_DEADLINE"))
	if offset > 0 {
		deadline = time.Now().Add(offset)
	}
	var env []string
	for _, kv := range os.Environ() {
		if !strings.HasPrefix(kv, "SIGNALS_TEST_LEADER=") {
			env = append(env, kv)
		}
	}
	c, err := sup.Start(env, deadline, hold)
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		return 1
	}
	info := fmt.Sprintf("child %d\nwatchdog %d\ndeadline %d\nguard %s\n", c.Pid(), sup.link.proc.Pid, deadline.UnixNano(), c.Guard())
	writeAtomic(filepath.Join(dir, "started"), info)
	var tick <-chan time.Time
	if every, _ := time.ParseDuration(os.Getenv("SIGNALS_TEST_RENEW")); every > 0 {
		tick = time.Tick(every)
	}
	for {
		select {
		case <-tick:
			d := time.Now().Add(offset)
			c.SetDeadline(d)
			writeAtomic(filepath.Join(dir, "renewed"), strconv.FormatInt(d.UnixNano(), 10))
		case <-c.Done():
			c.mu.Lock()
			killAt, killed := c.killAt, c.killedAt
			c.mu.Unlock()
			writeAtomic(filepath.Join(dir, "done"), fmt.Sprintf("expired %v\nkillAt %d\nkilled %d\n", c.Expired(), killAt.UnixNano(), killed.UnixNano()))
			c.Wait()
			return 0
		}
	}
}

func writeAtomic(path, data string) {
	_ = os.WriteFile(path+".tmp", []byte(data), 0o644)
	_ = os.Rename(path+".tmp", path)
}

// recorderMain is a command that appends "<event> <unix-ns>" lines to file
// ("start", then "signal" at every SIGTERM) and runs until SIGKILL.
func recorderMain(file string) int {
	sigs := make(chan os.Signal, 4)
	signal.Notify(sigs, syscall.SIGTERM)
	rec := func(what string) {
		f, err := os.OpenFile(file, os.O_WRONLY|os.O_APPEND|os.O_CREATE, 0o600)
		if err == nil {
			fmt.Fprintf(f, "%s %d\n", what, time.Now().UnixNano())
			f.Close()
		}
	}
	rec("start")
	for range sigs {
		rec("signal")
	}
	return 0
}

// recorded is the time of the first line for what in file, waiting for it.
func recorded(t *testing.T, file, what string) time.Time {
	t.Helper()
	var at time.Time
	waitUntil(t, what+" in "+file, func() bool {
		data, _ := os.ReadFile(file)
		for _, line := range strings.Split(string(data), "\n") {
			if f := strings.Fields(line); len(f) == 2 && f[0] == what {
				ns, _ := strconv.ParseInt(f[1], 10, 64)
				at = time.Unix(0, ns)
				return true
			}
		}
		return false
	})
	return at
}

// leader is a leaderMain process.
type leader struct {
	cmd             *exec.Cmd
	dir             string
	child, watchdog int
	deadline        time.Time
	guard           string
}

// startLeader runs leaderMain with script and env (SIGNALS_TEST_*), and
// waits for its command to start.
func startLeader(t *testing.T, script string, env ...string) *leader {
	t.Helper()
	l := &leader{dir: t.TempDir()}
	self, err := os.Executable()
	if err != nil {
		t.Fatal(err)
	}
	l.cmd = exec.Command(self)
	l.cmd.Env = append(append(os.Environ(), "SIGNALS_TEST_LEADER="+l.dir, "SIGNALS_TEST_SCRIPT="+script,
		"SIGNALS_TEST_GRACE=1s"), env...)
	l.cmd.Stderr = os.Stderr
	if err := l.cmd.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		_ = l.cmd.Process.Kill()
		_ = l.cmd.Wait()
	})
	var info string
	waitUntil(t, "the leader's command to start", func() bool {
		data, err := os.ReadFile(filepath.Join(l.dir, "started"))
		info = string(data)
		return err == nil
	})
	for _, line := range strings.Split(info, "\n") {
		k, v, _ := strings.Cut(line, " ")
		switch k {
		case "child":
			l.child, _ = strconv.Atoi(v)
		case "watchdog":
			l.watchdog, _ = strconv.Atoi(v)
		case "deadline":
			ns, _ := strconv.ParseInt(v, 10, 64)
			l.deadline = time.Unix(0, ns)
		case "guard":
			l.guard = v
		}
	}
	t.Logf("leader %d, watchdog %d, command %d; guard %s", l.cmd.Process.Pid, l.watchdog, l.child, l.guard)
	return l
}

// expired waits for the leader to see the tree gone and reports what the
// watchdog told it: whether its deadline started the stop sequence, the
// sequence's SIGKILL instant, and when the watchdog sent that SIGKILL.
func (l *leader) expired(t *testing.T) (expired bool, killAt, killed time.Time) {
	t.Helper()
	var data []byte
	waitUntil(t, "the leader to see its command's tree gone", func() bool {
		var err error
		data, err = os.ReadFile(filepath.Join(l.dir, "done"))
		return err == nil
	})
	for _, line := range strings.Split(string(data), "\n") {
		k, v, _ := strings.Cut(line, " ")
		ns, _ := strconv.ParseInt(v, 10, 64)
		switch k {
		case "expired":
			expired = v == "true"
		case "killAt":
			killAt = time.Unix(0, ns)
		case "killed":
			killed = time.Unix(0, ns)
		}
	}
	return expired, killAt, killed
}

// renewed is the last deadline the leader recorded as sent (zero if none).
// Read while the leader is stopped, it is the last one sent, or the one
// before if the leader was stopped between a send and its record.
func (l *leader) renewed(t *testing.T) time.Time {
	t.Helper()
	data, err := os.ReadFile(filepath.Join(l.dir, "renewed"))
	if err != nil {
		return time.Time{}
	}
	ns, err := strconv.ParseInt(strings.TrimSpace(string(data)), 10, 64)
	if err != nil {
		t.Fatalf("the leader's renewed deadline %q: %v", data, err)
	}
	return time.Unix(0, ns)
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
	c, err := sup.Start(os.Environ(), time.Time{}, nil)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		c.Stop(syscall.SIGKILL)
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

// signalMask reads a Sig* mask (SigIgn, SigCgt) of pid.
func signalMask(t *testing.T, pid int, name string) uint64 {
	t.Helper()
	status, err := os.ReadFile("/proc/" + strconv.Itoa(pid) + "/status")
	if err != nil {
		t.Fatal(err)
	}
	for _, line := range strings.Split(string(status), "\n") {
		if v, ok := strings.CutPrefix(line, name+":"); ok {
			mask, _ := strconv.ParseUint(strings.TrimSpace(v), 16, 64)
			return mask
		}
	}
	t.Fatalf("no %s in /proc/%d/status", name, pid)
	return 0
}

// TestLeaderrunDeathKillsTree (S4, S10): when leaderrun dies by SIGKILL,
// the watchdog kills the command's whole tree at once: the command, a
// grandchild in its group and a helper that left the group (setsid) and
// ignores SIGTERM, within --kill-grace + 100 ms. Until then the watchdog
// catches, without ignoring (its command would inherit SIG_IGN), the
// signals that could reach it by mistake: the forwarded ones, SIGPIPE and
// the kill signal; and it is called leaderrun-dog in ps.
func TestLeaderrunDeathKillsTree(t *testing.T) {
	dir := t.TempDir()
	pidFile, groupFile := filepath.Join(dir, "helper"), filepath.Join(dir, "grandchild")
	script := escapeeScript(pidFile, "", `sleep 300 & echo $! > `+groupFile+`.tmp; mv `+groupFile+`.tmp `+groupFile+`; wait`)
	l := startLeader(t, script)
	helperPid := readPidFile(t, pidFile)
	grandchild := readPidFile(t, groupFile)
	caught, ignored := signalMask(t, l.watchdog, "SigCgt"), signalMask(t, l.watchdog, "SigIgn")
	for _, sig := range append(Forwarded, syscall.SIGPIPE) {
		n := sig.(syscall.Signal)
		if caught&(1<<(n-1)) == 0 || ignored&(1<<(n-1)) != 0 {
			t.Errorf("the watchdog does not catch %v (SigCgt %x, SigIgn %x)", Name(n), caught, ignored)
		}
	}
	if comm, _ := os.ReadFile("/proc/" + strconv.Itoa(l.watchdog) + "/comm"); strings.TrimSpace(string(comm)) != watchdog.ProcessName {
		t.Errorf("the watchdog is called %q in ps, want %s", comm, watchdog.ProcessName)
	}
	procs := map[string]*testenv.Process{"command": testenv.Watch(t, l.child), "grandchild": testenv.Watch(t, grandchild),
		"helper": testenv.Watch(t, helperPid), "watchdog": testenv.Watch(t, l.watchdog)}
	killed := time.Now()
	if err := l.cmd.Process.Kill(); err != nil {
		t.Fatal(err)
	}
	const grace = time.Second
	for name, p := range procs {
		after := p.Died(t, 10*time.Second).Sub(killed)
		t.Logf("%s %d gone %v after the SIGKILL of leaderrun", name, p.Pid, after.Round(time.Millisecond))
		if name != "watchdog" && after > grace+100*time.Millisecond {
			t.Errorf("%s %d gone %v after the SIGKILL of leaderrun: more than --kill-grace %v + 100ms", name, p.Pid, after, grace)
		}
	}
}

// TestWatchdogDeathKillsTree: a watchdog killed on its own can no longer
// guard the tree: the command dies of its parent-death signal, and
// leaderrun kills the rest, the helper that left the group included.
func TestWatchdogDeathKillsTree(t *testing.T) {
	pidFile := filepath.Join(t.TempDir(), "helper")
	c, helper := startEscapee(t, escapeeScript(pidFile, "", `sleep 300 & wait`), time.Second, pidFile)
	if err := syscall.Kill(c.link.proc.Pid, syscall.SIGKILL); err != nil {
		t.Fatal(err)
	}
	if st := waitChild(t, c); st.Signal != syscall.SIGKILL {
		t.Errorf("command ended with %v, want SIGKILL", st)
	}
	if !gone(helper.Pid) {
		t.Errorf("helper %d alive after Done", helper.Pid)
	}
	// The cgroup the dead watchdog made is removed too.
	if dir := c.cgroupDir(); dir != "" {
		if _, err := os.Stat(dir); !os.IsNotExist(err) {
			t.Errorf("the command's cgroup %s is left behind (%v)", dir, err)
		}
	}
}

// TestGroupClearedBeforeDone: a signal to the group ends the command; what
// it left in the group is stopped, and the watchdog dismissed, before Done.
// The command depends on SIGHUP's default action, which the test process
// may have been started without (nohup, some CI runners): the watchdog
// catches SIGHUP, so that its child starts with the default, whatever it
// inherited; the test ignores SIGHUP itself to prove it.
func TestGroupClearedBeforeDone(t *testing.T) {
	signal.Ignore(syscall.SIGHUP)
	defer signal.Reset(syscall.SIGHUP)
	c, grandchild := startTree(t)
	if ignored := signalMask(t, c.Pid(), "SigIgn"); ignored&(1<<(syscall.SIGHUP-1)) != 0 {
		t.Errorf("the command ignores SIGHUP (SigIgn %x): it inherited leaderrun's disposition", ignored)
	}
	if err := c.Signal(syscall.SIGHUP); err != nil {
		t.Fatal(err)
	}
	if st := waitChild(t, c); st.Signal != syscall.SIGHUP {
		t.Errorf("command ended with %v, want SIGHUP", st)
	}
	if !gone(grandchild) {
		t.Errorf("grandchild %d still alive after Done", grandchild)
	}
	c.Wait()
	if !gone(c.link.proc.Pid) {
		t.Errorf("watchdog %d still alive after Wait", c.link.proc.Pid)
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
	c, err := sup.Start(os.Environ(), time.Time{}, nil)
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

func readPidFile(t *testing.T, path string) int {
	t.Helper()
	var pid int
	waitUntil(t, "a pid in "+path, func() bool {
		data, err := os.ReadFile(path)
		pid, _ = strconv.Atoi(strings.TrimSpace(string(data)))
		return err == nil && pid > 0
	})
	return pid
}
