package signals

import (
	"errors"
	"log/slog"
	"os"
	"sync"
	"syscall"
	"time"

	"golang.org/x/sys/unix"
)

// Child is a running command, as leaderrun sees it: the leader of its own
// process group (whose id is its pid), forked by its watchdog.
//
// Stopping it is one sequence on one clock (docs/safety.md, S9), and it
// runs in the watchdog: the first kill signal, whether leaderrun asked for
// it (Stop), the deadline passed in the watchdog (SetDeadline), or the
// command exited and left processes behind, is sent there and fixes the
// SIGKILL instant for the whole tree, KillGrace later; a later request
// changes neither. Done closes only once every process of the tree is
// gone.
type Child struct {
	s   *Supervisor
	pid int
	log *slog.Logger

	// exited is closed once the command has been reaped; status is then
	// set.
	exited chan struct{}
	status Status

	mu sync.Mutex
	// killAt is the SIGKILL instant of the stop sequence, zero until the
	// watchdog says it started; asked is set once leaderrun asked for it;
	// expired, if the watchdog started it because the deadline passed.
	killAt         time.Time
	asked, expired bool
	deadline       time.Time // the last deadline sent
	backstop       *time.Timer
	sigkilled      bool // the watchdog sent SIGKILL to the tree
	isDone         bool

	// done is closed once the tree is gone and the watchdog was told to
	// stand down; the watchdog is reaped once Wait returns.
	done chan struct{}
}

// Pid is the command's pid, which is also its process group id.
func (c *Child) Pid() int { return c.pid }

// Guard says what keeps the command's tree together in this run (see
// docs/safety.md): "cgroup" and its path, "subreaper" and why there is no
// cgroup, or "process group".
func (c *Child) Guard() string {
	c.s.mu.Lock()
	defer c.s.mu.Unlock()
	return c.s.guard + " (" + c.s.detail + ")"
}

// SetDeadline tells the watchdog the newest instant by which the command
// must have had the kill signal (S2): if it passes with no newer one, the
// watchdog starts the stop sequence itself, on its own clock, whatever
// leaderrun is doing (S10).
func (c *Child) SetDeadline(t time.Time) {
	c.mu.Lock()
	if c.isDone || c.asked || !t.After(c.deadline) {
		c.mu.Unlock()
		return
	}
	c.deadline = t
	c.mu.Unlock()
	_ = c.s.send(newFrame(msgDeadline).i64(int64(max(instantOf(t), 1))), nil, sendTimeout)
}

// Stop starts the stop sequence with sig: the watchdog sends sig to the
// command's group and to every descendant that left it, and SIGKILL to the
// whole tree KillGrace after that, unless its sequence began earlier (its
// deadline passed first), whose SIGKILL instant then stands. A later Stop
// sends its signal to the group as Signal does, and changes no deadline.
// Done closes once the tree is gone.
func (c *Child) Stop(sig syscall.Signal) {
	c.mu.Lock()
	if c.asked || c.isDone {
		c.mu.Unlock()
		_ = c.Signal(sig)
		return
	}
	c.asked = true
	if c.killAt.IsZero() {
		// Until the watchdog says when: the latest it can be.
		c.armBackstop(time.Now().Add(c.s.spec.KillGrace))
	}
	c.mu.Unlock()
	_ = c.s.send(newFrame(msgStop).u32(uint32(sig)), nil, sendTimeout)
	// A stopped watchdog would sit on it.
	_ = c.s.dog.Process.Signal(syscall.SIGCONT)
}

// stopping is the watchdog's word that the sequence runs: it sent sig,
// and SIGKILLs the tree at killAt.
func (c *Child) stopping(sig syscall.Signal, killAt instant, why stopReason) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.killAt.IsZero() {
		c.killAt = killAt.time()
		c.armBackstop(c.killAt)
	}
	if why == stopDeadline {
		c.expired = true
	}
}

// backstopDelay is how long after the SIGKILL instant leaderrun kills the
// tree itself if the watchdog has not said it did: only a watchdog that is
// frozen when its sequence is due leaves it anything to do.
const backstopDelay = 100 * time.Millisecond

// armBackstop sets leaderrun's own SIGKILL for the group (and the cgroup)
// backstopDelay after killAt, for a watchdog that is frozen when its
// sequence is due. c.mu is held.
func (c *Child) armBackstop(killAt time.Time) {
	d := time.Until(killAt.Add(backstopDelay))
	if c.backstop != nil {
		c.backstop.Reset(d)
		return
	}
	c.backstop = time.AfterFunc(d, func() {
		c.mu.Lock()
		defer c.mu.Unlock()
		if c.isDone || c.sigkilled {
			return
		}
		dir := c.cgroupDir()
		_ = syscall.Kill(-c.pid, syscall.SIGKILL)
		if dir != "" {
			_ = os.WriteFile(dir+"/cgroup.kill", []byte("1"), 0)
		}
		c.log.Warn("the watchdog did not end the command's tree at the end of --kill-grace; leaderrun sent SIGKILL", "pid", c.pid)
	})
}

