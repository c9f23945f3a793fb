// Package signals supervises the child command: it runs it in a process
// group of its own under a small supervisor process, forwards signals to the
// group, stops it (kill signal, grace period, SIGKILL) and turns the way it
// ended into an exit code.
//
// Process tree while a command runs:
//
//	leaderrun
//	└── leaderrun-supervisor   (this binary re-executed; see Supervise)
//	    └── COMMAND            (leader of its own process group)
//	        └── grandchildren  (same process group unless they leave it)
//
// The supervisor exists for S4: the kernel's parent-death signal reaches only
// a direct child, so when leaderrun dies, even by SIGKILL, it is the
// supervisor that sees its end of a socket close and kills the whole group.
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
