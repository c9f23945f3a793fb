// Package signals supervises the child command: its watchdog forks it
// into a process group of its own, forwards signals to the group, stops it
// (kill signal, grace period, SIGKILL), clears whatever the command left
// behind, and turns the way it ended into an exit code.
//
// Process tree while a command runs:
//
//	leaderrun                  (campaigns, renews, sends the deadlines)
//	└── leaderrun-dog          (the watchdog: this binary re-executed; see watchdog.go)
//	    └── COMMAND            (leader of its own process group, in a cgroup of its own where possible)
//	        └── grandchildren  (same process group unless they leave it)
//
// The watchdog is the command's parent, so that what must hold while
// leaderrun is frozen, starved or dead (docs/safety.md, S10) is held by a
// process that is none of those: the renew deadline, which leaderrun sends
// after every acknowledged renewal; the one stop sequence (S9), whoever
// starts it; the whole tree, escapees included, in a cgroup of its own
// (cgroup.kill) or below the watchdog as a child subreaper; and SIGKILL to
// all of it the moment leaderrun's end of the socket closes without a word.
// The command's parent-death signal (SIGKILL, set with the watchdog's
// forking thread locked) ends the command if the watchdog itself dies;
// leaderrun, a subreaper too, then ends the rest.
package signals

import (
	"errors"
	"fmt"
	"os"
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

// Forwarded are the signals that leaderrun passes on to the command's
// process group as they are (S6). SIGTERM and SIGINT also start the stop
// sequence in the runner. The watchdog catches and drops them.
var Forwarded = []os.Signal{
	syscall.SIGHUP, syscall.SIGINT, syscall.SIGQUIT, syscall.SIGTERM,
	syscall.SIGUSR1, syscall.SIGUSR2, syscall.SIGWINCH,
}
