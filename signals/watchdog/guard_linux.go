//go:build linux

package watchdog

import (
	"syscall"

	"golang.org/x/sys/unix"
)

// What guards the command's tree on Linux, and how the watchdog forks it.

// Flags of the socket calls on both ends of the watchdog's socket.
const (
	// SendNoSignal: a write to a closed socket fails with EPIPE, no
	// SIGPIPE.
	SendNoSignal = unix.MSG_NOSIGNAL
	recvCloexec  = unix.MSG_CMSG_CLOEXEC
)

// prepareGuard decides, in the watchdog, what keeps the command's tree
// together: a cgroup of its own where one can be made, else the watchdog
// itself as a child subreaper (PR_SET_CHILD_SUBREAPER, Linux 3.4). It
// returns the guard and its detail: the cgroup's path, or why there is
// none.
func prepareGuard() (string, string, *cgroupTree) {
	reaperErr := unix.Prctl(unix.PR_SET_CHILD_SUBREAPER, 1, 0, 0, 0)
	cg, err := makeCgroup()
	if err == nil {
		return GuardCgroup, cg.dir, cg
	}
	if reaperErr != nil {
		return GuardGroup, "no cgroup (" + err.Error() + "), no subreaper (" + reaperErr.Error() + ")", nil
	}
	return GuardSubreaper, "no cgroup: " + err.Error(), nil
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
