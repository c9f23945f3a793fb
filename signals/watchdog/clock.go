package watchdog

import "time"

// Instant is a point in time, in nanoseconds, on the clock that leaderrun
// and its watchdog share (see Now): a deadline that one computes, the
// other can keep, however long the message took.
type Instant int64

// InstantOf converts t, a time on this process's monotonic clock, to the
// shared clock, at the moment of the call.
func InstantOf(t time.Time) Instant {
	return Now() + Instant(time.Until(t))
}

// Time converts i back to this process's clock, at the moment of the call.
func (i Instant) Time() time.Time {
	return time.Now().Add(time.Duration(i - Now()))
}
