//go:build darwin

package watchdog

import (
	"syscall"
	"time"

	"github.com/leaderrun/leaderrun/signals/stop"
	"golang.org/x/sys/unix"
)

// The command's tree on macOS: its process group.

func newTree(_ *cgroupTree, pid int, _ func(int) bool) tree { return groupTree{pgid: pid} }

func (l Leftovers) tree() tree { return groupTree{pgid: l.Pgid} }

// groupTree is the command's process group, while it has members: without
// subreapers and /proc, descendants that left the group are not found.
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
