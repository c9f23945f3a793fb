//go:build darwin

package signals

import (
	"os"
	"syscall"
)

// executable is what leaderrun re-executes as the watchdog.
func executable() (string, error) { return os.Executable() }

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
