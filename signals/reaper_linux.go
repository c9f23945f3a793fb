//go:build linux

package signals

import (
	"os"
	"os/signal"
	"strconv"
	"strings"
	"sync/atomic"
	"syscall"

	"github.com/leaderrun/leaderrun/signals/watchdog"
	"golang.org/x/sys/unix"
)

// ownHelper reports whether pid, a child of this process, is in this
// process's own process group: one it started for its own needs (the exec
// credential plugin client-go runs and waits for), not to be reaped from
// under it nor stopped with the command. An orphan of the command's tree
// is never in leaderrun's group unless it moved there on purpose
// (setpgid, in the same session), which this rule does not cover.
func ownHelper(pid int) bool {
	pgid, ok := watchdog.ProcessGroup(pid)
	return ok && pgid == syscall.Getpgrp()
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
		// Once now: a child that exited before (the watchdog that this
		// process launched before it became this program: see
		// DismissEarly) sent its SIGCHLD to nobody.
		reapOrphans()
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
