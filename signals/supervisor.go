package signals

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"log/slog"
	"os"
	"slices"
	"syscall"
	"time"

	"github.com/leaderrun/leaderrun/command"
	"github.com/leaderrun/leaderrun/signals/watchdog"
	"golang.org/x/sys/unix"
)

// readyTimeout bounds the wait for the watchdog's word that it forked the
// command, which comes within milliseconds of its start.
const readyTimeout = 10 * time.Second

// Supervisor runs one command through its watchdog. Prepare readies the
// watchdog (the one LaunchWatchdog launched, or a new one) while the
// caller campaigns; Start has it fork the command once the caller leads.
type Supervisor struct {
	spec  Spec
	ready chan struct{} // closed once the watchdog was launched, or failed to be
	err   error         // why it could not be
	link  *link
}

// Prepare readies the watchdog for spec: it adopts the one LaunchWatchdog
// launched if it fits spec, or starts one. Call Start or Abort exactly
// once.
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
	if !watchdog.Installed {
		return nil, errNoTakeover
	}
	s := &Supervisor{spec: spec, ready: make(chan struct{})}
	stdio := [3]*os.File{cmp.Or(spec.Stdin, os.Stdin), cmp.Or(spec.Stdout, os.Stdout), cmp.Or(spec.Stderr, os.Stderr)}
	env := watchdogEnv()
	if w := early.Swap(nil); w != nil {
		if w.stdio == stdio && slices.Equal(w.env, env) && alive(w.conn) {
			spec.Log.Debug("adopted the watchdog launched at start", "watchdog", w.proc.Pid)
			s.link = newLink(w)
			close(s.ready)
			return s, nil
		}
		newLink(w).dismiss()
	}
	// Its start overlaps with the caller's campaign.
	go func() {
		defer close(s.ready)
		w, err := launch(stdio, env)
		if err != nil {
			s.err = err
			return
		}
		s.link = newLink(w)
	}()
	return s, nil
}

// alive reports whether the watchdog at the other end of conn is there: it
// writes nothing before the start, so a socket readable or hung up is dead.
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

// Abort dismisses an unused watchdog. Nothing was started; it removes the
// cgroup it prepared and exits.
func (s *Supervisor) Abort() {
	if <-s.ready; s.err == nil {
		s.link.dismiss()
	}
}

// Start has the watchdog fork and exec the command with env, as the
// leader of a new process group, and returns once the command runs or has
// failed to start (an exec failure wraps command.ErrNotFound or
// command.ErrNotExecutable). deadline is when the command must have had the kill
// signal unless SetDeadline moves it (zero: none); hold, if not nil, is a
// descriptor the watchdog (and its keeper) keep open until the tree is
// gone: the local backend's lock file, whose flock then outlives leaderrun
// for as long as the tree does.
func (s *Supervisor) Start(env []string, deadline time.Time, hold *os.File) (*Child, error) {
	if <-s.ready; s.err != nil {
		return nil, s.err
	}
	st := &watchdog.Start{Path: s.spec.Path, Args: s.spec.Args, Env: env, Signal: s.spec.KillSignal, Grace: s.spec.KillGrace,
		LogLevel: int(levelOf(s.spec.Log))}
	_, st.LogJSON = s.spec.Log.Handler().(*slog.JSONHandler)
	if !deadline.IsZero() {
		st.Deadline = max(watchdog.InstantOf(deadline), 1)
	}
	if err := s.link.send(watchdog.Order{Start: st}, hold, readyTimeout); err != nil {
		s.link.dismiss()
		if errors.Is(err, syscall.E2BIG) {
			return nil, command.StartError(s.spec.Path, err)
		}
		return nil, fmt.Errorf("start %s: tell the watchdog: %w", s.spec.Path, err)
	}
	var r watchdog.Report
	select {
	case r = <-s.link.reports:
	case <-time.After(readyTimeout):
	}
	switch {
	case r.Started != nil:
		return newChild(s.spec, s.link, r.Started, deadline), nil
	case r.Failed != 0:
		s.link.dismiss()
		return nil, command.StartError(s.spec.Path, r.Failed)
	}
	// The watchdog died, or hangs, while forking: what it forked dies of
	// its parent-death signal.
	_ = s.link.proc.Kill()
	s.link.dismiss()
	return nil, fmt.Errorf("start %s: the watchdog (pid %d) did not report the command's start", s.spec.Path, s.link.proc.Pid)
}

// levelOf is the lowest level at which log writes.
func levelOf(log *slog.Logger) slog.Level {
	for _, l := range []slog.Level{slog.LevelDebug, slog.LevelInfo, slog.LevelWarn, slog.LevelError} {
		if log.Enabled(context.Background(), l) {
			return l
		}
	}
	return slog.LevelError + 4
}