// killed is the watchdog's word that it sent SIGKILL to the tree.
func (c *Child) killed() {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.sigkilled = true
	if c.backstop != nil {
		c.backstop.Stop()
	}
}

// cgroupDir is the command's cgroup's path, "" without one.
func (c *Child) cgroupDir() string {
	c.s.mu.Lock()
	defer c.s.mu.Unlock()
	if c.s.guard != guardCgroup {
		return ""
	}
	return c.s.detail
}

// Expired reports whether the watchdog started the stop sequence because
// the deadline passed with no newer one from leaderrun.
func (c *Child) Expired() bool {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.expired
}

// KillAt is the SIGKILL instant of the stop sequence, zero until the
// watchdog has said that it started it (a moment after Stop).
func (c *Child) KillAt() time.Time {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.killAt
}

// exit records how the command ended.
func (c *Child) exit(st Status) {
	select {
	case <-c.exited:
	default:
		c.status = st
		close(c.exited)
	}
}

// gone is the watchdog's word that the whole tree is gone: it is told to
// stand down, and Done closes.
func (c *Child) gone() {
	c.mu.Lock()
	if c.isDone {
		c.mu.Unlock()
		return
	}
	c.isDone = true
	if c.backstop != nil {
		c.backstop.Stop()
	}
	c.mu.Unlock()
	c.exit(Status{Code: 70}) // only if the watchdog said nothing of it
	c.s.standDown()
	untrack(c.pid)
	close(c.done)
}

// watchdogGone runs when the watchdog's socket closed. Before the tree was
// gone that means it died (someone killed it): the command died of its
// parent-death signal, and the rest of its tree was re-parented to
// leaderrun, a subreaper, or stayed in its cgroup. Nothing would stop it
// if leaderrun died too, so it all gets SIGKILL now.
func (c *Child) watchdogGone() {
	c.mu.Lock()
	finished := c.isDone || c.pid == 0
	c.mu.Unlock()
	if finished {
		return
	}
	c.log.Warn("the command's watchdog died; killing the command's tree", "pid", c.pid)
	t := fallbackTree(c.cgroupDir(), c.pid)
	if left := sweep(t, survivalBound); len(left) > 0 {
		c.log.Error("processes of the command survived SIGKILL; giving up on them", "pid", c.pid, "pids", pidsOf(left))
	} else if cg, ok := t.(interface{ remove(*slog.Logger) }); ok {
		cg.remove(c.log) // the cgroup the watchdog could not remove
	}
	select {
	case <-c.exited:
	default:
		c.exit(c.reapHere())
	}
	c.mu.Lock()
	c.isDone = true
	if c.backstop != nil {
		c.backstop.Stop()
	}
	c.mu.Unlock()
	untrack(c.pid)
	close(c.done)
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

// Done is closed once the command and everything it started are gone (S8)
// and the watchdog has been told to stand down; the watchdog may still be
// exiting (see Wait).
func (c *Child) Done() <-chan struct{} { return c.done }

// Status is how the command ended; call it after Done.
func (c *Child) Status() Status {
	<-c.done
	return c.status
}

// Wait blocks until Done and the watchdog has exited and been reaped, and
// returns how the command ended. Call it before returning, so that no
// process or goroutine of this package outlives the caller.
func (c *Child) Wait() Status {
	<-c.done
	<-c.s.reaped
	return c.status
}

// Signal sends sig to the command's whole process group, as it is: the
// signals leaderrun forwards (HUP, USR1, ...). To stop the command, use Stop.
func (c *Child) Signal(sig syscall.Signal) error {
	select {
	case <-c.done:
		return nil
	default:
	}
	err := syscall.Kill(-c.pid, sig)
	if sig != syscall.SIGKILL && sig != syscall.SIGCONT && err == nil {
		// A stopped group (SIGSTOP, or SIGTTIN from reading a terminal it
		// does not own) would sit on the signal until SIGKILL: wake it,
		// as systemd does.
		_ = syscall.Kill(-c.pid, syscall.SIGCONT)
	}
	c.log.Info("signalled child", "pid", c.pid, "signal", Name(sig))
	if errors.Is(err, syscall.ESRCH) {
		return nil
	}
	return err
}
