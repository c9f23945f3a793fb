//go:build darwin

package watchdog

import (
	"errors"
	"github.com/leaderrun/leaderrun/signals/stop"
	"time"

	"golang.org/x/sys/unix"
)

// Now reads CLOCK_MONOTONIC, which every process of the host shares.
func Now() stop.Instant {
	var ts unix.Timespec
	if err := unix.ClockGettime(unix.CLOCK_MONOTONIC, &ts); err != nil {
		panic("clock_gettime(CLOCK_MONOTONIC): " + err.Error())
	}
	return stop.Instant(ts.Nano())
}

// alarm turns an instant into a poll timeout: there is no timerfd here.
type alarm struct{}

func newAlarm() (*alarm, error) { return &alarm{}, nil }

// wait polls fds until one of them is ready or due passes (0: no time
// limit).
func (a *alarm) wait(fds []unix.PollFd, due stop.Instant) error {
	timeout := -1
	if due > 0 {
		d := time.Duration(due - Now())
		timeout = int(max(d+time.Millisecond-1, 0) / time.Millisecond)
	}
	_, err := unix.Poll(fds, timeout)
	if errors.Is(err, unix.EINTR) {
		return nil
	}
	return err
}

func (a *alarm) close() {}
