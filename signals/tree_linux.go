//go:build linux

package signals

import (
	"os"

	"golang.org/x/sys/unix"
)

// The command's tree on Linux, as the watchdog sees it and as leaderrun
// sees it once the watchdog died.

// newTree is the watchdog's view of the tree of the command pid: its
// cgroup, or the watchdog's descendants.
func newTree(cg *cgroupTree, pid int) tree {
	if cg != nil {
		cg.pgid = pid
		return cg
	}
	return &procTree{root: os.Getpid(), pgid: pid, withKids: true, pidfds: map[int]int{}}
}

// fallbackTree is leaderrun's view of the tree of the command pid once
// its watchdog died: the cgroup at dir if it had one, else the command's
// group and, as a subreaper, the orphans re-parented to leaderrun.
func fallbackTree(dir string, pid int) tree {
	if dir != "" {
		cg := &cgroupTree{dir: dir, dirFD: -1, killFD: -1, events: -1, pgid: pid}
		var err error
		if cg.killFD, err = unix.Open(dir+"/cgroup.kill", unix.O_WRONLY|unix.O_CLOEXEC, 0); err == nil {
			if cg.events, err = unix.Open(dir+"/cgroup.events", unix.O_RDONLY|unix.O_CLOEXEC, 0); err == nil {
				return cg
			}
			unix.Close(cg.killFD)
		}
	}
	skip := func(p int) bool { return tracked.pids[p] && p != pid || ownHelper(p) }
	return &procTree{root: os.Getpid(), pgid: pid, withKids: subreaper.Load(), skip: skip, lock: true, pidfds: map[int]int{}}
}
