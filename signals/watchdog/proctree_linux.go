//go:build linux

package watchdog

import (
	"errors"
	"os"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"time"

	"github.com/leaderrun/leaderrun/signals/stop"
	"golang.org/x/sys/unix"
)

// procTree is the command's tree as the descendants of root, a child
// subreaper to which every orphan of the tree is re-parented, and the
// command's process group (pgid). It reads the whole process table (a
// millisecond for a few hundred processes): the per-thread children lists
// are approximate while processes exit, and a missed orphan would live.
type procTree struct {
	root, pgid int
	// withKids: root's children are the tree's (root is a subreaper);
	// without it, the group and the command's descendants are.
	withKids bool
	// skip names root's children that are not the tree (leaderrun's
	// watchdogs, the watchdog's keeper), read with lock held if lock is
	// not nil.
	skip   func(pid int) bool
	lock   sync.Locker
	pidfds map[int]int // pidfds of the members, kept across looks
}

func (t *procTree) members() []stop.Member {
	procs := readProcs()
	kids := map[int][]int{}
	for pid, p := range procs {
		kids[p.ppid] = append(kids[p.ppid], pid)
	}
	if t.lock != nil {
		t.lock.Lock()
		defer t.lock.Unlock()
	}
	var roots []int
	if p, ok := procs[t.pgid]; ok && !p.zombie {
		roots = append(roots, t.pgid)
	}
	if t.withKids {
		for _, pid := range kids[t.root] {
			switch {
			case t.skip != nil && t.skip(pid):
			case procs[pid].zombie && pid != t.pgid:
				// An orphan that exited: reap it on the way. The
				// command is left to whoever waits for its status.
				var ws unix.WaitStatus
				_, _ = unix.Wait4(pid, &ws, unix.WNOHANG, nil)
			default:
				roots = append(roots, pid)
			}
		}
	}
	seen := map[int]bool{t.root: true}
	var out []stop.Member
	var visit func(pid int)
	visit = func(pid int) {
		p, ok := procs[pid]
		if !ok || seen[pid] || (t.skip != nil && t.skip(pid)) {
			return
		}
		seen[pid] = true
		if !p.zombie {
			out = append(out, stop.Member{Pid: pid, Pgid: p.pgid})
		}
		for _, k := range kids[pid] {
			visit(k)
		}
	}
	for _, pid := range roots {
		visit(pid)
	}
	for pid, p := range procs {
		if p.pgid == t.pgid {
			visit(pid)
		}
	}
	return out
}

// kill sends SIGKILL to the command's group and to every one of pids.
func (t *procTree) kill(pids []int) {
	_ = syscall.Kill(-t.pgid, syscall.SIGKILL)
	for _, pid := range pids {
		_ = syscall.Kill(pid, syscall.SIGKILL)
	}
}

// fds are pidfds (pidfd_open(2), Linux 5.3) of ms, which work for
// processes that are not this process's children too. Without pidfds,
// look again every 10 ms.
func (t *procTree) fds(ms []stop.Member) ([]unix.PollFd, time.Duration) {
	live := map[int]bool{}
	var pfds []unix.PollFd
	limit := time.Duration(-1)
	for _, m := range ms {
		live[m.Pid] = true
		fd, ok := t.pidfds[m.Pid]
		if !ok {
			var err error
			if fd, err = unix.PidfdOpen(m.Pid, 0); err != nil {
				if errors.Is(err, unix.ESRCH) {
					limit = 0 // gone already: look again
				}
				fd = -1
			}
			t.pidfds[m.Pid] = fd
		}
		if fd >= 0 {
			pfds = append(pfds, unix.PollFd{Fd: int32(fd), Events: unix.POLLIN})
		} else if limit < 0 {
			limit = 10 * time.Millisecond
		}
	}
	for pid, fd := range t.pidfds {
		if !live[pid] {
			if fd >= 0 {
				unix.Close(fd)
			}
			delete(t.pidfds, pid)
		}
	}
	return pfds, limit
}

type procInfo struct {
	ppid, pgid int
	zombie     bool
}

// readProcs reads pid, parent, process group and state of every process
// from /proc/PID/stat.
func readProcs() map[int]procInfo {
	d, err := os.Open("/proc")
	if err != nil {
		return nil
	}
	defer d.Close()
	names, _ := d.Readdirnames(-1)
	procs := make(map[int]procInfo, len(names))
	self := os.Getpid()
	buf := make([]byte, 512)
	for _, name := range names {
		pid, err := strconv.Atoi(name)
		if err != nil || pid == self {
			continue
		}
		if p, ok := readStat(pid, buf); ok {
			procs[pid] = p
		}
	}
	return procs
}

// readStat parses /proc/PID/stat: "pid (comm) state ppid pgrp ...", where
// comm may hold spaces and parentheses, hence the last ')'.
func readStat(pid int, buf []byte) (procInfo, bool) {
	fd, err := unix.Open("/proc/"+strconv.Itoa(pid)+"/stat", unix.O_RDONLY|unix.O_CLOEXEC, 0)
	if err != nil {
		return procInfo{}, false
	}
	n, err := unix.Read(fd, buf)
	unix.Close(fd)
	if err != nil || n <= 0 {
		return procInfo{}, false
	}
	data := string(buf[:n])
	i := strings.LastIndexByte(data, ')')
	if i < 0 {
		return procInfo{}, false
	}
	f := strings.Fields(data[i+1:])
	if len(f) < 3 {
		return procInfo{}, false
	}
	ppid, _ := strconv.Atoi(f[1])
	pgid, _ := strconv.Atoi(f[2])
	return procInfo{ppid: ppid, pgid: pgid, zombie: f[0] == "Z" || f[0] == "X"}, true
}

// ProcessGroup is the process group of pid, if it is alive.
func ProcessGroup(pid int) (pgid int, ok bool) {
	p, ok := readStat(pid, make([]byte, 512))
	return p.pgid, ok
}
