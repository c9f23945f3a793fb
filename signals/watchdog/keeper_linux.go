//go:build linux

package watchdog

import (
	"os"
	"slices"
	"strings"
	"syscall"
	"unsafe"

	"golang.org/x/sys/unix"
)

// The keeper (docs/safety.md, S11) ends the command's tree when leaderrun
// and its watchdog die together (`pkill -9 leaderrun`): the command dies
// of its parent-death signal, but nothing else would end what it started.
//
// It is the watchdog forked without exec right after the command, running
// nothing but system calls (keeperMain is nosplit and allocates nothing:
// the copy has no Go runtime threads; every signal is blocked). It waits
// for the watchdog to exit, which SIGKILLs it first when its work is over:
// a keeper that sees it gone knows it died, SIGKILLs the tree (cgroup.kill,
// or the command's process group), waits until it is empty (5 s at most,
// as stop.Survival), removes the cgroup and exits, holding until then a
// copy of the local backend's lock file. Its name (in ps and in
// /proc/PID/cmdline) leaves "leaderrun" out: a kill by that name leaves it
// to do its job.
const keeperName = "lr-keeper"

// keeper is the watchdog's keeper: its pid once started, and what its
// copy of memory holds for it.
type keeper struct {
	pid int
	k   keeperArgs
}

// keeperArgs is all keeperMain reads: numbers and arrays.
type keeperArgs struct {
	dog              int // the watchdog's pidfd
	kill, events, at int // cgroup.kill, cgroup.events and the cgroup's parent directory; -1 without
	pgid             int
	keep             [12]int // descriptors to keep open
	nkeep            int
	name             [64]byte // the cgroup's directory name, NUL-terminated
	comm             [16]byte
	argv             unsafe.Pointer // this process's argument strings, to overwrite
	argvLen          int
}

func (k *keeper) is(pid int) bool { return k.pid != 0 && pid == k.pid }

// start forks the keeper for the command pgid, in cg if not nil, holding
// the descriptors leaderrun handed over, or logs why it cannot.
func (k *keeper) start(cg *cgroupTree, pgid int, held []int, log *logger) {
	a := &k.k
	a.kill, a.events, a.at, a.pgid = -1, -1, -1, pgid
	var err error
	if a.dog, err = unix.PidfdOpen(os.Getpid(), 0); err != nil {
		log.Warn("no keeper for the command's tree: no pidfds (Linux 5.3)", "error", err)
		return
	}
	defer unix.Close(a.dog)
	if cg != nil {
		if i := strings.LastIndexByte(cg.dir, '/'); len(cg.dir)-i < len(a.name) {
			a.kill, a.events, a.at = cg.killFD, cg.events, cg.parentFD
			copy(a.name[:], cg.dir[i+1:])
		}
	}
	for _, fd := range append([]int{a.dog, a.kill, a.events, a.at}, held...) {
		if fd >= 0 && a.nkeep < len(a.keep) {
			a.keep[a.nkeep] = fd
			a.nkeep++
		}
	}
	slices.Sort(a.keep[:a.nkeep])
	copy(a.comm[:], keeperName)
	if cmdline, err := os.ReadFile("/proc/self/cmdline"); err == nil && len(os.Args) > 0 && len(os.Args[0]) > 0 {
		if p := unsafe.StringData(os.Args[0]); string(unsafe.Slice(p, len(cmdline))) == string(cmdline) {
			a.argv, a.argvLen = unsafe.Pointer(p), len(cmdline)
		}
	}
	all, old := ^uint64(0), uint64(0)
	raw(unix.SYS_RT_SIGPROCMASK, unix.SIG_SETMASK, uintptr(unsafe.Pointer(&all)), uintptr(unsafe.Pointer(&old)), 8)
	pid, _, errno := syscall.RawSyscall6(unix.SYS_CLONE, uintptr(syscall.SIGCHLD), 0, 0, 0, 0, 0)
	if pid == 0 && errno == 0 {
		keeperMain(k) // never returns
	}
	raw(unix.SYS_RT_SIGPROCMASK, unix.SIG_SETMASK, uintptr(unsafe.Pointer(&old)), 0, 8)
	if errno != 0 {
		log.Warn("no keeper for the command's tree", "error", errno)
		return
	}
	k.pid = int(pid)
}

// dismiss ends the keeper: the watchdog's work is over. A SIGKILL is
// final once sent, so the watchdog does not wait for it to be done with:
// whoever inherits it reaps it (leaderrun, a subreaper).
func (k *keeper) dismiss() {
	if k.pid != 0 {
		_ = syscall.Kill(k.pid, syscall.SIGKILL)
		k.pid = 0
	}
}

