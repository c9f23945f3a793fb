//go:build darwin

package watchdog

import (
	"errors"
	"syscall"
	"time"

	"github.com/leaderrun/leaderrun/signals/stop"
	"golang.org/x/sys/unix"
)

// macOS, where leaderrun builds for development (Linux is the supported
// platform): no cgroups, no subreapers, no parent-death signal, no
// timerfd, no keeper. The command's tree is its process group.

// Flags of the socket calls on both ends of the watchdog's socket: the
// watchdog and leaderrun catch SIGPIPE instead.
const (
	SendNoSignal = 0
	recvCloexec  = 0
)

func prepareGuard() guard {
	return guard{kind: GuardGroup, detail: "no cgroups or subreapers on this OS"}
}

// forkCommand forks and execs the command as the leader of a new process
// group. There is no parent-death signal here: the watchdog's socket
// closing is what tells it leaderrun died.
func forkCommand(s *Start, _ *cgroupTree) (pid, pidfd int, err error) {
	pid, err = syscall.ForkExec(s.Path, s.Args, &syscall.ProcAttr{Env: s.Env, Files: []uintptr{0, 1, 2},
		Sys: &syscall.SysProcAttr{Setpgid: true}})
	return pid, -1, err
}

type cgroupTree struct{ dir string }

func (*cgroupTree) remove() error { return nil }

type keeper struct{ pid int }

func (k *keeper) is(pid int) bool                        { return k.pid != 0 && pid == k.pid }
func (k *keeper) start(*cgroupTree, int, []int, *logger) {}
func (k *keeper) dismiss()                               {}

func newTree(_ *cgroupTree, pid int, _ func(int) bool) tree { return groupTree{pgid: pid} }

func (l Leftovers) tree() tree { return groupTree{pgid: l.Pgid} }

// groupTree is the command's process group, while it has members.
type groupTree struct{ pgid int }

func (t groupTree) members() []stop.Member {
	if syscall.Kill(-t.pgid, 0) != nil {
		return nil
	}
	return []stop.Member{{Pid: t.pgid, Pgid: t.pgid}}
}

func (t groupTree) kill([]int) { _ = syscall.Kill(-t.pgid, syscall.SIGKILL) }

// fds: no pidfds here; look again every 10 ms.
func (groupTree) fds([]stop.Member) ([]unix.PollFd, time.Duration) { return nil, 10 * time.Millisecond }

// Now reads CLOCK_MONOTONIC, which every process of the host shares.
func Now() stop.Instant {
	var ts unix.Timespec
	if err := unix.ClockGettime(unix.CLOCK_MONOTONIC, &ts); err != nil {
		panic("clock_gettime(CLOCK_MONOTONIC): " + err.Error())
	}
	return stop.Instant(ts.Nano())
}

// alarm turns an instant into a poll timeout.
type alarm struct{}

func newAlarm() (*alarm, error) { return &alarm{}, nil }

func (a *alarm) wait(fds []unix.PollFd, due stop.Instant) error {
	timeout := -1
	if due > 0 {
		timeout = int(max(time.Duration(due-Now())+time.Millisecond-1, 0) / time.Millisecond)
	}
	if _, err := unix.Poll(fds, timeout); err != nil && !errors.Is(err, unix.EINTR) {
		return err
	}
	return nil
}

func (a *alarm) close() {}
