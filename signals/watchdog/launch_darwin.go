//go:build darwin

package watchdog

import (
	"os"
	"syscall"
)

// Executable is what leaderrun re-executes as the watchdog.
func Executable() (string, error) { return os.Executable() }

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
