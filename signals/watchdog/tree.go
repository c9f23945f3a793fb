package watchdog

import (
	"sync"
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
	// GuardCgroup: the command runs in a cgroup of its own; every process
	// it starts stays there, and cgroup.kill ends them all.
	GuardCgroup = "cgroup"
	// GuardSubreaper: the watchdog, a child subreaper, is the command's
	// parent; every process of the tree stays its descendant.
	GuardSubreaper = "subreaper"
	// GuardGroup: the command's process group only (no subreapers).
	GuardGroup = "process group"
)

// Leftovers is a command's tree as leaderrun finds it once the command's
// watchdog died (someone killed it): the command died of its parent-death
// signal, and the rest of its tree was re-parented to leaderrun, a
// subreaper, or stayed in its cgroup.
type Leftovers struct {
	Cgroup string // the command's cgroup, "" if it had none
	Pgid   int    // the command's pid, the leader of its process group
	// Subreaper: this process is a child subreaper, so the tree's orphans
	// are its children.
	Subreaper bool
	// Skip names this process's children that are not the tree's; it is
	// called with Lock held, if Lock is not nil.
	Skip func(pid int) bool
	Lock sync.Locker
}

// End sends SIGKILL to every process of the tree, again and again, until
// none is left or survivalBound has passed, then removes the command's
// cgroup. It returns the pids left over, and why the cgroup could not be
// removed.
func (l Leftovers) End() (left []int, err error) {
	t := l.tree()
	if ms := sweep(t, survivalBound); len(ms) > 0 {
		return pidsOf(ms), nil
	}
	if cg, ok := t.(interface{ remove() error }); ok {
		return nil, cg.remove()
	}
	return nil, nil
}

// sweep kills every process of t with SIGKILL, again and again, until none
// is left or bound has passed. It returns the processes left over.
func sweep(t tree, bound time.Duration) []member {
	al, err := newAlarm()
	if err != nil {
		return t.members()
	}
	defer al.close()
	end := Now() + Instant(bound)
	for {
		ms := t.members()
		if len(ms) == 0 || Now() >= end {
			return ms
		}
		t.kill(ms)
		due := end
		pfds, limit := t.fds(ms)
		if limit >= 0 {
			due = min(due, Now()+Instant(limit))
		}
		if due <= Now() {
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
