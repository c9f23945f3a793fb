package signals

import (
	"errors"
	"fmt"
	"log/slog"
	"os"
	"os/exec"
	"strconv"
	"sync"
	"syscall"
	"time"

	"golang.org/x/sys/unix"
)

// Spec describes a command to run.
type Spec struct {
	// Path is the resolved executable (see Resolve); Args is the full argv,
	// Args[0] included.
	Path string
	Args []string
	// KillSignal is sent first when the command is stopped. Zero: SIGTERM.
	KillSignal syscall.Signal
	// KillGrace is how long the command's whole tree (its process group
	// and every descendant that left it) gets between the first kill signal
	// and SIGKILL: one deadline for all of them. Zero: 3 s.
	KillGrace time.Duration
	// Stdin, Stdout, Stderr default to leaderrun's own. The watchdog is
	// started with them, and gives them to the command; it writes its
	// own log lines to Stderr.
	Stdin          *os.File
	Stdout, Stderr *os.File
	// Log receives one line per signal sent; the watchdog writes its own
	// lines in the same format (JSON if Log's handler is slog's JSON
	// handler, else text) at the same level. Zero: slog.Default().
	Log *slog.Logger
}

// readyTimeout bounds the wait for the watchdog's word that it forked the
// command, which comes within milliseconds of its start; dismissTimeout,
// the wait for it to go.
const (
	readyTimeout   = 10 * time.Second
	dismissTimeout = 2 * time.Second
)

// watchdogEnv is the watchdog's environment: its Go runtime kept small.
// One P (GOMAXPROCS=1): it has one thing to do at a time. No memory
// profiling (GODEBUG=memprofilerate=0): nobody reads the profile, and its
// buckets are memory touched for nothing. GOGC is left at its default on
// purpose: the watchdog allocates nothing while it waits, so its collector
// never runs, and a lower target would only make it run during package
// initialisation, which frees little (the packages keep what they
// allocate) and touches the collector's own structures: measured, 0.35 MiB
// more resident with the stores' clients linked (docs/performance.md).
// GODEBUG is passed on, so that GODEBUG=inittrace=1 shows the watchdog's
// start too, and GORACE for race-enabled test binaries.
func watchdogEnv() []string {
	godebug := "memprofilerate=0"
	if v := os.Getenv("GODEBUG"); v != "" {
		godebug += "," + v
	}
	env := []string{"GOMAXPROCS=1", "GODEBUG=" + godebug}
	if v, ok := os.LookupEnv("GORACE"); ok {
		env = append(env, "GORACE="+v)
	}
	return env
}

// Supervisor runs one command through its watchdog. Prepare starts the
// watchdog while the caller campaigns; Start has it fork the command once
// the caller leads.
type Supervisor struct {
	spec Spec
	dog  *exec.Cmd
	conn *os.File   // our end of the watchdog's socket
	wmu  sync.Mutex // one frame at a time

	started chan struct{} // closed once the watchdog was forked, or failed to be
	err     error         // why it could not be

	replies chan reply // msgStarted, msgFailed, or the socket's end, for Start

	mu            sync.Mutex
	guard, detail string // from msgStarted
	child         *Child // once Start sent msgStart

	reaped chan struct{} // closed once the watchdog is reaped
}

// reply is the watchdog's answer to msgStart.
type reply struct {
	kind  byte // msgStarted, msgFailed, or 0: the socket closed
	value uint32
}

