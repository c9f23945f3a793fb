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
	// KillGrace is how long the command's whole tree (its process group
	// and every descendant that left it) gets between the first kill signal
	// and SIGKILL: one deadline for all of them. Zero: 3 s.
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
	dog  *exec.Cmd // the watchdog, started (see Prepare)
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
	dogs, err := watchdogCommands(spec.KillSignal)
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
	s := &Supervisor{spec: spec, conn: ours, r: bufio.NewReader(ours), started: make(chan struct{})}
	// A fork and exec take a good half millisecond: let them overlap with
	// the caller's work. Start and Abort wait for them. A watchdog that
	// cannot be started (the built-in one where memfds may not be
	// executed) gives way to the next.
	go func() {
		defer close(s.started)
		defer theirs.Close()
		var errs []error
		for i, dog := range dogs {
			dog.ExtraFiles = []*os.File{theirs}
			dog.SysProcAttr = &syscall.SysProcAttr{Setpgid: true}
			s.dog = dog
			err := startTracked(dog)
			if err == nil {
				s.err = nil
				return
			}
			if i == 0 && builtinDog(dog) {
				machineFailed.Store(true) // not again: a policy forbids it
			}
			errs = append(errs, fmt.Errorf("start watchdog %s: %w", dog.Path, err))
			s.err = errors.Join(errs...)
		}
	}()
	return s, nil
}

// Abort dismisses an unused watchdog. Nothing was started.
func (s *Supervisor) Abort() { s.dismiss() }

// dismiss tells the watchdog that it is no longer needed, and reaps it. A
// watchdog that is already dead is simply reaped.
func (s *Supervisor) dismiss() {
	s.standDown()
	s.reap()
}

// standDown tells the watchdog that it is no longer needed: from the
// moment it reads the word, leaderrun's death no longer makes it kill the
// group. It does not wait for the watchdog to go (see reap).
func (s *Supervisor) standDown() {
	<-s.started
	_, _ = s.conn.Write([]byte("done\n"))
	s.conn.Close()
	if s.err == nil {
		// A stopped watchdog (SIGSTOP of its group) would never read
		// the word.
		_ = syscall.Kill(s.dog.Process.Pid, syscall.SIGCONT)
	}
}

// reap waits for a watchdog that was told to stand down to exit, and
// reaps it; one that does not go at once is killed: it is not reaped yet,
// so the pid is still its own.
func (s *Supervisor) reap() {
	if s.err != nil {
		return
	}
	pid := s.dog.Process.Pid
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
	c := &Child{s: s, log: s.spec.Log, exited: make(chan struct{}), stopping: make(chan struct{}),
		signalled: map[int]bool{}, done: make(chan struct{}), reaped: make(chan struct{})}
	started := make(chan error, 1)
	go c.run(env, started)
	if err := <-started; err != nil {
		s.dismiss()
		return nil, err
	}
	go c.supervise()
	go c.guard()
	return c, nil
}

// Child is a running command: the leader of its own process group, whose id
// is its pid.
//
// Stopping it is one sequence on one clock (docs/safety.md, S9): the first
// kill signal, whether the runner asked for it (Stop) or the command exited
// and left processes behind, fixes killAt = first signal + KillGrace for the
// whole tree: the command's process group and every descendant that left
// it. All of them get the kill signal at once and SIGKILL no later than
// killAt; Done closes only once every one of them is gone. No part of the
// tree ever gets a grace of its own.
type Child struct {
	s   *Supervisor
	pid int
	log *slog.Logger

	// exited is closed when the command has been reaped; status is then set.
	exited chan struct{}
	status Status

	// stopping is closed by the first Stop.
	stopping chan struct{}

	mu sync.Mutex
	// killAt is the one deadline of the stop sequence; zero before the
	// first kill signal.
	killAt time.Time
	// sig is the first kill signal, sent to every member of the tree.
	sig syscall.Signal
	// signalled holds the escapees (members outside the command's group)
	// that got sig; the group as a whole gets it once, at the start.
	signalled map[int]bool
	// known is the tree as the stop sequence last saw it, for the SIGKILL
	// timer; killed is set once that timer fired.
	known  []member
	killed bool
	timer  *time.Timer

	// done is closed once the tree is gone and the watchdog was told to
	// stand down; reaped, once the watchdog is reaped too.
	done, reaped chan struct{}
}

// run forks the command, reports the fork's outcome on started, and waits
// for the command to exit.
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
	if err != nil {
		c.log.Error("cannot learn how the command ended", "pid", pid, "error", err)
		c.status = Status{Code: 70}
	} else {
		c.status = statusOf(ws)
	}
	close(c.exited)
}

// supervise waits for the command to exit or for a Stop, then runs the stop
// sequence until the whole tree is gone, tells the watchdog to stand down
// and closes done; then it reaps the watchdog and closes reaped. The
// watchdog's exit is not waited for before done: the caller's next step
// (releasing the lease) is what the next leader waits for, and the
// watchdog, once told, can no longer act.
func (c *Child) supervise() {
	defer close(c.reaped)
	select {
	case <-c.exited:
	case <-c.stopping:
	}
	c.clear()
	<-c.exited
	c.s.standDown()
	close(c.done)
	c.s.reap()
}

// survivalBound is how long the stop sequence waits for processes that
// SIGKILL has not ended (stuck in uninterruptible sleep) before it gives up
// on them, says so, and lets Done close.
const survivalBound = 5 * time.Second

