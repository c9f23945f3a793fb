package signals

import (
	"fmt"
	"syscall"
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