// Prepare starts the watchdog for spec. Call Start or Abort exactly once.
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
	self, err := executable()
	if err != nil {
		return nil, fmt.Errorf("find this binary to run as the watchdog: %w", err)
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
	s := &Supervisor{spec: spec, conn: os.NewFile(uintptr(fds[0]), "watchdog"), started: make(chan struct{}),
		replies: make(chan reply, 1), reaped: make(chan struct{})}
	theirs := os.NewFile(uintptr(fds[1]), "leaderrun")
	// The socket is its fd 3. In a group of its own, so that nothing
	// meant for leaderrun's group reaches it.
	s.dog = &exec.Cmd{
		Path: self,
		Args: []string{watchdogName, watchdogArg, formatOf(spec.Log), levelOf(spec.Log).String(),
			strconv.Itoa(int(spec.KillSignal))},
		Env:         watchdogEnv(),
		Stdin:       orDefault(spec.Stdin, os.Stdin),
		Stdout:      orDefault(spec.Stdout, os.Stdout),
		Stderr:      orDefault(spec.Stderr, os.Stderr),
		ExtraFiles:  []*os.File{theirs},
		SysProcAttr: &syscall.SysProcAttr{Setpgid: true},
	}
	// A fork and exec take a good half millisecond, and the watchdog's
	// runtime a few more: let them overlap with the caller's campaign.
	// This goroutine then reads the watchdog's socket until it closes, and
	// reaps the watchdog.
	go func() {
		defer close(s.reaped)
		err := startTracked(s.dog)
		theirs.Close()
		if err != nil {
			s.err = fmt.Errorf("start the watchdog (%s): %w", self, err)
			close(s.started)
			s.conn.Close()
			return
		}
		close(s.started)
		s.read()
	}()
	return s, nil
}

// read handles the watchdog's frames until its socket closes, then reaps
// it, and if a command still ran, ends the command's tree.
func (s *Supervisor) read() {
	var buf []byte
	tmp := make([]byte, 512)
	for {
		n, err := s.conn.Read(tmp)
		buf = append(buf, tmp[:n]...)
		for {
			kind, body, rest, ok, ferr := nextFrame(buf, maxReplyFrame)
			if ferr != nil {
				err = ferr
				break
			}
			if !ok {
				break
			}
			buf = rest
			s.handle(kind, &fields{b: body})
		}
		if err != nil {
			break
		}
	}
	s.reply(reply{})
	// The socket closes when the watchdog exits (or we killed it): make
	// sure, and reap it, so that a command it forked is re-parented to
	// this process before we look for it.
	_ = s.dog.Process.Kill()
	_ = s.dog.Wait()
	untrack(s.dog.Process.Pid)
	s.conn.Close()
	s.mu.Lock()
	c := s.child
	s.mu.Unlock()
	if c != nil {
		c.watchdogGone()
	}
}

// handle acts on one frame from the watchdog.
func (s *Supervisor) handle(kind byte, f *fields) {
	s.mu.Lock()
	c := s.child
	s.mu.Unlock()
	switch kind {
	case msgStarted:
		pid, guard, detail := int(f.u32()), f.str(), f.str()
		s.mu.Lock()
		s.guard, s.detail = guard, detail
		s.mu.Unlock()
		if c != nil {
			// Tracked at once: should the watchdog die, the command is
			// re-parented to us, and waited for here, not by the
			// orphan reaper.
			track(pid)
			c.pid = pid
		}
		s.reply(reply{kind: kind, value: uint32(pid)})
	case msgFailed:
		s.reply(reply{kind: kind, value: f.u32()})
	case msgStopping:
		sig, at, why := syscall.Signal(f.u32()), instant(f.i64()), stopReason(f.u32())
		if c != nil && !f.bad {
			c.stopping(sig, at, why)
		}
	case msgKilled:
		if c != nil {
			c.killed()
		}
	case msgExited:
		code, sig := int(f.u32()), syscall.Signal(f.u32())
		if c != nil && !f.bad {
			c.exit(Status{Code: code, Signal: sig})
		}
	case msgGone:
		if c != nil {
			c.gone()
		}
	}
}

// reply hands Start the watchdog's answer; there is one answer per
// start, and Start may have given up waiting.
func (s *Supervisor) reply(r reply) {
	select {
	case s.replies <- r:
	default:
	}
}

// sendTimeout bounds the write of a frame: the watchdog reads all the
// time, and one that has not read for this long (frozen) must not hold
// up leaderrun's own loop. A deadline that is not delivered leaves the
// watchdog an earlier one; a stop, leaderrun's backstop SIGKILL.
const sendTimeout = time.Second