// clear runs the stop sequence over the command's tree until nothing of it
// is left. Nothing may run once the lease is released (S8): the command's
// process group, and, as a subreaper, descendants that left the group
// (setsid, setpgid), whether their parent still lives or they were
// inherited by this process. A tree that is still there when the command
// exits by itself starts the sequence then.
func (c *Child) clear() {
	w := newExitWaiter()
	defer w.close()
	defer func() {
		c.mu.Lock()
		if c.timer != nil {
			c.timer.Stop()
		}
		c.mu.Unlock()
	}()
	for {
		members := c.members()
		if len(members) == 0 {
			return
		}
		now := time.Now()
		c.mu.Lock()
		c.known = members
		if c.killAt.IsZero() {
			// The command exited by itself and left these behind: the
			// sequence starts now, with the kill signal.
			c.startLocked(c.s.spec.KillSignal, now)
			c.mu.Unlock()
			c.signalGroup(c.sig)
			c.mu.Lock()
		}
		killAt, sig, killed := c.killAt, c.sig, c.killed
		var fresh []int
		if !killed {
			for _, m := range members {
				if m.pgid != c.pid && !c.signalled[m.pid] {
					c.signalled[m.pid] = true
					fresh = append(fresh, m.pid)
				}
			}
		}
		c.mu.Unlock()
		for _, pid := range fresh {
			_ = syscall.Kill(pid, sig)
			_ = syscall.Kill(pid, syscall.SIGCONT)
			c.log.Info("signalled a process that left the command's group", "pid", pid, "signal", Name(sig))
		}
		until := killAt
		if killed || !now.Before(killAt) {
			if now.After(killAt.Add(survivalBound)) {
				c.log.Error("processes of the command survived SIGKILL; giving up on them", "pgid", c.pid, "pids", pidsOf(members))
				return
			}
			// Whatever appeared since the timer fired (a fork racing
			// with it) goes the same way at once.
			c.kill(members)
			until = killAt.Add(survivalBound)
		}
		w.wait(members, until)
	}
}

// kill sends SIGKILL to the command's group and to every one of members.
func (c *Child) kill(members []member) {
	_ = syscall.Kill(-c.pid, syscall.SIGKILL)
	for _, m := range members {
		_ = syscall.Kill(m.pid, syscall.SIGKILL)
	}
}

// killTree is the SIGKILL at killAt, on a timer of its own so that it is
// on time whatever the stop sequence's loop is doing.
func (c *Child) killTree() {
	c.mu.Lock()
	c.killed = true
	members := c.known
	c.mu.Unlock()
	c.kill(members)
	c.log.Warn("still running at the end of --kill-grace; sent SIGKILL", "pgid", c.pid, "pids", pidsOf(members), "grace", c.s.spec.KillGrace)
}

// startLocked begins the stop sequence at now with sig. c.mu is held.
func (c *Child) startLocked(sig syscall.Signal, now time.Time) {
	c.killAt = now.Add(c.s.spec.KillGrace)
	c.sig = sig
	c.timer = time.AfterFunc(time.Until(c.killAt), c.killTree)
	close(c.stopping)
}

func pidsOf(ms []member) []int {
	pids := make([]int, len(ms))
	for i, m := range ms {
		pids[i] = m.pid
	}
	return pids
}

// Stop starts the stop sequence with sig: sig now to the command's group
// (and, from the sequence's goroutine, to every descendant that left it),
// SIGKILL to the whole tree at the latest KillGrace after the first Stop.
// A later Stop sends its signal to the group as Signal does, and changes
// no deadline. Done closes once the tree is gone.
func (c *Child) Stop(sig syscall.Signal) {
	c.mu.Lock()
	first := c.killAt.IsZero()
	if first {
		c.startLocked(sig, time.Now())
	}
	c.mu.Unlock()
	if first {
		c.signalGroup(sig)
		return
	}
	_ = c.Signal(sig)
}

// KillAt is the deadline of the stop sequence, zero before it started.
func (c *Child) KillAt() time.Time {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.killAt
}

// signalGroup sends sig to the command's group, then SIGCONT so that a
// stopped group does not sit on it.
func (c *Child) signalGroup(sig syscall.Signal) {
	err := syscall.Kill(-c.pid, sig)
	if err == nil && sig != syscall.SIGKILL && sig != syscall.SIGCONT {
		_ = syscall.Kill(-c.pid, syscall.SIGCONT)
	}
	if err == nil {
		c.log.Info("signalled child", "pid", c.pid, "signal", Name(sig))
	}
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

func orDefault(f, def *os.File) *os.File {
	if f != nil {
		return f
	}
	return def
}

// Pid is the command's pid, which is also its process group id.
func (c *Child) Pid() int { return c.pid }

// Done is closed once the command and everything it started are gone (S8)
// and the watchdog has been told to stand down; the watchdog may still be
// exiting (see Wait).
func (c *Child) Done() <-chan struct{} { return c.done }

// Status is how the command ended; call it after Done.
func (c *Child) Status() Status {
	<-c.done
	return c.status
}

// Wait blocks until Done and the watchdog has exited and been reaped, and
// returns how the command ended. Call it before returning, so that no
// process or goroutine of this package outlives the caller.
func (c *Child) Wait() Status {
	<-c.reaped
	return c.status
}

// Signal sends sig to the command's whole process group, as it is: the
// signals leaderrun forwards (HUP, USR1, ...). To stop the command, use Stop.
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
