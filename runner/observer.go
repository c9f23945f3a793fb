package runner

import (
	"time"

	"github.com/leaderrun/leaderrun/signals"
)

// EventKind names a state change of a run.
type EventKind int

// The events of a run, in the order they usually come.
const (
	// Campaigning: connected to the store and waiting for the lock.
	Campaigning EventKind = iota
	// Acquired: leadership granted; Token is set.
	Acquired
	// ChildStarted: the child runs; Pid is set.
	ChildStarted
	// Renewed: the store acknowledged a renewal; Latency and Deadline are set.
	Renewed
	// RenewFailed: a renewal failed or timed out; Err is set.
	RenewFailed
	// Lost: leadership is lost (deadline passed or the store said so); Err
	// says why. The child is being stopped.
	Lost
	// Stopping: leaderrun is stopping the child on a signal.
	Stopping
	// ChildExited: the child is gone; Status is set.
	ChildExited
	// Released: the lease was given back (or abandoned after a loss).
	Released
	// Skipped: the run for the once-key had already completed elsewhere;
	// nothing runs.
	Skipped
	// ProgressReported: the progress clock (Config.ProgressTimeout)
	// started with the child, or the child reported progress; Deadline is
	// when the clock runs out.
	ProgressReported
	// Stalled: the child reported no progress for
	// Config.ProgressTimeout; Err (a *StalledError) says how long. The
	// child is being stopped.
	Stalled
)

// Event is one state change. Deadline, where set, is the local deadline for
// the next acknowledged renewal; past it the child is stopped.
type Event struct {
	Kind     EventKind
	Token    uint64
	Pid      int
	Deadline time.Time
	Latency  time.Duration
	Err      error
	Status   signals.Status
	// Slot is the slot of the pool the run holds (--holders), from
	// Acquired on; 0 for a lock of one holder.
	Slot int
}

// Observer is told of every event, synchronously, from the runner's loop;
// it must not block.
type Observer interface {
	Observe(Event)
}

type nopObserver struct{}

func (nopObserver) Observe(Event) {}

// Observers fans events out to several observers, in order.
type Observers []Observer

// Observe implements Observer.
func (obs Observers) Observe(e Event) {
	for _, o := range obs {
		o.Observe(e)
	}
}
