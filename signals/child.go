package signals

import (
	"bufio"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"os"
	"os/exec"
	"runtime"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"time"
)

// Spec describes a command to run.
type Spec struct {
	// Path is the resolved executable (see Resolve); Args is the full argv,
	// Args[0] included.
	Path string
	Args []string
	// Env is the complete environment of the command.
	Env []string
	// KillSignal is sent first when the command is stopped. Zero: SIGTERM.
	KillSignal syscall.Signal
	// KillGrace is how long a stopped command, and anything it leaves in its
	// process group, gets between KillSignal and SIGKILL. Zero: 3 s.
	KillGrace time.Duration
	// Stdin, Stdout, Stderr default to leaderrun's own.
	Stdin          *os.File
	Stdout, Stderr *os.File
	// Log receives one line per signal sent. Zero: slog.Default().
	Log *slog.Logger
}

// readyTimeout bounds the wait for a watchdog's "ready", which a shell says
// within milliseconds of its start; dismissTimeout, the wait for it to go.
const (
	readyTimeout   = 10 * time.Second
	dismissTimeout = 2 * time.Second
)

// Supervisor runs one command. Prepare starts its watchdog while the caller
// campaigns; Start forks the command from this process once it leads.
type Supervisor struct {
	spec Spec
	dog  *exec.Cmd // its pid is the process group id of the command
	conn *os.File  // our end of the watchdog's socket
	r    *bufio.Reader

	started chan struct{} // closed once the watchdog was forked, or failed to be
	err     error         // why it could not be
}

// Prepare starts the watchdog for spec; spec.Env is ignored, the command's
// environment is given to Start. Call Start or Abort exactly once.
func Prepare(spec Spec) (*Supervisor, error) {
	if spec.KillSignal == 0 {
		spec.KillSignal = syscall.SIGTERM
	}
	if spec.KillGrace == 0 {
		spec.KillGrace = 3 * time.Second
	}
	if spec.Log == nil {
		spec.Log = slog.Default()
	}
	dog, err := watchdogCommand(spec.KillSignal)
	if err != nil {
		return nil, err
	}
	fds, err := socketpair()
	if err != nil {
		return nil, fmt.Errorf("socketpair: %w", err)
	}
	// Non-blocking, so that our end goes through the poller: closing it
	// then ends a read in progress instead of waiting for it.
	if err := syscall.SetNonblock(fds[0], true); err != nil {
		syscall.Close(fds[0])
		syscall.Close(fds[1])
		return nil, fmt.Errorf("socketpair: %w", err)
	}
	ours := os.NewFile(uintptr(fds[0]), "watchdog")
	theirs := os.NewFile(uintptr(fds[1]), "leaderrun")
	// The socket is its fd 3; standard input, output and error are
	// /dev/null. In a group of its own, so that nothing meant for
	// leaderrun's group or the command's reaches it.
	dog.ExtraFiles = []*os.File{theirs}
	dog.SysProcAttr = &syscall.SysProcAttr{Setpgid: true}
	s := &Supervisor{spec: spec, dog: dog, conn: ours, r: bufio.NewReader(ours), started: make(chan struct{})}
	// A fork and exec take a good half millisecond: let them overlap with
	// the caller's work. Start and Abort wait for them.
	go func() {
		defer close(s.started)
		defer theirs.Close()
		if err := startTracked(dog); err != nil {
			s.err = fmt.Errorf("start watchdog %s: %w", dog.Path, err)
		}
	}()
	return s, nil
}

// Abort dismisses an unused watchdog. Nothing was started.
func (s *Supervisor) Abort() { s.dismiss() }

// dismiss tells the watchdog that it is no longer needed, and reaps it. A
// watchdog that is already dead is simply reaped.
func (s *Supervisor) dismiss() {
	<-s.started
	_, _ = s.conn.Write([]byte("done\n"))
	s.conn.Close()
	if s.err != nil {
		return
	}
	pid := s.dog.Process.Pid
	// A stopped watchdog (SIGSTOP of its group) would never read the word;
	// one that does not go at once is killed: it is not reaped yet, so the
	// pid is still its own.
	_ = syscall.Kill(pid, syscall.SIGCONT)
	exited := make(chan struct{})
	go func() {
		_ = s.dog.Wait()
		close(exited)
	}()
	select {
	case <-exited:
	case <-time.After(dismissTimeout):
		_ = syscall.Kill(pid, syscall.SIGKILL)
		<-exited
	}
	untrack(pid)
}

