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

// Flags of the watchdog's socket calls.
const (
	msgNoSignal    = unix.MSG_NOSIGNAL
	msgCmsgCloexec = unix.MSG_CMSG_CLOEXEC
)

// executable is what leaderrun re-executes as the watchdog:
// /proc/self/exe, the very file this process runs, even if an upgrade
// replaced it on disk since, so that both share its pages.
func executable() (string, error) {
	if _, err := os.Stat("/proc/self/exe"); err == nil {
		return "/proc/self/exe", nil
	}
	return os.Executable()
}

// prepareGuard decides, in the watchdog, what keeps the command's tree
// together: a cgroup of its own where one can be made, else the watchdog
// itself as a child subreaper (PR_SET_CHILD_SUBREAPER, Linux 3.4). It
// returns the guard and its detail: the cgroup's path, or why there is
// none.
func prepareGuard() (string, string, *cgroupTree) {
	reaperErr := unix.Prctl(unix.PR_SET_CHILD_SUBREAPER, 1, 0, 0, 0)
	cg, err := makeCgroup()
	if err == nil {
		return guardCgroup, cg.dir, cg
	}
	if reaperErr != nil {
		return guardGroup, "no cgroup (" + err.Error() + "), no subreaper (" + reaperErr.Error() + ")", nil
	}
	return guardSubreaper, "no cgroup: " + err.Error(), nil
}

// forkCommand forks and execs the command as the leader of a new process
// group, with SIGKILL as its parent-death signal (this thread is locked:
// see Watchdog), in cg if not nil. pidfd is -1 where the kernel has none.
func forkCommand(path string, argv, env []string, cg *cgroupTree) (pid, pidfd int, err error) {
	pidfd = -1
	sys := &syscall.SysProcAttr{Setpgid: true, Pdeathsig: syscall.SIGKILL, PidFD: &pidfd}
	if cg != nil {
		sys.UseCgroupFD, sys.CgroupFD = true, cg.dirFD
	}
	pid, err = syscall.ForkExec(path, argv, &syscall.ProcAttr{Env: env, Files: []uintptr{0, 1, 2}, Sys: sys})
	if err != nil {
		return 0, -1, err
	}
	if pidfd < 0 {
		pidfd, _ = unix.PidfdOpen(pid, 0)
		pidfd = max(pidfd, -1)
	}
	return pid, pidfd, nil
}

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

// ownHelper reports whether pid, a child of this process, is in this
// process's own process group: one it started for its own needs, such as
// the exec credential plugin that client-go runs and waits for, which must
// not be reaped from under it nor stopped with the command. The command
// leads a group of its own, and its descendants stay in it or make new
// ones; an orphan of the command's tree is never in ours unless it moved
// there on purpose (setpgid into leaderrun's group, in the same session),
// which this rule does not cover.
func ownHelper(pid int) bool {
	p, ok := readStat(pid, make([]byte, 512))
	return ok && p.pgid == syscall.Getpgrp()
}

// subreaper is set once BecomeSubreaper succeeded: orphaned descendants
// are then this process's children, to reap and, after a command, to stop.
var subreaper atomic.Bool

// BecomeSubreaper makes this process the reaper of orphaned descendants
// (PR_SET_CHILD_SUBREAPER) and reaps them as they exit, leaving alone the
// processes that this package waits for itself. Call it once, from main: in
// a library or test process it would reap children that others wait for.
// leaderrun needs it only if its watchdog dies while a command runs: the
// command's tree is then re-parented to leaderrun, which ends it.
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
// itself: as a subreaper, the orphans of a command's tree. Read from
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
	for _, t := range tasks {
		data, _ := os.ReadFile("/proc/self/task/" + t.Name() + "/children")
		for _, field := range strings.Fields(string(data)) {
			if pid, err := strconv.Atoi(field); err == nil && !tracked.pids[pid] && !ownHelper(pid) {
				pids = append(pids, pid)
			}
		}
	}
	return pids
}

// procTree is the command's tree as the descendants of root, a child
// subreaper, and the members of the command's process group (pgid): every
// orphan of the tree is re-parented to root, so none can leave it. It reads
// the whole process table from /proc (about a millisecond for a few hundred
// processes): the per-thread children lists are documented as approximate
// while processes exit, and a missed orphan would outlive the sequence.
type procTree struct {
	root, pgid int
	// withKids: root's children are the tree's (root is a subreaper);
	// without it, the group and the command's descendants are.
	withKids bool
	// skip names root's children that are not the tree (leaderrun's
	// watchdogs), read under tracked's lock if lock is set.
	skip   func(pid int) bool
	lock   bool
	pidfds map[int]int // pidfds of the members, kept across looks
}

func (t *procTree) members() []member {
	procs := readProcs()
	kids := map[int][]int{}
	for pid, p := range procs {
		kids[p.ppid] = append(kids[p.ppid], pid)
	}
	if t.lock {
		tracked.Lock()
		defer tracked.Unlock()
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
	var out []member
	var visit func(pid int)
	visit = func(pid int) {
		p, ok := procs[pid]
		if !ok || seen[pid] || (t.skip != nil && t.skip(pid)) {
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
		if p.pgid == t.pgid {
			visit(pid)
		}
	}
	return out
}

// kill sends SIGKILL to the command's group and to every one of ms.
func (t *procTree) kill(ms []member) {
	_ = syscall.Kill(-t.pgid, syscall.SIGKILL)
	for _, m := range ms {
		_ = syscall.Kill(m.pid, syscall.SIGKILL)
	}
}

// fds are pidfds (pidfd_open(2), Linux 5.3) of ms, which work for
// processes that are not this process's children too. Without pidfds,
// look again every 10 ms.
func (t *procTree) fds(ms []member) ([]unix.PollFd, time.Duration) {
	live := map[int]bool{}
	var pfds []unix.PollFd
	limit := time.Duration(-1)
	for _, m := range ms {
		live[m.pid] = true
		fd, ok := t.pidfds[m.pid]
		if !ok {
			var err error
			if fd, err = unix.PidfdOpen(m.pid, 0); err != nil {
				if errors.Is(err, unix.ESRCH) {
					limit = 0 // gone already: look again
				}
				fd = -1
			}
			t.pidfds[m.pid] = fd
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
