// Package signals supervises the child command: it forks it into a process
// group of its own, forwards signals to the group, stops it (kill signal,
// grace period, SIGKILL), clears whatever the command left behind, and turns
// the way it ended into an exit code.
//
// Process tree while a command runs:
//
//	leaderrun                  (forks COMMAND itself; a child subreaper)
//	├── watchdog               (/bin/sh; see watchdog.go)
//	└── COMMAND                (leader of its own process group)
//	    └── grandchildren      (same process group unless they leave it)
//
// S4 of docs/safety.md (the child never outlives leaderrun) has two halves. The kernel's parent-death signal (SIGKILL, set with the
// forking OS thread locked) takes COMMAND down with leaderrun, even when
// leaderrun is killed with SIGKILL; it reaches only a direct child. The
// watchdog covers the rest of the group: leaderrun tells it the group the
// moment the command is forked, and when leaderrun's end of its socket
// closes without a word, leaderrun is gone and the watchdog kills that
// group.
package signals

import (
	"errors"
	"fmt"
	"syscall"
)

// Errors for a command that cannot be started. cmd maps them to 127 and 126
// as shells do.
var (
	ErrNotFound      = errors.New("signals: command not found")
	ErrNotExecutable = errors.New("signals: command not executable")
)

// Status is how a command ended.
type Status struct {
	// Code is the exit status when the command exited by itself.
	Code int
	// Signal is the signal that killed it, zero if it exited.
	Signal syscall.Signal
}

// ExitCode is the status as a shell reports it: the exit code, or 128+N for
// death by signal N.
func (s Status) ExitCode() int {
	if s.Signal != 0 {
		return 128 + int(s.Signal)
	}
	return s.Code
}

func (s Status) String() string {
	if s.Signal != 0 {
		return "killed by " + Name(s.Signal)
	}
	return fmt.Sprintf("exit status %d", s.Code)
}

func statusOf(ws syscall.WaitStatus) Status {
	if ws.Signaled() {
		return Status{Signal: ws.Signal()}
	}
	return Status{Code: ws.ExitStatus()}
}
