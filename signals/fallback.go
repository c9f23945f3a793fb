package signals

import (
	"errors"
	"syscall"

	"github.com/leaderrun/leaderrun/signals/watchdog"
	"golang.org/x/sys/unix"
)

// watchdogGone runs when the watchdog's socket closed before it said the
// tree was gone: it died (someone killed it). The command died of its
// parent-death signal, the rest of its tree was re-parented to leaderrun,
// a subreaper, or stayed in its cgroup; it all gets SIGKILL now: the stop
// sequence, orphaned (Leftovers.End).
func (c *Child) watchdogGone() {
	c.back.stop()
	c.log.Warn("the command's watchdog died; killing the command's tree", "pid", c.pid)
	pid := c.pid
	left, err := watchdog.Leftovers{
		Cgroup:    c.cgroupDir(),
		Pgid:      pid,
		Subreaper: subreaper.Load(),
		Skip:      func(p int) bool { return tracked.pids[p] && p != pid || ownHelper(p) },
		Lock:      &tracked,
	}.End()
	if len(left) > 0 {
		c.log.Error("processes of the command survived SIGKILL; giving up on them", "pid", c.pid, "pids", left)
	} else if err != nil {
		c.log.Warn("cannot remove the command's cgroup", "error", err)
	}
	select {
	case <-c.exited:
	default:
		c.exit(c.reapHere())
	}
	c.finish()
}

// reapHere waits for the command, re-parented to this process after its
// watchdog died, and returns how it ended; 70 (EX_SOFTWARE) if it is not
// this process's child (not a subreaper) or was reaped by the watchdog.
func (c *Child) reapHere() Status {
	for {
		var ws unix.WaitStatus
		_, err := unix.Wait4(c.pid, &ws, 0, nil)
		if errors.Is(err, unix.EINTR) {
			continue
		}
		if err != nil {
			c.log.Error("cannot learn how the command ended", "pid", c.pid, "error", err)
			return Status{Code: 70}
		}
		return statusOf(syscall.WaitStatus(ws))
	}
}
