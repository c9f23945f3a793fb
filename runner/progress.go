package runner

import (
	"errors"
	"fmt"
	"sync"
	"time"

	"github.com/leaderrun/leaderrun/signals"
)

// MinProgressTimeout is the shortest Config.ProgressTimeout the runner
// accepts. A report is a process start (`leaderrun check --progress`) and
// a round trip on the check socket, which on a loaded host can take tens
// of milliseconds; under a second, a scheduling hiccup would stop a
// healthy job.
const MinProgressTimeout = time.Second

// ErrStalled: the command reported no progress for Config.ProgressTimeout
// and was stopped. StalledError carries the detail.
var ErrStalled = errors.New("runner: no progress reported")

// StalledError says how long the command had gone without a progress
// report when it was stopped; it unwraps to ErrStalled.
type StalledError struct {
	// Timeout is Config.ProgressTimeout.
	Timeout time.Duration
	// Since is the time from the last report (or the command's start, if
	// it never reported) to the stop.
	Since time.Duration
	// Reported says whether the command reported progress at all.
	Reported bool
}

func (e *StalledError) Error() string {
	last := "none since the command started"
	if e.Reported {
		last = "last report"
	}
	return fmt.Sprintf("no progress reported for --progress-timeout %v (%s %v ago)", e.Timeout, last,
		e.Since.Round(time.Millisecond))
}

func (e *StalledError) Unwrap() error { return ErrStalled }

// Progress carries the command's progress reports to the runner. The check
// socket's server calls Report from its own goroutine; the leadership's
// loop takes the newest report. Report never blocks, and a newer report is
// never lost behind an older one (the time is kept, the channel only
// wakes the loop).
type Progress struct {
	mu   sync.Mutex
	last time.Time
	poke chan struct{}
}

// NewProgress returns a Progress with no report yet.
func NewProgress() *Progress { return &Progress{poke: make(chan struct{}, 1)} }

// Report records a progress report received at at (time.Now(), with its
// monotonic reading).
func (p *Progress) Report(at time.Time) {
	p.mu.Lock()
	if at.After(p.last) {
		p.last = at
	}
	p.mu.Unlock()
	select {
	case p.poke <- struct{}{}:
	default: // the loop is woken already, and will read the newest time
	}
}

// woken is the channel that a report wakes; nil (never ready) for a nil p.
func (p *Progress) woken() <-chan struct{} {
	if p == nil {
		return nil
	}
	return p.poke
}

// Latest is the time of the newest report; zero if none.
func (p *Progress) Latest() time.Time {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.last
}

// The progress clock of a leadership (Config.ProgressTimeout): it starts
// when the child starts; each report moves it; when it runs out while the
// child runs, the child is stopped with the one stop sequence of a loss,
// the lease is released once the tree is gone, and Run returns
// *StalledError. Reports while stopping or holding change nothing.

// watchProgress starts the progress clock at the child's start, if
// --progress-timeout is set.
func (l *leadership) watchProgress() {
	if l.cfg.ProgressTimeout <= 0 {
		return
	}
	l.lastProgress = l.started
	l.progressDue = l.started.Add(l.cfg.ProgressTimeout)
	l.observe(Event{Kind: ProgressReported, Deadline: l.progressDue})
}

// progressed handles a progress report received at at.
func (l *leadership) progressed(now, at time.Time) {
	if l.phase != leading || l.progressDue.IsZero() || !at.After(l.lastProgress) {
		return
	}
	l.reported = true
	l.lastProgress = at
	l.progressDue = at.Add(l.cfg.ProgressTimeout)
	l.log.Debug("progress reported", "progress_due_in", l.progressDue.Sub(now).Round(time.Millisecond))
	l.observe(Event{Kind: ProgressReported, Deadline: l.progressDue})
}

// progressOverdue handles the progress timer, which may fire late (a
// pause) or early (a report moved the clock since it was set).
func (l *leadership) progressOverdue(now time.Time) {
	if l.phase != leading || l.progressDue.IsZero() || now.Before(l.progressDue) {
		return
	}
	l.stalled = &StalledError{Timeout: l.cfg.ProgressTimeout, Since: now.Sub(l.lastProgress), Reported: l.reported}
	// Signal first, log after, as for a loss.
	l.child.Stop(l.cfg.Child.KillSignal)
	l.phase = stopping
	l.log.Error("no progress reported; stopping child", "progress_timeout", l.cfg.ProgressTimeout,
		"since_last_report", l.stalled.Since.Round(time.Millisecond), "reported", l.reported,
		"signal", signals.Name(l.cfg.Child.KillSignal))
	l.observe(Event{Kind: Stalled, Err: l.stalled})
}

// progressTimer is the leadership loop's progress timer: armed while the
// child runs with a progress clock, stopped otherwise.
type progressTimer struct {
	t *time.Timer
	c <-chan time.Time
}

// set arms the timer for l's progress clock, or stops it.
func (pt *progressTimer) set(l *leadership) {
	if l.phase != leading || l.progressDue.IsZero() {
		if pt.t != nil {
			pt.t.Stop()
		}
		pt.c = nil
		return
	}
	if pt.t == nil {
		pt.t = time.NewTimer(time.Until(l.progressDue))
	} else {
		pt.t.Reset(time.Until(l.progressDue))
	}
	pt.c = pt.t.C
}

func (pt *progressTimer) stop() {
	if pt.t != nil {
		pt.t.Stop()
	}
}
