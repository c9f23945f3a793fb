//go:build linux

package watchdog

import (
	"os"

	"golang.org/x/sys/unix"
)

// The command's tree on Linux, as the watchdog sees it and as leaderrun
// sees it once the watchdog died.

// newTree is the watchdog's view of the tree of the command pid: its
// cgroup, or the watchdog's descendants but those skip names (the
// keeper).
func newTree(cg *cgroupTree, pid int, skip func(int) bool) tree {
	if cg != nil {
		cg.pgid = pid
		return cg
	}
	return &procTree{root: os.Getpid(), pgid: pid, withKids: true, skip: skip, pidfds: map[int]int{}}
}

// tree is leaderrun's view of the command's tree once its watchdog died:
// the cgroup if it had one, else the command's group and, as a
// subreaper, the orphans re-parented to leaderrun.
func (l Leftovers) tree() tree {
	if dir := l.Cgroup; dir != "" {
		cg := &cgroupTree{dir: dir, dirFD: -1, killFD: -1, events: -1, parentFD: -1, pgid: l.Pgid}
		var err error
		if cg.killFD, err = unix.Open(dir+"/cgroup.kill", unix.O_WRONLY|unix.O_CLOEXEC, 0); err == nil {
			if cg.events, err = unix.Open(dir+"/cgroup.events", unix.O_RDONLY|unix.O_CLOEXEC, 0); err == nil {
				return cg
			}
			unix.Close(cg.killFD)
		}
	}
	return &procTree{root: os.Getpid(), pgid: l.Pgid, withKids: l.Subreaper, skip: l.Skip, lock: l.Lock, pidfds: map[int]int{}}
}
