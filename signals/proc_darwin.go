//go:build darwin

package signals

import (
	"os"
	"syscall"
	"time"
)

// childAttr makes the command the leader of a new process group. Without a
// parent-death signal, the watchdog alone kills the group when leaderrun
// dies.
func childAttr() *syscall.SysProcAttr {
	return &syscall.SysProcAttr{Setpgid: true}
}

func executable() (string, error) { return os.Executable() }

// BecomeSubreaper is a no-op where the OS has no subreapers.
func BecomeSubreaper() error { return nil }

// member is a live process of the command's tree.
type member struct{ pid, pgid int }

// members is the command's process group, while it has members: without
// subreapers and /proc, descendants that left the group are not found
// here (Linux is the supported platform).
func (c *Child) members() []member {
	if syscall.Kill(-c.pid, 0) != nil {
		return nil
	}
	return []member{{pid: c.pid, pgid: c.pid}}
}

// exitWaiter looks again every 10 ms: there are no pidfds here.
type exitWaiter struct{}

func newExitWaiter() *exitWaiter { return &exitWaiter{} }

func (*exitWaiter) wait(_ []member, until time.Time) {
	time.Sleep(min(time.Until(until), 10*time.Millisecond))
}

func (*exitWaiter) close() {}

func socketpair() ([2]int, error) {
	syscall.ForkLock.RLock()
	defer syscall.ForkLock.RUnlock()
	fds, err := syscall.Socketpair(syscall.AF_UNIX, syscall.SOCK_STREAM, 0)
	if err == nil {
		syscall.CloseOnExec(fds[0])
		syscall.CloseOnExec(fds[1])
	}
	return fds, err
}
