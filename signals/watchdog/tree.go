package watchdog

import (
	"sync"
	"syscall"
	"time"

	"github.com/leaderrun/leaderrun/signals/stop"
	"golang.org/x/sys/unix"
)

// tree is the command's process tree as one process can see it: the
// watchdog its own (a cgroup, or its descendants as a subreaper), and
// leaderrun the same tree re-parented to it after its watchdog died.
type tree interface {
	// members lists the live processes of the tree; zombies, which can
	// no longer run, are not members.
	members() []stop.Member
	// kill sends SIGKILL to every process of the tree; pids are its
	// members as last seen.
	kill(pids []int)
	// fds are descriptors that become ready when the tree may have
	// shrunk; ms is the tree as last seen. limit is how soon to look
	// again regardless (0: at once, negative: no limit), for what no
	// descriptor can watch.
	fds(ms []stop.Member) (pfds []unix.PollFd, limit time.Duration)
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

// SignalGroup sends sig to the process group pgid, then SIGCONT: a
// stopped group (SIGSTOP, or SIGTTIN from reading a terminal it does not
// own) would sit on it until SIGKILL, so it is woken, as systemd does.
func SignalGroup(pgid int, sig syscall.Signal) error {
	err := syscall.Kill(-pgid, sig)
	if err == nil && sig != syscall.SIGKILL && sig != syscall.SIGCONT {
		_ = syscall.Kill(-pgid, syscall.SIGCONT)
	}
	return err
}

// Leftovers is the tree leaderrun finds once the watchdog died.
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

// End drives the stop sequence (package stop), orphaned: SIGKILL to the
// whole tree at once, and again to whatever appears, until none is left or
// stop.Survival has passed; then it removes the command's cgroup. It
// returns the pids left over, and why the cgroup could not be removed.
func (l Leftovers) End() (left []int, err error) {
	t := l.tree()
	al, err := newAlarm()
	if err != nil {
		return nil, err
	}
	defer al.close()
	seq := stop.Sequence{Group: l.Pgid}
	var last []stop.Member
	members := func() []stop.Member { last = t.members(); return last }
	for {
		acts, wake := seq.Next(stop.Input{Now: Now(), Orphaned: true, Exited: true, Members: members})
		for _, a := range acts {
			switch a.Kind {
			case stop.Kill:
				t.kill(a.Pids)
			case stop.GiveUp:
				return a.Pids, nil
			case stop.Done:
				if cg, ok := t.(interface{ remove() error }); ok {
					return nil, cg.remove()
				}
				return nil, nil
			}
		}
		pfds, limit := t.fds(last)
		if limit >= 0 {
			wake = min(wake, Now().Add(limit))
		}
		if wake > Now() {
			_ = al.wait(pfds, wake)
		}
	}
}
