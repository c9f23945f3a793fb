package cmd

import (
	"errors"
	"fmt"

	"github.com/leaderrun/leaderrun/backends"
	"github.com/leaderrun/leaderrun/runner"
	"github.com/leaderrun/leaderrun/signals"
)

// Exit codes, as in the README's table. The child's own status and 128+N
// for a child killed by signal N come from the child.
const (
	ExitNotLeader   = 1   // check: leadership is not held
	ExitNoLeader    = 3   // status: nobody holds the lock
	ExitUsage       = 64  // EX_USAGE: bad flags or configuration
	ExitUnavailable = 69  // EX_UNAVAILABLE: store unreachable or refused before leadership
	ExitSoftware    = 70  // EX_SOFTWARE: an internal error
	ExitConflict    = 75  // EX_TEMPFAIL: not acquired (--try, --wait); see --conflict-exit-code
	ExitLost        = 76  // leadership lost while the child ran; the child was stopped
	ExitNotExec     = 126 // COMMAND is not executable, as shells report it
	ExitNotFound    = 127 // COMMAND is not found, as shells report it
)

// usageError is bad input: a flag, an argument or a combination of them.
type usageError struct{ msg string }

func (e *usageError) Error() string { return e.msg }

func usageErrorf(format string, args ...any) error {
	return &usageError{msg: fmt.Sprintf(format, args...)}
}

// errNoLeader is status's answer when nobody holds the lock.
var errNoLeader = errors.New("no leader")

// exitCode is the one place where errors become exit codes.
func exitCode(err error, conflictCode int) int {
	var (
		usage       *usageError
		config      *runner.ConfigError
		interrupted *runner.InterruptedError
	)
	switch {
	case err == nil:
		return 0
	case errors.As(err, &usage), errors.As(err, &config):
		return ExitUsage
	case errors.Is(err, errNoLeader):
		return ExitNoLeader
	case errors.Is(err, runner.ErrNotAcquired):
		return conflictCode
	case errors.Is(err, runner.ErrLeadershipLost):
		return ExitLost
	case errors.Is(err, signals.ErrNotFound):
		return ExitNotFound
	case errors.Is(err, signals.ErrNotExecutable):
		return ExitNotExec
	case errors.As(err, &interrupted):
		return 128 + int(interrupted.Signal)
	case errors.Is(err, backends.ErrUnavailable):
		return ExitUnavailable
	default:
		return ExitSoftware
	}
}
