package runner

import (
	"errors"
	"fmt"
	"syscall"
	"time"

	"github.com/leaderrun/leaderrun/backends"
	"github.com/leaderrun/leaderrun/signals"
)

// Errors that end a run without the child's own status.
var (
	// ErrNotAcquired: --try found the lock held, or --wait ran out.
	ErrNotAcquired = errors.New("runner: leadership not acquired")
	// ErrLeadershipLost: the lease was lost while the child ran and the
	// child was stopped. LostError carries the detail.
	ErrLeadershipLost = errors.New("runner: leadership lost")
)

// NotAcquiredError says why leadership was not acquired; it unwraps to
// ErrNotAcquired.
type NotAcquiredError struct{ Reason string }

func (e *NotAcquiredError) Error() string { return e.Reason }
func (e *NotAcquiredError) Unwrap() error { return ErrNotAcquired }

// LostError says why leadership was lost while the child ran.
type LostError struct {
	Reason error
}

func (e *LostError) Error() string   { return fmt.Sprintf("leadership lost: %v", e.Reason) }
func (e *LostError) Unwrap() []error { return []error{ErrLeadershipLost, e.Reason} }

// DoneError: the run for the once-key had already completed; nothing ran.
type DoneError struct{ Marker backends.Marker }

func (e *DoneError) Error() string {
	return fmt.Sprintf("the run for %q was completed by %s (token %d) at %s", e.Marker.Key, e.Marker.Identity,
		e.Marker.Token, e.Marker.At.UTC().Format(time.RFC3339))
}

// InterruptedError: a signal withdrew the candidacy before leadership was won.
type InterruptedError struct{ Signal syscall.Signal }

func (e *InterruptedError) Error() string {
	return fmt.Sprintf("interrupted by %s while waiting for leadership", signals.Name(e.Signal))
}