// send writes one frame to the watchdog, with a descriptor for it to hold
// if hold is not nil, waiting at most timeout for the socket to take it.
func (s *Supervisor) send(f frame, hold *os.File, timeout time.Duration) error {
	s.wmu.Lock()
	defer s.wmu.Unlock()
	_ = s.conn.SetWriteDeadline(time.Now().Add(timeout))
	defer s.conn.SetWriteDeadline(time.Time{})
	rc, err := s.conn.SyscallConn()
	if err != nil {
		return err
	}
	b := f.bytes()
	var oob []byte
	if hold != nil {
		oob = unix.UnixRights(int(hold.Fd()))
	}
	whole := len(b)
	for len(b) > 0 {
		var n int
		var serr error
		werr := rc.Write(func(fd uintptr) bool {
			n, serr = unix.SendmsgN(int(fd), b, oob, nil, msgNoSignal)
			return !errors.Is(serr, unix.EAGAIN)
		})
		if err := errors.Join(werr, serr); err != nil {
			if len(b) < whole {
				// Half a frame is on its way: the protocol is broken,
				// and a watchdog that cannot be told anything guards
				// nothing. Its death ends the tree (see read).
				_ = s.dog.Process.Kill()
			}
			return err
		}
		b, oob = b[n:], nil
	}
	return nil
}

// Abort dismisses an unused watchdog. Nothing was started; it removes the
// cgroup it prepared and exits.
func (s *Supervisor) Abort() { s.dismiss() }

// dismiss tells the watchdog that it is no longer needed, and waits until
// it is reaped; one that does not go at once is killed.
func (s *Supervisor) dismiss() {
	s.standDown()
	select {
	case <-s.reaped:
	case <-time.After(dismissTimeout):
		_ = s.dog.Process.Kill()
		<-s.reaped
	}
}

// standDown tells the watchdog that nothing of the tree runs any more (or
// that nothing will): from the moment it reads the word, leaderrun's death
// no longer makes it act. It does not wait for the watchdog to go.
func (s *Supervisor) standDown() {
	if <-s.started; s.err != nil {
		return
	}
	_ = s.send(newFrame(msgDone), nil, sendTimeout)
	// A stopped watchdog (SIGSTOP of its group) would never read it.
	_ = s.dog.Process.Signal(syscall.SIGCONT)
}

// Start has the watchdog fork and exec the command with env, as the
// leader of a new process group, and returns once the command runs or has
// failed to start: an exec failure is an error wrapping ErrNotFound or
// ErrNotExecutable. deadline is when the command must have had the kill
// signal unless SetDeadline moves it (zero: no deadline); hold, if not
// nil, is a descriptor the watchdog keeps open until the command's whole
// tree is gone (the local backend's lock file: its flock then outlives
// leaderrun for as long as the tree does). The watchdog is dismissed when
// the tree is gone, or at once if Start fails.
func (s *Supervisor) Start(env []string, deadline time.Time, hold *os.File) (*Child, error) {
	if <-s.started; s.err != nil {
		return nil, s.err
	}
	c := &Child{s: s, log: s.spec.Log, exited: make(chan struct{}), done: make(chan struct{})}
	s.mu.Lock()
	s.child = c
	s.mu.Unlock()
	var dl instant
	if !deadline.IsZero() {
		dl = max(instantOf(deadline), 1)
		c.deadline = deadline
	}
	f := newFrame(msgStart).u32(uint32(s.spec.KillSignal)).i64(int64(s.spec.KillGrace)).i64(int64(dl)).
		str(s.spec.Path).strs(s.spec.Args).strs(env)
	if len(f) > maxStartFrame {
		s.dismiss()
		return nil, execError(s.spec.Path, syscall.E2BIG)
	}
	if err := s.send(f, hold, readyTimeout); err != nil {
		s.dismiss()
		return nil, fmt.Errorf("start %s: tell the watchdog: %w", s.spec.Path, err)
	}
	var r reply
	select {
	case r = <-s.replies:
	case <-time.After(readyTimeout):
	}
	switch r.kind {
	case msgStarted:
		return c, nil
	case msgFailed:
		s.dismiss()
		return nil, execError(s.spec.Path, syscall.Errno(r.value))
	}
	// The watchdog died, or hangs, while forking: what it forked, if
	// anything, dies of its parent-death signal; the rest is ours.
	_ = s.dog.Process.Kill()
	<-s.reaped
	return nil, fmt.Errorf("start %s: the watchdog (pid %d) did not report the command's start", s.spec.Path, s.dog.Process.Pid)
}

func orDefault(f, def *os.File) *os.File {
	if f != nil {
		return f
	}
	return def
}
