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
// on leaderrun's clock, with a grace backstopDelay longer; it does the
// SIGKILL alone, and stands down once the watchdog says it sent its own,
// or that the tree is gone.
type backstop struct {
	mu       sync.Mutex
	seq      stop.Sequence
	epoch    time.Time // the zero of its clock
	deadline stop.Instant
	stops    []syscall.Signal
	timer    *time.Timer
	off      bool
	// tree reports whether anything of the tree is left; kill SIGKILLs
	// it.
	tree func() bool
	kill func()
	log  *slog.Logger
}

// at is t on the backstop's clock.
func (b *backstop) at(t time.Time) stop.Instant { return stop.Instant(max(t.Sub(b.epoch), 1)) }

// set feeds the sequence a newer deadline (t) or a stop request (sig),
// either zero if none, and asks it what to do.
func (b *backstop) set(t time.Time, sig syscall.Signal) {
	b.mu.Lock()
	defer b.mu.Unlock()
	if !t.IsZero() {
		b.deadline = b.at(t)
	}
	if sig != 0 {
		b.stops = append(b.stops, sig)
	}
	b.step()
}

// step does what the sequence says now (its first SIGKILL) and sets the
// timer for when to ask again. b.mu is held.
func (b *backstop) step() {
	if b.off {
		return
	}
	acts, wake := b.seq.Next(stop.Input{Now: b.at(time.Now()), Deadline: b.deadline, Stops: b.stops, Members: b.members})
	b.stops = nil
	for _, a := range acts {
		if a.Kind == stop.Kill && a.Reason != 0 {
			b.kill()
			b.log.Warn("the watchdog did not end the command's tree at the end of --kill-grace; leaderrun sent SIGKILL")
		}
	}
	if wake == 0 {
		return
	}
	d := time.Duration(wake - b.at(time.Now()))
	if b.timer == nil {
		b.timer = time.AfterFunc(d, func() {
			b.mu.Lock()
			defer b.mu.Unlock()
			b.step()
		})
		return
	}
	b.timer.Reset(d)
}

// members is the tree as leaderrun sees it: one member while any is left.
func (b *backstop) members() []stop.Member {
	if !b.tree() {
		return nil
	}
	return []stop.Member{{Pid: b.seq.Group, Pgid: b.seq.Group}}
}

// stop stands the backstop down.
func (b *backstop) stop() {
	b.mu.Lock()
	defer b.mu.Unlock()
	b.off = true
	if b.timer != nil {
		b.timer.Stop()
	}
}

// treeLeft reports whether the command's group or cgroup has a process.
func (c *Child) treeLeft() bool {
	if syscall.Kill(-c.pid, 0) == nil {
		return true
	}
	if dir := c.cgroupDir(); dir != "" {
		data, _ := os.ReadFile(dir + "/cgroup.events")
		return bytes.Contains(data, []byte("populated 1"))
	}
	return false
}
