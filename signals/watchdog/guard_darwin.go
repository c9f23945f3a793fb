//go:build darwin

package watchdog

import "syscall"

// What guards the command's tree on macOS, and how the watchdog forks it:
// no cgroups, no subreapers, no parent-death signal.

// Flags of the socket calls on both ends of the watchdog's socket: the
// watchdog and leaderrun catch SIGPIPE instead.
const (
	SendNoSignal = 0
	recvCloexec  = 0
)

// prepareGuard: without cgroups or subreapers, the command's process group
// is all there is (Linux is the supported platform).
func prepareGuard() guard {
	return guard{kind: GuardGroup, detail: "no cgroups or subreapers on this OS"}
}

// cgroupTree does not exist here.
type cgroupTree struct{ dir string }

func (*cgroupTree) remove() error { return nil }

// forkCommand forks and execs the command as the leader of a new process
// group. There is no parent-death signal here: the watchdog's socket
// closing is what tells it leaderrun died.
func forkCommand(s *Start, _ *cgroupTree) (pid, pidfd int, err error) {
	pid, err = syscall.ForkExec(s.Path, s.Args, &syscall.ProcAttr{Env: s.Env, Files: []uintptr{0, 1, 2},
		Sys: &syscall.SysProcAttr{Setpgid: true}})
	return pid, -1, err
}
