package signals

import "time"

// instant is a point in time, in nanoseconds, on the clock that leaderrun
// and its watchdog share (see clockNow): a deadline that one computes, the
// other can keep, however long the message took.
type instant int64

// instantOf converts t, a time on this process's monotonic clock, to the
// shared clock, at the moment of the call.
func instantOf(t time.Time) instant {
	return clockNow() + instant(time.Until(t))
}

// time converts i back to this process's clock, at the moment of the call.
func (i instant) time() time.Time {
	return time.Now().Add(time.Duration(i - clockNow()))
}
