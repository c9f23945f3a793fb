//go:build linux

package signals

import (
	"os"
	"syscall"
)

// executable is what leaderrun re-executes as the watchdog:
// /proc/self/exe, the very file this process runs, even if an upgrade
// replaced it on disk since, so that both share its pages.
func executable() (string, error) {
	if _, err := os.Stat("/proc/self/exe"); err == nil {
		return "/proc/self/exe", nil
	}
	return os.Executable()
}

func socketpair() ([2]int, error) {
	return syscall.Socketpair(syscall.AF_UNIX, syscall.SOCK_STREAM|syscall.SOCK_CLOEXEC, 0)
}