// Start forks and execs the command with env, as the leader of a new
// process group, tells the watchdog which group that is, and returns once
// the command runs or has failed to start: an exec failure is an error
// wrapping ErrNotFound or ErrNotExecutable. The watchdog is dismissed when
// the command and its group are gone, or at once if Start fails.
func (s *Supervisor) Start(env []string) (*Child, error) {
	if <-s.started; s.err != nil {
		s.dismiss()
		return nil, s.err
	}
	// The watchdog says "ready" once it reads its socket; by now it has
	// long said so.
	_ = s.conn.SetReadDeadline(time.Now().Add(readyTimeout))
	line, err := s.r.ReadString('\n')
	_ = s.conn.SetReadDeadline(time.Time{})
	if err != nil || line != "ready\n" {
		s.dismiss()
		return nil, fmt.Errorf("the watchdog (pid %d) is not ready to guard the command: %q: %v", s.dog.Process.Pid, line, err)
	}
	c := &Child{s: s, log: s.spec.Log, exited: make(chan struct{}), done: make(chan struct{})}
	started := make(chan error, 1)
	go c.run(env, started)
	if err := <-started; err != nil {
		s.dismiss()
		return nil, err
	}
	go c.guard()
	return c, nil
}

// Child is a running command: the leader of its own process group, whose id
// is its pid.
type Child struct {
	s   *Supervisor
	pid int
	log *slog.Logger

	// exited is closed when the command has been reaped.
	exited chan struct{}

	done   chan struct{}
	status Status
}

// run forks the command, reports the fork's outcome on started, waits for
// the command, clears what it left running, dismisses the watchdog and
// closes done.
func (c *Child) run(env []string, started chan<- error) {
	spec := c.s.spec
	// Pdeathsig belongs to the forking thread, not the process: this
	// goroutine keeps its thread until the command is reaped. It never
	// unlocks, so the runtime ends the thread with the goroutine.
	runtime.LockOSThread()
	files := []uintptr{
		orDefault(spec.Stdin, os.Stdin).Fd(),
		orDefault(spec.Stdout, os.Stdout).Fd(),
		orDefault(spec.Stderr, os.Stderr).Fd(),
	}
	tracked.Lock()
	pid, err := syscall.ForkExec(spec.Path, spec.Args, &syscall.ProcAttr{
		Env:   env,
		Files: files,
		Sys:   childAttr(),
	})
	if err == nil {
		tracked.pids[pid] = true
		// At once: until the watchdog has read this, a SIGKILL of
		// leaderrun is answered by the parent-death signal alone, which
		// kills the command but not what it may have forked in these
		// microseconds since its exec.
		_, _ = fmt.Fprintf(c.s.conn, "pgid %d\n", pid)
	}
	tracked.Unlock()
	if err != nil {
		started <- execError(spec.Path, err)
		return
	}
	c.pid = pid
	started <- nil

	var ws syscall.WaitStatus
	for {
		_, err = syscall.Wait4(pid, &ws, 0, nil)
		if !errors.Is(err, syscall.EINTR) {
			break
		}
	}
	untrack(pid)
	close(c.exited)
	if err != nil {
		c.log.Error("cannot learn how the command ended", "pid", pid, "error", err)
		c.status = Status{Code: 70}
	} else {
		c.status = statusOf(ws)
	}
	c.clear()
	c.s.dismiss()
	close(c.done)
}

// execError turns a failed fork and exec into what a shell would say.
func execError(path string, err error) error {
	switch {
	case errors.Is(err, syscall.ENOENT):
		return &ExecError{Command: path, Reason: err.Error(), Err: ErrNotFound}
	case errors.Is(err, syscall.EACCES), errors.Is(err, syscall.EPERM),
		errors.Is(err, syscall.ENOEXEC), errors.Is(err, syscall.EISDIR):
		return &ExecError{Command: path, Reason: err.Error(), Err: ErrNotExecutable}
	}
	return fmt.Errorf("start %s: %w", path, err)
}

// guard waits for the watchdog's socket to close. Before the command has
// been reaped that means the watchdog died (someone killed it): without it,
// nothing would stop the group if leaderrun died, so the group is killed
// now.
func (c *Child) guard() {
	_, _ = io.Copy(io.Discard, c.s.r)
	select {
	case <-c.exited:
		return
	default:
	}
	c.log.Warn("the command's watchdog died; killing the command's process group", "pgid", c.pid)
	_ = syscall.Kill(-c.pid, syscall.SIGKILL)
}

