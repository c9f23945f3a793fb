package cmd

import (
	"errors"
	"fmt"

	"github.com/leaderrun/leaderrun/backends"
	"github.com/leaderrun/leaderrun/command"
	"github.com/leaderrun/leaderrun/runner"
	"github.com/leaderrun/leaderrun/signals"
)

// Exit codes, as in the README's table. The child's own status and 128+N
// for a child killed by signal N come from the child.
const (
	ExitNotLeader   = 1   // check: leadership is not held
	ExitNoLeader    = 3   // status: nobody holds the lock
	ExitUsage       = 64  // EX_USAGE: bad flags or configuration
	ExitDataErr     = 65  // EX_DATAERR: the local backend's token or state file is corrupt or unreadable
	ExitUnavailable = 69  // EX_UNAVAILABLE: store unreachable or refused before leadership, or its companion binary missing
	ExitSoftware    = 70  // EX_SOFTWARE: an internal error
	ExitConflict    = 75  // EX_TEMPFAIL: not acquired (--try, --wait); see --conflict-exit-code
	ExitLost        = 76  // leadership lost while the child ran; the child was stopped
	ExitStalled     = 124 // --progress-timeout passed without a progress report; the child was stopped (as timeout(1))
	ExitNotExec     = 126 // COMMAND is not executable, as shells report it
	ExitNotFound    = 127 // COMMAND is not found, as shells report it
)

// usageError is bad input: a flag, an argument or a combination of them.
type usageError struct{ msg string }

func (e *usageError) Error() string { return e.msg }

func usageErrorf(format string, args ...any) error {
	return &usageError{msg: fmt.Sprintf(format, args...)}
}

// Outcomes that are not failures of leaderrun but have an exit code of
// their own; Main prints nothing for them.
var (
	// errNoLeader is status's answer when nobody holds the lock.
	errNoLeader = errors.New("no leader")
	// errNotLeader is check's answer when leadership is not held.
	errNotLeader = errors.New("not leader")
)

// childExit is run's outcome when the command ran: its own status.
type childExit struct{ status signals.Status }

func (e *childExit) Error() string { return "the command ended: " + e.status.String() }

// codes are the exit codes the user may choose (--conflict-exit-code,
// --done-exit-code).
type codes struct{ conflict, done int }

var defaultCodes = codes{conflict: ExitConflict, done: 0}

// silent reports whether err is an outcome that Main does not print: it
// was said where it happened, or the exit code says it all.
func silent(err error) bool {
	var ce *childExit
	return errors.As(err, &ce) || errors.Is(err, errNoLeader) || errors.Is(err, errNotLeader)
}

// exitCode is the one place where errors become exit codes.
func exitCode(err error, c codes) int {
	var (
		usage       *usageError
		config      *runner.ConfigError
		interrupted *runner.InterruptedError
		child       *childExit
		done        *runner.DoneError
	)
	switch {
	case err == nil:
		return 0
	case errors.As(err, &child):
		return child.status.ExitCode()
	case errors.As(err, &usage), errors.As(err, &config), errors.Is(err, backends.ErrUnsafeState):
		return ExitUsage
	case errors.Is(err, errNoLeader):
		return ExitNoLeader
	case errors.Is(err, errNotLeader):
		return ExitNotLeader
	case errors.As(err, &done):
		return c.done
	case errors.Is(err, runner.ErrNotAcquired):
		return c.conflict
	case errors.Is(err, runner.ErrLeadershipLost):
		return ExitLost
	case errors.Is(err, runner.ErrStalled):
		return ExitStalled
	case errors.Is(err, command.ErrNotFound):
		return ExitNotFound
	case errors.Is(err, command.ErrNotExecutable):
		return ExitNotExec
	case errors.As(err, &interrupted):
		return 128 + int(interrupted.Signal)
	case errors.Is(err, backends.ErrCorruptState):
		return ExitDataErr
	case errors.Is(err, backends.ErrUnavailable):
		return ExitUnavailable
	default:
		return ExitSoftware
	}
}
