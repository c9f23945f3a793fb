package runner

import (
	"errors"
	"fmt"
	"log/slog"
	"syscall"
	"time"

	"github.com/leaderrun/leaderrun/backends"
	"github.com/leaderrun/leaderrun/signals"
)

// child is what the leadership loop needs of the running command;
// *signals.Child is the real one. Stop starts the one stop sequence (kill
// signal now, SIGKILL to the whole tree by --kill-grace later; a later Stop
// only forwards its signal); SetDeadline hands the watchdog the newest
// renew deadline, which it holds on its own clock should leaderrun be
// frozen or dead (S10), and Expired says whether it had to; Done closes
// once the command and everything it started are gone; Status is then how
// the command ended.
type child interface {
	Pid() int
	Stop(sig syscall.Signal)
	Signal(sig syscall.Signal) error
	SetDeadline(t time.Time)
	Expired() bool
	Done() <-chan struct{}
	Status() signals.Status
}

// phase is where a leadership stands.
type phase int

const (
	// leading: the child runs and the lease is renewed.
	leading phase = iota
	// stopping: the child was told to stop (lost lease, signal, cancel);
	// renewals go on while its tree dies, the lease is kept until it is gone.
	stopping
	// holding: the child exited by itself, and the lock is kept until
	// --min-hold has passed since it started.
	holding
	// done: the child is gone and nothing holds the lock any more; the
	// loop releases the lease.
	done
)

func (p phase) String() string {
	return [...]string{"leading", "stopping", "holding", "done"}[p]
}

// leadership is the state of one held lease while its child runs: the
// phases above, one method per event. The methods take the time of the
// event and do no I/O but the child's signals and the log, so that tests
// can drive them with made-up times and a fake child (see lead_test.go);
// lead runs them from real events.
type leadership struct {
	cfg   *Config
	log   *slog.Logger
	token uint64
	child child

	phase phase
	// lastAck is the send time of the last renewal the store acknowledged
	// (or of the grant's proof of life); deadline = lastAck + RenewDeadline.
	lastAck  time.Time
	deadline time.Time
	started  time.Time
	// holdUntil is when --min-hold ends (phase holding).
	holdUntil time.Time
	// lateStop is when the deliberately unsafe build stops the child.
	lateStop time.Time

	exited bool
	status signals.Status
	// lost says why leadership was lost while the child ran; nil if not.
	lost error
	// stopSignal is the signal leaderrun was asked to stop with, if any.
	stopSignal syscall.Signal
	// holdLost says why the hold ended early (the lease was lost after the
	// child had exited): not a loss for the caller.
	holdLost error

	// The progress clock (progress.go): the time of the last report (or
	// the child's start), when the clock runs out (zero: not watched),
	// whether the child reported at all, and why it was stopped if it ran
	// out.
	lastProgress time.Time
	progressDue  time.Time
	reported     bool
	stalled      *StalledError
}

func newLeadership(cfg *Config, log *slog.Logger, token uint64, c child, lastAck, started time.Time) *leadership {
	l := &leadership{
		cfg:      cfg,
		log:      log,
		token:    token,
		child:    c,
		lastAck:  lastAck,
		deadline: lastAck.Add(cfg.Timings.RenewDeadline),
		started:  started,
	}
	l.watchProgress()
	return l
}

func (l *leadership) observe(e Event) {
	e.Token = l.token
	l.cfg.Observer.Observe(e)
}

