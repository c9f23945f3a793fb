//go:build linux

package testenv

import (
	"errors"
	"syscall"
	"testing"
	"time"

	"golang.org/x/sys/unix"
)

// Process watches a process that need not be the test's child, through a
// pidfd, so that the test learns the moment it dies without polling.
type Process struct {
	Pid int
	fd  int
}

// Watch opens a pidfd on pid; the process is SIGKILLed, if still alive, and
// the pidfd closed when the test ends.
func Watch(t testing.TB, pid int) *Process {
	t.Helper()
	fd, err := unix.PidfdOpen(pid, 0)
	if err != nil {
		t.Fatalf("pidfd_open(%d): %v", pid, err)
	}
	t.Cleanup(func() {
		_ = syscall.Kill(pid, syscall.SIGKILL)
		unix.Close(fd)
	})
	return &Process{Pid: pid, fd: fd}
}

// Died waits for the process to exit and returns when it did (a zombie
// counts as dead), failing the test after limit.
func (p *Process) Died(t testing.TB, limit time.Duration) time.Time {
	t.Helper()
	ts := unix.NsecToTimespec(limit.Nanoseconds())
	for {
		n, err := unix.Ppoll([]unix.PollFd{{Fd: int32(p.fd), Events: unix.POLLIN}}, &ts, nil)
		if errors.Is(err, unix.EINTR) {
			continue
		}
		if err != nil || n == 0 {
			t.Fatalf("process %d still alive after %v (%v)", p.Pid, limit, err)
		}
		return time.Now()
	}
}