// keeperMain is the keeper: see the top of this file.
//
//go:nosplit
//go:norace
func keeperMain(k *keeper) {
	a := &k.k
	raw(unix.SYS_PRCTL, unix.PR_SET_NAME, uintptr(unsafe.Pointer(&a.comm[0])), 0, 0)
	for i := 0; i < a.argvLen; i++ {
		c := byte(0)
		if i < len(keeperName) {
			c = keeperName[i]
		}
		*(*byte)(unsafe.Add(a.argv, i)) = c
	}
	// Every other descriptor goes (close_range, Linux 5.9, between the
	// kept ones): a copy of leaderrun's socket would hide the watchdog's
	// death from leaderrun.
	for i, lo := 0, 0; i <= a.nkeep; i++ {
		hi := int(^uint32(0))
		if i < a.nkeep {
			hi = a.keep[i] - 1
		}
		if lo <= hi && raw(unix.SYS_CLOSE_RANGE, uintptr(lo), uintptr(hi), 0, 0) != 0 {
			for fd := lo; fd <= min(hi, 1023); fd++ {
				raw(unix.SYS_CLOSE, uintptr(fd), 0, 0, 0)
			}
		}
		if i < a.nkeep {
			lo = a.keep[i] + 1
		}
	}
	for !ready(a.dog, unix.POLLIN, -1) {
	}
	one := [1]byte{'1'}
	for killed := boottime(); !a.empty() && boottime()-killed < 5e9; {
		if a.kill < 0 || raw(unix.SYS_PWRITE64, uintptr(a.kill), uintptr(unsafe.Pointer(&one[0])), 1, 0) != 0 {
			raw(unix.SYS_KILL, uintptr(-a.pgid), uintptr(syscall.SIGKILL), 0, 0)
		}
		// Until the tree may have changed: cgroup.events says when it
		// empties; nothing says when a process group does.
		ready(a.events, unix.POLLPRI, 10)
	}
	for try := 0; a.at >= 0 && try < 50; try++ {
		// A group may take a moment to leave once empty.
		if raw(unix.SYS_UNLINKAT, uintptr(a.at), uintptr(unsafe.Pointer(&a.name[0])), unix.AT_REMOVEDIR, 0) != syscall.EBUSY {
			break
		}
		ready(-1, 0, 1)
	}
	raw(unix.SYS_EXIT_GROUP, 0, 0, 0, 0)
}

// empty reads cgroup.events (a cgroup that is gone is empty), or the
// command's process group.
//
//go:nosplit
//go:norace
func (a *keeperArgs) empty() bool {
	if a.events < 0 {
		return raw(unix.SYS_KILL, uintptr(-a.pgid), 0, 0, 0) == syscall.ESRCH
	}
	var buf [128]byte
	n, _, e := syscall.RawSyscall6(unix.SYS_PREAD64, uintptr(a.events), uintptr(unsafe.Pointer(&buf[0])), uintptr(len(buf)), 0, 0, 0)
	for i := 0; e == 0 && i+10 < int(n) && i+10 < len(buf); i++ {
		// "populated 0" or "populated 1", at the start of a line.
		if (i == 0 || buf[i-1] == '\n') && buf[i] == 'p' && buf[i+8] == 'd' && buf[i+9] == ' ' {
			return buf[i+10] == '0'
		}
	}
	return e != 0
}

// ready polls fd for events for ms milliseconds at most (negative: no
// limit), and reports whether it was ready; fd -1 only waits.
//
//go:nosplit
//go:norace
func ready(fd int, events int16, ms int64) bool {
	pfds := [1]unix.PollFd{{Fd: int32(fd), Events: events}}
	ts := unix.Timespec{Sec: ms / 1000, Nsec: ms % 1000 * 1e6}
	tsp := uintptr(unsafe.Pointer(&ts))
	if ms < 0 {
		tsp = 0
	}
	syscall.RawSyscall6(unix.SYS_PPOLL, uintptr(unsafe.Pointer(&pfds[0])), 1, tsp, 0, 0, 0)
	return fd >= 0 && pfds[0].Revents != 0
}

//go:nosplit
//go:norace
func boottime() int64 {
	var ts unix.Timespec
	raw(unix.SYS_CLOCK_GETTIME, unix.CLOCK_BOOTTIME, uintptr(unsafe.Pointer(&ts)), 0, 0)
	return ts.Sec*1e9 + ts.Nsec
}

//go:nosplit
//go:norace
func raw(trap, a1, a2, a3, a4 uintptr) syscall.Errno {
	_, _, e := syscall.RawSyscall6(trap, a1, a2, a3, a4, 0, 0)
	return e
}