// renewed handles the outcome of one renewal, sent at rn.sent (S2: the
// deadline counts from the send time of the last acknowledged renewal).
func (l *leadership) renewed(now time.Time, rn renewal) {
	if l.phase == done || l.lost != nil {
		return
	}
	switch {
	case rn.err == nil && rn.sent.After(l.deadline):
		// Sent after the deadline had passed (the process was paused):
		// the store may have let the lease go meanwhile.
		l.lose(now, fmt.Errorf("renew deadline passed (%v late) before the next renewal was sent", rn.sent.Sub(l.deadline)))
	case rn.err == nil && !now.Before(l.deadline):
		// Sent in time, but its answer comes after the deadline passed
		// (a pause, or the deadline timer not yet served): a deadline
		// that passed is final. A follower may already have judged the
		// lease dead from the silence (docs/safety.md, Consul).
		l.lose(now, fmt.Errorf("renew deadline passed (%v ago) before the renewal sent %v earlier was acknowledged",
			now.Sub(l.deadline).Round(time.Millisecond), now.Sub(rn.sent).Round(time.Millisecond)))
	case rn.err == nil:
		if rn.sent.After(l.lastAck) {
			l.lastAck = rn.sent
			l.deadline = l.lastAck.Add(l.cfg.Timings.RenewDeadline)
			if !unsafeLateKill {
				l.child.SetDeadline(l.deadline)
			}
		}
		l.log.Debug("lease renewed", "latency", rn.latency)
		l.observe(Event{Kind: Renewed, Latency: rn.latency, Deadline: l.deadline})
	case errors.Is(rn.err, backends.ErrLeaseLost):
		l.lose(now, rn.err)
	default:
		l.log.Warn("lease renewal failed", "error", rn.err, "deadline_in", l.deadline.Sub(now).Round(time.Millisecond))
		l.observe(Event{Kind: RenewFailed, Err: rn.err, Deadline: l.deadline})
	}
}

// deadlinePassed handles the deadline timer, which may fire late (a pause,
// S7) or early (the deadline moved since it was set).
func (l *leadership) deadlinePassed(now time.Time) {
	if l.phase == done || l.lost != nil || now.Before(l.deadline) {
		return
	}
	l.lose(now, fmt.Errorf("no renewal acknowledged for --renew-deadline %v (last sent %v ago)",
		l.cfg.Timings.RenewDeadline, now.Sub(l.lastAck).Round(time.Millisecond)))
}

// leaseLost handles the store reporting the lease gone (S3).
func (l *leadership) leaseLost(now time.Time, err error) {
	if err == nil {
		err = backends.ErrLeaseLost
	}
	l.lose(now, err)
}

// lose is the loss of leadership, from whichever event told of it.
func (l *leadership) lose(now time.Time, reason error) {
	switch {
	case l.phase == done || l.lost != nil || l.holdLost != nil:
		return
	case l.phase == holding:
		// The child had finished on its own: this is not a loss for the
		// caller; the hold simply ends.
		l.log.Warn("leadership lost while holding after the child exited", "reason", reason)
		l.holdLost = reason
		l.phase = done
		return
	}
	l.lost = reason
	if unsafeLateKill {
		// The deliberately broken build of unsafe_on.go: let the child
		// run on well past the lease.
		l.lateStop = now.Add(l.cfg.Timings.LeaseDuration + l.cfg.Child.KillGrace)
	} else if l.phase == leading {
		// Signal first, log after: a slow stderr must not delay S2/S3.
		l.child.Stop(l.cfg.Child.KillSignal)
	}
	if l.phase == leading {
		l.phase = stopping
	}
	l.log.Error("leadership lost; stopping child", "reason", reason, "signal", signals.Name(l.cfg.Child.KillSignal))
	l.observe(Event{Kind: Lost, Err: reason})
}

// lateStopDue is the unsafe build's late kill.
func (l *leadership) lateStopDue(now time.Time) {
	if !l.lateStop.IsZero() && !now.Before(l.lateStop) && !l.exited {
		l.lateStop = time.Time{}
		l.child.Stop(l.cfg.Child.KillSignal)
	}
}

