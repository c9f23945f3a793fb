package signals

import (
	"os"
	"syscall"
	"time"

	"github.com/leaderrun/leaderrun/signals/watchdog"
)

// The stop sequence as leaderrun sees it (docs/safety.md, S9, S10): it
// hands the watchdog deadlines and stop requests, learns from it when the
// sequence started and when SIGKILL went out, and keeps a SIGKILL of its
// own for a watchdog that is frozen when the sequence is due.

// SetDeadline tells the watchdog the newest Instant by which the command
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
	_ = c.s.send(watchdog.NewFrame(watchdog.MsgDeadline).I64(int64(max(watchdog.InstantOf(t), 1))), nil, sendTimeout)
}

// Stop starts the stop sequence with sig: the watchdog sends sig to the
// command's group and to every descendant that left it, and SIGKILL to the
// whole tree KillGrace after that, unless its sequence began earlier (its
// deadline passed first), whose SIGKILL Instant then stands. A later Stop
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
	_ = c.s.send(watchdog.NewFrame(watchdog.MsgStop).U32(uint32(sig)), nil, sendTimeout)
	// A stopped watchdog would sit on it.
	_ = c.s.dog.Signal(syscall.SIGCONT)
}

// stopping is the watchdog's word that the sequence runs: it sent sig,
// and SIGKILLs the tree at killAt.
func (c *Child) stopping(sig syscall.Signal, killAt watchdog.Instant, why watchdog.StopReason) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.killAt.IsZero() {
		c.killAt = killAt.Time()
		c.armBackstop(c.killAt)
	}
	if why == watchdog.StopDeadline {
		c.expired = true
	}
}

// backstopDelay is how long after the SIGKILL Instant leaderrun kills the
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

// Expired reports whether the watchdog started the stop sequence because
// the deadline passed with no newer one from leaderrun.
func (c *Child) Expired() bool {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.expired
}

// KillAt is the SIGKILL Instant of the stop sequence, zero until the
// watchdog has said that it started it (a moment after Stop).
func (c *Child) KillAt() time.Time {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.killAt
}
