//go:build !linux

package signals

import (
	"os"
	"syscall"
)

// childAttr: without pdeathsig, the supervisor's socket watch alone kills
// the group when leaderrun dies.
func childAttr() *syscall.SysProcAttr {
	return &syscall.SysProcAttr{Setpgid: true}
}

func executable() (string, error) { return os.Executable() }

func becomeSubreaper() error { return nil }

// BecomeSubreaper is a no-op where the OS has no subreapers.
func BecomeSubreaper() error { return nil }

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

// children is unknown without /proc: escapees are not tracked here.
func children() []int { return nil }
