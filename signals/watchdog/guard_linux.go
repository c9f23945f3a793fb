//go:build linux

package watchdog

import (
	"syscall"

	"golang.org/x/sys/unix"
)

// Flags of the socket calls on both ends of the watchdog's socket.
const (
	// SendNoSignal: a write to a closed socket fails (EPIPE), no SIGPIPE.
	SendNoSignal = unix.MSG_NOSIGNAL
	recvCloexec  = unix.MSG_CMSG_CLOEXEC
)

// prepareGuard decides, in the watchdog, what keeps the command's tree
// together: a cgroup of its own where one can be made, else the watchdog
// itself as a child subreaper (PR_SET_CHILD_SUBREAPER, Linux 3.4).
func prepareGuard() guard {
	reaperErr := unix.Prctl(unix.PR_SET_CHILD_SUBREAPER, 1, 0, 0, 0)
	cg, err := makeCgroup()
	switch {
	case err == nil:
		return guard{kind: GuardCgroup, detail: cg.dir, cg: cg}
	case reaperErr != nil:
		return guard{kind: GuardGroup, detail: "no cgroup (" + err.Error() + "), no subreaper (" + reaperErr.Error() + ")"}
	}
	return guard{kind: GuardSubreaper, detail: "no cgroup: " + err.Error()}
}

// forkCommand forks and execs the command as the leader of a new process
// group, with SIGKILL as its parent-death signal (this thread is locked:
// see Main), in cg if not nil. pidfd is -1 where the kernel has none.
func forkCommand(s *Start, cg *cgroupTree) (pid, pidfd int, err error) {
	pidfd = -1
	sys := &syscall.SysProcAttr{Setpgid: true, Pdeathsig: syscall.SIGKILL, PidFD: &pidfd}
	if cg != nil {
		sys.UseCgroupFD, sys.CgroupFD = true, cg.dirFD
	}
	pid, err = syscall.ForkExec(s.Path, s.Args, &syscall.ProcAttr{Env: s.Env, Files: []uintptr{0, 1, 2}, Sys: sys})
	if err != nil {
		return 0, -1, err
	}
	if pidfd < 0 {
		pidfd, _ = unix.PidfdOpen(pid, 0)
		pidfd = max(pidfd, -1)
	}
	return pid, pidfd, nil
}
