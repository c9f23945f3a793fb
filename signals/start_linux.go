//go:build linux

package signals

import (
	"os"
	"syscall"

	"golang.org/x/sys/unix"
)

// How the watchdog starts on Linux, and how it forks the command.

// Flags of the watchdog's socket calls.
const (
	msgNoSignal    = unix.MSG_NOSIGNAL
	msgCmsgCloexec = unix.MSG_CMSG_CLOEXEC
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

// prepareGuard decides, in the watchdog, what keeps the command's tree
// together: a cgroup of its own where one can be made, else the watchdog
// itself as a child subreaper (PR_SET_CHILD_SUBREAPER, Linux 3.4). It
// returns the guard and its detail: the cgroup's path, or why there is
// none.
func prepareGuard() (string, string, *cgroupTree) {
	reaperErr := unix.Prctl(unix.PR_SET_CHILD_SUBREAPER, 1, 0, 0, 0)
	cg, err := makeCgroup()
	if err == nil {
		return guardCgroup, cg.dir, cg
	}
	if reaperErr != nil {
		return guardGroup, "no cgroup (" + err.Error() + "), no subreaper (" + reaperErr.Error() + ")", nil
	}
	return guardSubreaper, "no cgroup: " + err.Error(), nil
}

// forkCommand forks and execs the command as the leader of a new process
// group, with SIGKILL as its parent-death signal (this thread is locked:
// see Watchdog), in cg if not nil. pidfd is -1 where the kernel has none.
func forkCommand(path string, argv, env []string, cg *cgroupTree) (pid, pidfd int, err error) {
	pidfd = -1
	sys := &syscall.SysProcAttr{Setpgid: true, Pdeathsig: syscall.SIGKILL, PidFD: &pidfd}
	if cg != nil {
		sys.UseCgroupFD, sys.CgroupFD = true, cg.dirFD
	}
	pid, err = syscall.ForkExec(path, argv, &syscall.ProcAttr{Env: env, Files: []uintptr{0, 1, 2}, Sys: sys})
	if err != nil {
		return 0, -1, err
	}
	if pidfd < 0 {
		pidfd, _ = unix.PidfdOpen(pid, 0)
		pidfd = max(pidfd, -1)
	}
	return pid, pidfd, nil
}

func socketpair() ([2]int, error) {
	return syscall.Socketpair(syscall.AF_UNIX, syscall.SOCK_STREAM|syscall.SOCK_CLOEXEC, 0)
}