// clear stops what the command left running once it exited, since nothing
// may run once the lease is released: its process group, and, as a
// subreaper, descendants that left the group (setsid, setpgid), which this
// process inherits once their parents are gone. Kill signal, up to the
// grace period, SIGKILL.
func (c *Child) clear() {
	spec := c.s.spec
	deadline := time.Now().Add(spec.KillGrace)
	signalled := map[int]bool{}
	for give := deadline.Add(10 * time.Second); time.Now().Before(give); time.Sleep(5 * time.Millisecond) {
		escaped := reapOrphans() // first: a zombie still counts in its group
		group := syscall.Kill(-c.pid, 0) == nil
		if !group && len(escaped) == 0 {
			return
		}
		if time.Now().After(deadline) {
			_ = syscall.Kill(-c.pid, syscall.SIGKILL)
			for _, pid := range escaped {
				killTree(pid, syscall.SIGKILL)
			}
			continue
		}
		if group && !signalled[c.pid] {
			signalled[c.pid] = true
			_ = syscall.Kill(-c.pid, spec.KillSignal)
			_ = syscall.Kill(-c.pid, syscall.SIGCONT)
		}
		for _, pid := range escaped {
			if pgid, _ := syscall.Getpgid(pid); !signalled[pid] && pgid != c.pid {
				killTree(pid, spec.KillSignal)
				killTree(pid, syscall.SIGCONT)
			}
			signalled[pid] = true
		}
	}
}

func orDefault(f, def *os.File) *os.File {
	if f != nil {
		return f
	}
	return def
}

// Pid is the command's pid, which is also its process group id.
func (c *Child) Pid() int { return c.pid }

// Done is closed once the command and its process group are gone and the
// watchdog has been reaped.
func (c *Child) Done() <-chan struct{} { return c.done }

// Wait blocks until Done and returns how the command ended.
func (c *Child) Wait() Status {
	<-c.done
	return c.status
}

// Signal sends sig to the command's whole process group.
func (c *Child) Signal(sig syscall.Signal) error {
	select {
	case <-c.done:
		return nil
	default:
	}
	err := syscall.Kill(-c.pid, sig)
	if sig != syscall.SIGKILL && sig != syscall.SIGCONT && err == nil {
		// A stopped group (SIGSTOP, or SIGTTIN from reading a terminal it
		// does not own) would sit on the signal until SIGKILL: wake it,
		// as systemd does.
		_ = syscall.Kill(-c.pid, syscall.SIGCONT)
	}
	c.log.Info("signalled child", "pid", c.pid, "signal", Name(sig))
	if errors.Is(err, syscall.ESRCH) {
		return nil
	}
	return err
}

// Name is a signal's conventional name, SIGTERM rather than "terminated".
func Name(sig syscall.Signal) string {
	for name, s := range byName {
		if s == sig {
			return "SIG" + name
		}
	}
	return strconv.Itoa(int(sig))
}

// ExecError is a command that cannot be run. It unwraps to ErrNotFound or
// ErrNotExecutable.
type ExecError struct {
	Command string
	Reason  string // as a shell would say it: "command not found", "permission denied"
	Err     error
}

func (e *ExecError) Error() string { return e.Command + ": " + e.Reason }
func (e *ExecError) Unwrap() error { return e.Err }

// Resolve finds the executable for name the way a shell would, and reports
// ErrNotFound (exit 127) or ErrNotExecutable (exit 126) before anything is
// started, so that a typo in a crontab line never takes leadership.
func Resolve(name string) (string, error) {
	notFound := &ExecError{Command: name, Reason: "command not found", Err: ErrNotFound}
	if name == "" {
		return "", notFound
	}
	path, err := exec.LookPath(name)
	if err == nil {
		return path, nil
	}
	if strings.Contains(name, "/") {
		fi, serr := os.Stat(name)
		switch {
		case serr != nil:
			return "", &ExecError{Command: name, Reason: "no such file", Err: ErrNotFound}
		case fi.IsDir():
			return "", &ExecError{Command: name, Reason: "is a directory", Err: ErrNotExecutable}
		default:
			return "", &ExecError{Command: name, Reason: "permission denied", Err: ErrNotExecutable}
		}
	}
	if errors.Is(err, exec.ErrNotFound) {
		// A match in PATH without the execute bit is "permission denied" to
		// a shell, not "not found".
		for _, dir := range strings.Split(os.Getenv("PATH"), ":") {
			if dir == "" {
				dir = "."
			}
			if fi, serr := os.Stat(dir + "/" + name); serr == nil && !fi.IsDir() {
				return "", &ExecError{Command: dir + "/" + name, Reason: "permission denied", Err: ErrNotExecutable}
			}
		}
	}
	return "", notFound
}

// tracked holds the pids of the processes this package waits for itself
// (commands and watchdogs), so that the orphan reaper (see BecomeSubreaper)
// and the clearing of escapees leave them alone.
var tracked = struct {
	sync.Mutex
	pids map[int]bool
}{pids: map[int]bool{}}

func startTracked(cmd *exec.Cmd) error {
	tracked.Lock()
	defer tracked.Unlock()
	if err := cmd.Start(); err != nil {
		return err
	}
	tracked.pids[cmd.Process.Pid] = true
	return nil
}

func untrack(pid int) {
	tracked.Lock()
	defer tracked.Unlock()
	delete(tracked.pids, pid)
}