// childExited handles the command's tree being gone, with the command's
// status. After a stop, or with no --min-hold left, leadership is done;
// otherwise the lock is held until --min-hold has passed since the start.
func (l *leadership) childExited(now time.Time, status signals.Status) {
	if l.child.Expired() {
		// The watchdog stopped the child at the deadline, before this
		// process noticed (it was frozen or starved): the same loss.
		l.lose(now, fmt.Errorf("no renewal acknowledged for --renew-deadline %v; the watchdog stopped the child (last renewal sent %v ago)",
			l.cfg.Timings.RenewDeadline, now.Sub(l.lastAck).Round(time.Millisecond)))
	}
	l.exited, l.status = true, status
	l.log.Info("child exited", "status", status.String(), "exit_code", status.ExitCode(), "ran", now.Sub(l.started).Round(time.Millisecond))
	l.observe(Event{Kind: ChildExited, Pid: l.child.Pid(), Status: status})
	hold := l.started.Add(l.cfg.MinHold)
	if l.phase == leading && l.cfg.MinHold > 0 && now.Before(hold) {
		l.log.Info("holding leadership for --min-hold", "hold", hold.Sub(now).Round(time.Millisecond))
		l.holdUntil = hold
		l.phase = holding
		return
	}
	l.phase = done
}

// holdOver handles the end of --min-hold.
func (l *leadership) holdOver(now time.Time) {
	if l.phase == holding && !now.Before(l.holdUntil) {
		l.phase = done
	}
}

// signalled handles a signal leaderrun received (S6): SIGTERM and SIGINT
// stop the child (or end a hold), the others are forwarded as they are.
func (l *leadership) signalled(now time.Time, sig syscall.Signal) {
	stop := sig == syscall.SIGTERM || sig == syscall.SIGINT
	switch l.phase {
	case leading:
		if stop {
			l.stopSignal = sig
			l.child.Stop(sig)
			l.phase = stopping
			l.log.Info("stopping child on signal", "signal", signals.Name(sig))
			l.observe(Event{Kind: Stopping})
			return
		}
		_ = l.child.Signal(sig)
		l.log.Info("forwarded signal to child", "signal", signals.Name(sig))
	case stopping:
		// Forwarded; the stop sequence's deadline stays where it is.
		_ = l.child.Signal(sig)
		l.log.Info("forwarded signal to child", "signal", signals.Name(sig))
	case holding:
		if stop {
			l.phase = done
		}
	}
}

// cancelled handles the caller's context ending: as SIGTERM.
func (l *leadership) cancelled(now time.Time) {
	switch l.phase {
	case leading:
		l.child.Stop(l.cfg.Child.KillSignal)
		l.phase = stopping
		l.observe(Event{Kind: Stopping})
	case holding:
		l.phase = done
	}
}

// result is how the leadership ended, for Run: the child's status, and a
// *LostError if the lease was lost while it ran, else a *StalledError if
// it was stopped for want of progress (a loss while stopping a stalled
// child is reported as the loss it is).
func (l *leadership) result() (signals.Status, error) {
	switch {
	case l.lost != nil:
		return l.status, &LostError{Reason: l.lost}
	case l.stalled != nil:
		return l.status, l.stalled
	}
	return l.status, nil
}

// term is the record of this leadership for the lock's history.
func (l *leadership) term(identity string, acquired, ended time.Time, onceKey string) *backends.Term {
	t := &backends.Term{
		Identity: identity,
		Token:    l.token,
		Acquired: acquired,
		Started:  l.started,
		Ended:    ended,
		ExitCode: l.status.ExitCode(),
		OnceKey:  onceKey,
	}
	switch {
	case l.lost != nil:
		t.End, t.Reason = backends.EndLost, l.lost.Error()
	case l.stalled != nil:
		t.End, t.Reason = backends.EndStalled, l.stalled.Error()
	case l.stopSignal != 0:
		t.End, t.Signal = backends.EndStopped, signals.Name(l.stopSignal)
	case l.status.Signal != 0:
		t.End, t.Signal = backends.EndSignaled, signals.Name(l.status.Signal)
	default:
		t.End = backends.EndExited
	}
	return t
}
