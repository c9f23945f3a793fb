//go:build linux

package signals

import (
	"os"
	"os/signal"
	"strconv"
	"strings"
	"sync/atomic"
	"syscall"

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
// subreaper, and returns those still alive.
func reapOrphans() []int {
	if !subreaper.Load() {
		return nil
	}
	var alive []int
	for _, pid := range orphans() {
		var ws unix.WaitStatus
		if wpid, err := unix.Wait4(pid, &ws, unix.WNOHANG, nil); wpid == 0 && err == nil {
			alive = append(alive, pid)
		}
	}
	return alive
}

func socketpair() ([2]int, error) {
	return syscall.Socketpair(syscall.AF_UNIX, syscall.SOCK_STREAM|syscall.SOCK_CLOEXEC, 0)
}

// orphans are this process's children that this package does not wait for
// itself: as a subreaper, the orphans of the command's tree.
func orphans() []int {
	tracked.Lock()
	defer tracked.Unlock()
	var pids []int
	for _, pid := range children() {
		if !tracked.pids[pid] {
			pids = append(pids, pid)
		}
	}
	return pids
}

// children lists this process's children, from every thread's
// /proc/self/task/TID/children: a child is listed under the thread that
// forked it.
func children() []int {
	tasks, _ := os.ReadDir("/proc/self/task")
	var pids []int
	for _, t := range tasks {
		data, _ := os.ReadFile("/proc/self/task/" + t.Name() + "/children")
		for _, field := range strings.Fields(string(data)) {
			if pid, err := strconv.Atoi(field); err == nil {
				pids = append(pids, pid)
			}
		}
	}
	return pids
}
