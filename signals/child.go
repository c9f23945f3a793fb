package signals

import (
	"errors"
	"log/slog"
	"sync"
	"syscall"
	"time"

	"github.com/leaderrun/leaderrun/signals/stop"
	"github.com/leaderrun/leaderrun/signals/watchdog"
)

// Child is a running command, as leaderrun sees it: the leader of its own
// process group (whose id is its pid), forked by its watchdog, which runs
// its stop sequence (docs/safety.md, S9): the first kill signal, whoever
// asked for it, fixes the SIGKILL instant for the whole tree, KillGrace
// later. Done closes only once every process of the tree is gone.
type Child struct {
	pid           int
	guard, detail string
	log           *slog.Logger
	link          *link

	// exited is closed once the command was reaped (status set); done,
	// once the whole tree is gone.
	exited chan struct{}
	status Status
	done   chan struct{}

	mu       sync.Mutex
	deadline time.Time // the last one sent
	asked    bool      // Stop was called
	// killAt is the sequence's SIGKILL instant once the watchdog said it
	// runs; expired, if its deadline started it; killedAt, when the tree
	// was sent that SIGKILL, by the watchdog or by the backstop.
	killAt, killedAt time.Time
	expired          bool
	back             backstop
}

// newChild is the command the watchdog reported started.
func newChild(spec Spec, l *link, st *watchdog.Started, deadline time.Time) *Child {
	// Tracked at once: should the watchdog die, the command is
	// re-parented to us, and waited for here, not by the orphan reaper.
	track(st.Pid)
	c := &Child{pid: st.Pid, guard: st.Guard, detail: st.Detail, log: spec.Log, link: l,
		exited: make(chan struct{}), done: make(chan struct{}), deadline: deadline}
	c.back = backstop{seq: stop.Sequence{Signal: spec.KillSignal, Grace: spec.KillGrace + backstopDelay, Group: st.Pid},
		in: stop.Input{Members: c.members}, epoch: time.Now(), kill: c.killTree, log: spec.Log.With("pid", st.Pid)}
	c.back.set(deadline, 0)
	go c.follow()
	return c
}

// Pid is the command's pid, which is also its process group id.
func (c *Child) Pid() int { return c.pid }

// Guard says what keeps the command's tree together in this run (see
// docs/safety.md): "cgroup" and its path, "subreaper" and why there is no
// cgroup, or "process group".
func (c *Child) Guard() string { return c.guard + " (" + c.detail + ")" }

// cgroupDir is the command's cgroup's path, "" without one.
func (c *Child) cgroupDir() string {
	if c.guard != watchdog.GuardCgroup {
		return ""
	}
	return c.detail
}

// follow handles the watchdog's reports until its socket closes; one that
// closes before the tree was gone is the watchdog's death (watchdogGone).
func (c *Child) follow() {
	for r := range c.link.reports {
		switch {
		case r.Stopping != nil:
			c.mu.Lock()
			c.killAt, c.expired = watchdog.TimeOf(r.Stopping.KillAt), r.Stopping.Reason == stop.Deadline
			c.mu.Unlock()
		case r.Killed != 0:
			c.killed(watchdog.TimeOf(r.Killed))
			c.back.stop()
		case r.Exited != nil:
			c.exit(Status{Code: r.Exited.Code, Signal: r.Exited.Signal})
		case r.Gone:
			c.exit(Status{Code: 70}) // only if the watchdog said nothing of it
			c.finish()
		}
	}
	select {
	case <-c.done:
	default:
		c.watchdogGone()
	}
}

func (c *Child) exit(st Status) {
	select {
	case <-c.exited:
	default:
		c.status = st
		close(c.exited)
	}
}

// finish closes Done: nothing of the tree runs.
func (c *Child) finish() {
	c.back.stop()
	untrack(c.pid)
	close(c.done)
}

// Done is closed once the command and everything it started are gone (S8).
func (c *Child) Done() <-chan struct{} { return c.done }

// Status is how the command ended; call it after Done.
func (c *Child) Status() Status {
	<-c.done
	return c.status
}

// Wait blocks until Done and the watchdog was reaped, and returns how the
// command ended: call it before returning, so that nothing of this
// package outlives the caller.
func (c *Child) Wait() Status {
	<-c.done
	<-c.link.reaped
	return c.status
}

// Signal sends sig to the command's whole process group, as it is: the
// signals leaderrun forwards (HUP, USR1, ...). To stop the command, use
// Stop.
func (c *Child) Signal(sig syscall.Signal) error {
	select {
	case <-c.done:
		return nil
	default:
	}
	err := watchdog.SignalGroup(c.pid, sig)
	c.log.Info("signalled child", "pid", c.pid, "signal", Name(sig))
	if errors.Is(err, syscall.ESRCH) {
		return nil
	}
	return err
}

// SetDeadline tells the watchdog the newest instant by which the command
// must have had the kill signal (S2); if it passes with no newer one, the
// watchdog starts the stop sequence on its own clock (S10).
func (c *Child) SetDeadline(t time.Time) {
	c.mu.Lock()
	if c.asked || !t.After(c.deadline) {
		c.mu.Unlock()
		return
	}
	c.deadline = t
	c.mu.Unlock()
	c.back.set(t, 0)
	_ = c.link.send(watchdog.Order{Deadline: max(watchdog.InstantOf(t), 1)}, nil, sendTimeout)
}

// Stop starts the stop sequence with sig: the watchdog sends sig to the
// command's group and to every descendant that left it, and SIGKILL to
// the whole tree KillGrace later, unless its sequence began earlier (its
// deadline passed), whose instant stands. A later Stop is a Signal.
func (c *Child) Stop(sig syscall.Signal) {
	select {
	case <-c.done:
		return
	default:
	}
	c.mu.Lock()
	again := c.asked
	c.asked = true
	c.mu.Unlock()
	if again {
		_ = c.Signal(sig)
		return
	}
	c.back.set(time.Time{}, sig)
	_ = c.link.send(watchdog.Order{Stop: sig}, nil, sendTimeout)
	c.link.wake()
}

// Expired reports whether the watchdog's deadline started the sequence.
func (c *Child) Expired() bool {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.expired
}

// KillAt is the sequence's SIGKILL instant, zero until the watchdog said
// it started.
func (c *Child) KillAt() time.Time {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.killAt
}
