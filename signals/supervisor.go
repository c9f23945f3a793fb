package signals

import (
	"context"
	"fmt"
	"log/slog"
	"os"
	"os/exec"
	"strconv"
	"sync"
	"syscall"
	"time"

	"github.com/leaderrun/leaderrun/signals/watchdog"
)

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
// more resident with the stores' clients linked, when it was tried.
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
	wmu  sync.Mutex // one watchdog.Frame at a time

	started chan struct{} // closed once the watchdog was forked, or failed to be
	err     error         // why it could not be

	replies chan reply // watchdog.MsgStarted, watchdog.MsgFailed, or the socket's end, for Start

	mu            sync.Mutex
	guard, detail string // from watchdog.MsgStarted
	child         *Child // once Start sent watchdog.MsgStart

	reaped chan struct{} // closed once the watchdog is reaped
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
		Args: []string{watchdog.ProcessName, watchdog.Arg, formatOf(spec.Log), levelOf(spec.Log).String(),
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
	_ = s.send(watchdog.NewFrame(watchdog.MsgDone), nil, sendTimeout)
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
	var dl watchdog.Instant
	if !deadline.IsZero() {
		dl = max(watchdog.InstantOf(deadline), 1)
		c.deadline = deadline
	}
	f := watchdog.NewFrame(watchdog.MsgStart).U32(uint32(s.spec.KillSignal)).I64(int64(s.spec.KillGrace)).I64(int64(dl)).
		Str(s.spec.Path).Strs(s.spec.Args).Strs(env)
	if len(f) > watchdog.MaxStartFrame {
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
	case watchdog.MsgStarted:
		return c, nil
	case watchdog.MsgFailed:
		s.dismiss()
		return nil, execError(s.spec.Path, syscall.Errno(r.value))
	}
	// The watchdog died, or hangs, while forking: what it forked, if
	// anything, dies of its parent-death signal; the rest is ours.
	_ = s.dog.Process.Kill()
	<-s.reaped
	return nil, fmt.Errorf("start %s: the watchdog (pid %d) did not report the command's start", s.spec.Path, s.dog.Process.Pid)
}

// levelOf is the lowest level at which log writes, for the watchdog's
// own log.
func levelOf(log *slog.Logger) slog.Level {
	for _, l := range []slog.Level{slog.LevelDebug, slog.LevelInfo, slog.LevelWarn, slog.LevelError} {
		if log.Enabled(context.Background(), l) {
			return l
		}
	}
	return slog.LevelError + 4
}

// formatOf is "json" for a log that writes JSON, else "text".
func formatOf(log *slog.Logger) string {
	if _, ok := log.Handler().(*slog.JSONHandler); ok {
		return "json"
	}
	return "text"
}
