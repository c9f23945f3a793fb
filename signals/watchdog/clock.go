package watchdog

import (
	"time"

	"github.com/leaderrun/leaderrun/signals/stop"
)

// The clock leaderrun and its watchdog share (see Now): a deadline that
// one computes, the other can keep, however long the message took.

// InstantOf converts t, a time on this process's monotonic clock, to the
// shared clock, at the moment of the call.
func InstantOf(t time.Time) stop.Instant {
	return Now().Add(time.Until(t))
}

// TimeOf converts i back to this process's clock, at the moment of the
// call.
func TimeOf(i stop.Instant) time.Time {
	return time.Now().Add(time.Duration(i - Now()))
}
