package signals

import (
	"bytes"
	"log/slog"
	"os"
	"sync"
	"syscall"
	"time"

	"github.com/leaderrun/leaderrun/signals/stop"
)

// backstopDelay is how long after the watchdog's SIGKILL instant leaderrun
// kills the tree itself, unless the watchdog said it did: only a watchdog
// that is frozen when its sequence is due leaves it anything to do.
const backstopDelay = 100 * time.Millisecond

// backstop is leaderrun's own SIGKILL of the command's tree, for a
// watchdog frozen when its stop sequence is due (docs/safety.md, S9): the
// decision function (package stop) fed what leaderrun sent the watchdog,
// on leaderrun's clock, with a grace backstopDelay longer. It does the
// SIGKILL alone, and stands down once the watchdog says it sent its own,
// or that the tree is gone.
type backstop struct {
	mu    sync.Mutex
	seq   stop.Sequence
	in    stop.Input // the deadline and stop requests sent, the tree as leaderrun sees it
	epoch time.Time  // the zero of its clock
	timer *time.Timer
	off   bool
	kill  func()
	log   *slog.Logger
}

// at is t on the backstop's clock.
func (b *backstop) at(t time.Time) stop.Instant { return stop.Instant(max(t.Sub(b.epoch), 1)) }

// set feeds the sequence a newer deadline (t) or a stop request (sig),
// either zero if none, and does what it says.
func (b *backstop) set(t time.Time, sig syscall.Signal) {
	b.mu.Lock()
	defer b.mu.Unlock()
	if !t.IsZero() {
		b.in.Deadline = b.at(t)
	}
	if sig != 0 {
		b.in.Stops = append(b.in.Stops, sig)
	}
	b.step()
}

// step does what the sequence says now (only its first SIGKILL), and sets
// the timer for when to ask again. b.mu is held.
func (b *backstop) step() {
	if b.off {
		return
	}
	b.in.Now = b.at(time.Now())
	acts, wake := b.seq.Next(b.in)
	b.in.Stops = nil
	for _, a := range acts {
		if a.Kind == stop.Kill && a.Reason != 0 {
			b.kill()
			b.log.Warn("the watchdog did not end the command's tree at the end of --kill-grace; leaderrun sent SIGKILL")
		}
	}
	switch d := time.Duration(wake - b.in.Now); {
	case wake == 0:
	case b.timer == nil:
		b.timer = time.AfterFunc(d, func() {
			b.mu.Lock()
			defer b.mu.Unlock()
			b.step()
		})
	default:
		b.timer.Reset(d)
	}
}

func (b *backstop) stop() {
	b.mu.Lock()
	defer b.mu.Unlock()
	b.off = true
	if b.timer != nil {
		b.timer.Stop()
	}
}

// members is the tree as leaderrun sees it, for the backstop: the group,
// while it or the cgroup has a process.
func (c *Child) members() []stop.Member {
	left := syscall.Kill(-c.pid, 0) == nil
	if dir := c.cgroupDir(); !left && dir != "" {
		data, _ := os.ReadFile(dir + "/cgroup.events")
		left = bytes.Contains(data, []byte("populated 1"))
	}
	if !left {
		return nil
	}
	return []stop.Member{{Pid: c.pid, Pgid: c.pid}}
}

// killed records when the tree was first sent the sequence's SIGKILL.
func (c *Child) killed(at time.Time) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.killedAt.IsZero() || at.Before(c.killedAt) {
		c.killedAt = at
	}
}

// killTree is leaderrun's own SIGKILL of the tree (the backstop's).
func (c *Child) killTree() {
	c.killed(time.Now())
	_ = syscall.Kill(-c.pid, syscall.SIGKILL)
	if dir := c.cgroupDir(); dir != "" {
		_ = os.WriteFile(dir+"/cgroup.kill", []byte("1"), 0)
	}
}
