package signals

import (
	"time"

	"golang.org/x/sys/unix"
)

// member is a live process of the command's tree.
type member struct{ pid, pgid int }

// tree is the command's process tree as one process can see it: the
// watchdog its own (a cgroup, or its descendants as a subreaper), and
// leaderrun the same tree re-parented to it after its watchdog died.
type tree interface {
	// members lists the live processes of the tree; zombies, which can
	// no longer run, are not members.
	members() []member
	// kill sends SIGKILL to every process of the tree; ms is the tree as
	// last seen.
	kill(ms []member)
	// fds are descriptors that become ready when the tree may have
	// shrunk; ms is the tree as last seen. limit is how soon to look
	// again regardless (0: at once, negative: no limit), for what no
	// descriptor can watch.
	fds(ms []member) (pfds []unix.PollFd, limit time.Duration)
}

// Guards: what keeps the command's tree together, strongest first
// (docs/safety.md, "Which guarantee where").
const (
	// guardCgroup: the command runs in a cgroup of its own; every process
	// it starts stays there, and cgroup.kill ends them all.
	guardCgroup = "cgroup"
	// guardSubreaper: the watchdog, a child subreaper, is the command's
	// parent; every process of the tree stays its descendant.
	guardSubreaper = "subreaper"
	// guardGroup: the command's process group only (no subreapers).
	guardGroup = "process group"
)

// sweep kills every process of t with SIGKILL, again and again, until none
// is left or bound has passed: leaderrun's last resort when its watchdog
// died. It returns the processes left over.
func sweep(t tree, bound time.Duration) []member {
	al, err := newAlarm()
	if err != nil {
		return t.members()
	}
	defer al.close()
	end := clockNow() + instant(bound)
	for {
		ms := t.members()
		if len(ms) == 0 || clockNow() >= end {
			return ms
		}
		t.kill(ms)
		due := end
		pfds, limit := t.fds(ms)
		if limit >= 0 {
			due = min(due, clockNow()+instant(limit))
		}
		if due <= clockNow() {
			continue
		}
		_ = al.wait(pfds, due)
	}
}

func pidsOf(ms []member) []int {
	pids := make([]int, len(ms))
	for i, m := range ms {
		pids[i] = m.pid
	}
	return pids
}
