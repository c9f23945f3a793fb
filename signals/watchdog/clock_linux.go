//go:build linux

package watchdog

import (
	"errors"

	"github.com/leaderrun/leaderrun/signals/stop"
	"golang.org/x/sys/unix"
)

// Now reads CLOCK_BOOTTIME: monotonic, the same for every process of the
// host, and, unlike CLOCK_MONOTONIC (Go's), counting the time the host is
// suspended, as the store counts the lease (docs/safety.md, S10).
func Now() stop.Instant {
	var ts unix.Timespec
	if err := unix.ClockGettime(unix.CLOCK_BOOTTIME, &ts); err != nil {
		panic("clock_gettime(CLOCK_BOOTTIME): " + err.Error()) // Linux 2.6.39 and later have it
	}
	return stop.Instant(ts.Nano())
}

// alarm is a timerfd on CLOCK_BOOTTIME, for the watchdog's poll loop: it
// becomes readable at an absolute instant, on time after a suspend too,
// where a relative poll timeout would count only the time awake.
type alarm struct {
	fd  int
	set []unix.PollFd // reused: waiting allocates nothing
}

func newAlarm() (*alarm, error) {
	fd, err := unix.TimerfdCreate(unix.CLOCK_BOOTTIME, unix.TFD_NONBLOCK|unix.TFD_CLOEXEC)
	if err != nil {
		return nil, err
	}
	return &alarm{fd: fd}, nil
}

// wait polls fds until one of them is ready or due passes (0: no time
// limit). It returns early on a signal; the caller looks again.
func (a *alarm) wait(fds []unix.PollFd, due stop.Instant) error {
	spec := unix.ItimerSpec{}
	if due > 0 {
		spec.Value = unix.NsecToTimespec(int64(max(due, 1)))
	}
	if err := unix.TimerfdSettime(a.fd, unix.TFD_TIMER_ABSTIME, &spec, nil); err != nil {
		return err
	}
	a.set = append(append(a.set[:0], fds...), unix.PollFd{Fd: int32(a.fd), Events: unix.POLLIN})
	_, err := unix.Ppoll(a.set, nil, nil)
	if errors.Is(err, unix.EINTR) {
		return nil
	}
	return err
}

func (a *alarm) close() { unix.Close(a.fd) }
