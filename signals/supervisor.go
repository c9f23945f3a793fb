package signals

import (
	"context"
	"fmt"
	"log/slog"
	"os"
	"slices"
	"sync"
	"sync/atomic"
	"syscall"
	"time"

	"github.com/leaderrun/leaderrun/signals/watchdog"
	"golang.org/x/sys/unix"
)

// readyTimeout bounds the wait for the watchdog's word that it forked the
// command, which comes within milliseconds of its start; dismissTimeout,
// the wait for it to go.
const (
	readyTimeout   = 10 * time.Second
	dismissTimeout = 2 * time.Second
)

// Supervisor runs one command through its watchdog. Prepare readies the
// watchdog (launched at leaderrun's start, or now) while the caller
// campaigns; Start has it fork the command once the caller leads.
type Supervisor struct {
	spec Spec
	dog  *os.Process
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

// Prepare readies the watchdog for spec: it adopts the one launched at
// leaderrun's start if it fits spec (see watchdog.Adopt), or starts one.
// Call Start or Abort exactly once.
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
	s := &Supervisor{spec: spec, started: make(chan struct{}), replies: make(chan reply, 1), reaped: make(chan struct{})}
	stdio := [3]*os.File{orDefault(spec.Stdin, os.Stdin), orDefault(spec.Stdout, os.Stdout), orDefault(spec.Stderr, os.Stderr)}
	env := watchdog.Env()
	if w := early.Swap(nil); w != nil {
		if w.Stdio == stdio && slices.Equal(w.Env, env) && alive(w.Conn) {
			spec.Log.Debug("adopted the watchdog launched at start", "watchdog", w.Proc.Pid)
			s.ready(w)
			return s, nil
		}
		dismissEarly(w)
	}
	self, err := watchdog.Executable()
	if err != nil {
		return nil, fmt.Errorf("find this binary to run as the watchdog: %w", err)
	}
	// A fork and exec take a good half millisecond, and the watchdog's
	// runtime a few more: let them overlap with the caller's campaign.
	go func() {
		w, err := launchTracked(self, stdio, env)
		if err != nil {
			s.err = err
			close(s.started)
			close(s.reaped)
			return
		}
		s.ready(w)
	}()
	return s, nil
}

// ready takes w as this Supervisor's watchdog, tells it its
// configuration, and reads its socket until it closes, then reaps it.
func (s *Supervisor) ready(w *watchdog.Launched) {
	s.dog, s.conn = w.Proc, w.Conn
	// The first frame: the socket is empty, so it does not wait.
	_ = s.send(watchdog.NewFrame(watchdog.MsgConfig).Str(formatOf(s.spec.Log)).Str(levelOf(s.spec.Log).String()).
		U32(uint32(s.spec.KillSignal)), nil, sendTimeout)
	close(s.started)
	go func() {
		defer close(s.reaped)
		s.read()
	}()
}

// early is the watchdog launched at leaderrun's start (watchdog.Adopt),
// until Prepare adopts it: tracked from before main, so that the orphan
// reaper leaves it alone.
var early atomic.Pointer[watchdog.Launched]

func init() {
	if w := watchdog.Adopt(); w != nil {
		track(w.Proc.Pid)
		early.Store(w)
	}
}

// DismissEarly lets go of the watchdog launched at start, if Prepare has
// not adopted it, for a leaderrun about to become another program
// (execve): its socket is closed, so that it exits, and nothing waits for
// that; the program this process becomes reaps it as an orphan (see
// BecomeSubreaper).
func DismissEarly() {
	if w := early.Swap(nil); w != nil {
		w.Conn.Close()
	}
}

// alive reports whether the watchdog at the other end of conn is there:
// it writes nothing before it forked the command, so a socket that is
// readable, or hung up, before then is one whose watchdog exited.
func alive(conn *os.File) bool {
	rc, err := conn.SyscallConn()
	if err != nil {
		return false
	}
	ok := false
	_ = rc.Control(func(fd uintptr) {
		pfd := []unix.PollFd{{Fd: int32(fd), Events: unix.POLLIN}}
		n, err := unix.Poll(pfd, 0)
		ok = err == nil && n == 0
	})
	return ok
}

// dismissEarly lets go of a watchdog launched at start that does not fit,
// or died: closing its socket before it was told anything makes it exit.
func dismissEarly(w *watchdog.Launched) {
	w.Conn.Close()
	done := make(chan struct{})
	go func() {
		_, _ = w.Proc.Wait()
		close(done)
	}()
	select {
	case <-done:
	case <-time.After(dismissTimeout):
		_ = w.Proc.Kill()
		<-done
	}
	untrack(w.Proc.Pid)
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
		_ = s.dog.Kill()
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
	_ = s.dog.Signal(syscall.SIGCONT)
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
	_ = s.dog.Kill()
	<-s.reaped
	return nil, fmt.Errorf("start %s: the watchdog (pid %d) did not report the command's start", s.spec.Path, s.dog.Pid)
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
