//go:build darwin

package signals

import (
	"os"
	"syscall"
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

// reapOrphans has nothing to do: without subreapers, orphans are not ours,
// and descendants that left the command's group are not tracked here.
func reapOrphans() []int { return nil }

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
