//go:build darwin

package signals

import (
	"os"
	"syscall"
)

// How the watchdog starts on macOS, and how it forks the command: no
// cgroups, no subreapers, no parent-death signal.

// Flags of the watchdog's socket calls: the watchdog and leaderrun catch
// SIGPIPE instead.
const (
	msgNoSignal    = 0
	msgCmsgCloexec = 0
)

func executable() (string, error) { return os.Executable() }

// prepareGuard: without cgroups or subreapers, the command's process group
// is all there is (Linux is the supported platform).
func prepareGuard() (string, string, *cgroupTree) {
	return guardGroup, "no cgroups or subreapers on this OS", nil
}

// cgroupTree does not exist here.
type cgroupTree struct{ dir string }

func (*cgroupTree) remove(any) {}

// forkCommand forks and execs the command as the leader of a new process
// group. There is no parent-death signal here: the watchdog's socket
// closing is what tells it leaderrun died.
func forkCommand(path string, argv, env []string, _ *cgroupTree) (pid, pidfd int, err error) {
	pid, err = syscall.ForkExec(path, argv, &syscall.ProcAttr{Env: env, Files: []uintptr{0, 1, 2},
		Sys: &syscall.SysProcAttr{Setpgid: true}})
	return pid, -1, err
}

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
