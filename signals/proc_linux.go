//go:build linux

package signals

import (
	"errors"
	"os"
	"os/signal"
	"strconv"
	"strings"
	"sync/atomic"
	"syscall"
	"time"

	"golang.org/x/sys/unix"
)

// childAttr makes the command the leader of a new process group, and has
// the kernel SIGKILL it when the forking thread dies.
func childAttr() *syscall.SysProcAttr {
	return &syscall.SysProcAttr{Setpgid: true, Pdeathsig: syscall.SIGKILL}
}

func executable() (string, error) {
	// /proc/self/exe survives the binary being replaced on disk by an upgrade.
	if _, err := os.Stat("/proc/self/exe"); err == nil {
		return "/proc/self/exe", nil
	}
	return os.Executable()
}

// subreaper is set once BecomeSubreaper succeeded: orphaned descendants
// are then this process's children, to reap and, after a command, to stop.
var subreaper atomic.Bool

// BecomeSubreaper makes this process the reaper of orphaned descendants
// (PR_SET_CHILD_SUBREAPER) and reaps them as they exit, leaving alone the
// processes that this package waits for itself. Call it once, from main: in
// a library or test process it would reap children that others wait for.
func BecomeSubreaper() error {
	if err := unix.Prctl(unix.PR_SET_CHILD_SUBREAPER, 1, 0, 0, 0); err != nil {
		return err
	}
	subreaper.Store(true)
	ch := make(chan os.Signal, 1)
	signal.Notify(ch, syscall.SIGCHLD)
	go func() {
		for range ch {
			reapOrphans()
		}
	}()
	return nil
}

// reapOrphans reaps the orphans that have exited, if this process is a
// subreaper.
func reapOrphans() {
	for _, pid := range orphans() {
		var ws unix.WaitStatus
		_, _ = unix.Wait4(pid, &ws, unix.WNOHANG, nil)
	}
}

func socketpair() ([2]int, error) {
	return syscall.Socketpair(syscall.AF_UNIX, syscall.SOCK_STREAM|syscall.SOCK_CLOEXEC, 0)
}

// orphans are this process's children that this package does not wait for
// itself: as a subreaper, the orphans of the command's tree. Read from
// every thread's /proc/self/task/TID/children (a child is listed under the
// thread that forked it, or under the main thread once inherited).
func orphans() []int {
	if !subreaper.Load() {
		// Not a subreaper (a library or test process): orphans go to
		// init, and this process's children are other people's business.
		return nil
	}
	tasks, _ := os.ReadDir("/proc/self/task")
	tracked.Lock()
	defer tracked.Unlock()
	var pids []int
	buf := make([]byte, 512)
	for _, t := range tasks {
		data, _ := os.ReadFile("/proc/self/task/" + t.Name() + "/children")
		for _, field := range strings.Fields(string(data)) {
			pid, err := strconv.Atoi(field)
			if err != nil || tracked.pids[pid] {
				continue
			}
			if p, ok := readStat(pid, buf); ok && ownHelper(p) {
				continue
			}
			pids = append(pids, pid)
		}
	}
	return pids
}

// ownHelper reports whether p, a child of this process, is in this
// process's own process group: one it started for its own needs, such as
// the exec credential plugin that client-go runs and waits for, which
// must not be reaped from under it nor stopped with the command. The
// command leads a group of its own, and its descendants stay in it or
// make new ones; an orphan of the command's tree is never in ours unless
// it moved there on purpose (setpgid into the group of leaderrun, in the
// same session), which this rule does not cover.
func ownHelper(p procInfo) bool { return p.pgid == syscall.Getpgrp() }

// member is a live process of the command's tree.
type member struct{ pid, pgid int }

// members lists the live processes of the command's tree: the members of
// its process group, and every descendant of the command or, as a
// subreaper, of this process, whichever group it is in; zombies (which can
// no longer run) and this package's own processes (watchdogs) excluded.
// Zombies that were inherited are reaped on the way.
//
// It reads the whole process table from /proc (about a millisecond for a
// few hundred processes): the per-thread children lists that orphans reads
// are documented as approximate while processes exit, and a stop sequence
// that missed an orphan would release the lease with it still running.
func (c *Child) members() []member {
	procs := readProcs()
	self := os.Getpid()
	kids := map[int][]int{}
	for pid, p := range procs {
		kids[p.ppid] = append(kids[p.ppid], pid)
	}
	var roots []int
	select {
	case <-c.exited:
	default:
		roots = append(roots, c.pid)
	}
	tracked.Lock()
	defer tracked.Unlock()
	if subreaper.Load() {
		for _, pid := range kids[self] {
			if tracked.pids[pid] || ownHelper(procs[pid]) {
				continue
			}
			if procs[pid].zombie {
				var ws unix.WaitStatus
				_, _ = unix.Wait4(pid, &ws, unix.WNOHANG, nil)
				continue
			}
			roots = append(roots, pid)
		}
	}
	seen := map[int]bool{}
	var out []member
	var visit func(pid int)
	visit = func(pid int) {
		p, ok := procs[pid]
		if !ok || seen[pid] || (tracked.pids[pid] && pid != c.pid) {
			return
		}
		seen[pid] = true
		if !p.zombie {
			out = append(out, member{pid: pid, pgid: p.pgid})
		}
		for _, k := range kids[pid] {
			visit(k)
		}
	}
	for _, pid := range roots {
		visit(pid)
	}
	for pid, p := range procs {
		if p.pgid == c.pid {
			visit(pid)
		}
	}
	return out
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

// exitWaiter waits for any of a set of processes to exit, with pidfds
// (pidfd_open(2), Linux 5.3), which also work for processes that are not
// this process's children. It keeps a pidfd per process across waits.
type exitWaiter struct {
	fds map[int]int
}

func newExitWaiter() *exitWaiter { return &exitWaiter{fds: map[int]int{}} }

// wait returns when one of members exits, or at until. Without pidfds it
// returns after a short pause, and the caller looks again.
func (w *exitWaiter) wait(members []member, until time.Time) {
	live := map[int]bool{}
	var pfds []unix.PollFd
	for _, m := range members {
		live[m.pid] = true
		fd, ok := w.fds[m.pid]
		if !ok {
			var err error
			if fd, err = unix.PidfdOpen(m.pid, 0); err != nil {
				if errors.Is(err, unix.ESRCH) {
					return // gone already: look again
				}
				fd = -1
			}
			w.fds[m.pid] = fd
		}
		if fd >= 0 {
			pfds = append(pfds, unix.PollFd{Fd: int32(fd), Events: unix.POLLIN})
		}
	}
	for pid, fd := range w.fds {
		if !live[pid] {
			if fd >= 0 {
				unix.Close(fd)
			}
			delete(w.fds, pid)
		}
	}
	d := time.Until(until)
	if len(pfds) < len(members) {
		// A process we hold no pidfd for (no pidfd support): look
		// again soon.
		d = min(d, 10*time.Millisecond)
	}
	if d <= 0 {
		return
	}
	ts := unix.NsecToTimespec(d.Nanoseconds())
	for {
		_, err := unix.Ppoll(pfds, &ts, nil)
		if !errors.Is(err, unix.EINTR) {
			return
		}
		if d = time.Until(until); d <= 0 {
			return
		}
		ts = unix.NsecToTimespec(d.Nanoseconds())
	}
}

func (w *exitWaiter) close() {
	for _, fd := range w.fds {
		if fd >= 0 {
			unix.Close(fd)
		}
	}
}
