package runner

import (
	"context"
	"errors"
	"io"
	"log/slog"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/leaderrun/leaderrun/backends"
	"github.com/leaderrun/leaderrun/signals"
)

// The progress clock (--progress-timeout) with made-up times and the fake
// child of lead_test.go.

func withProgress(d time.Duration) func(*Config) {
	return func(c *Config) { c.ProgressTimeout, c.Progress = d, NewProgress() }
}

// TestProgressClockFromStart: with no report at all, the child gets the
// kill signal exactly --progress-timeout after it started, once; the run
// ends as stalled (not lost), and the term says so.
func TestProgressClockFromStart(t *testing.T) {
	l, c, ev := fixture(t, withProgress(5*time.Second))
	if !ev.has(ProgressReported) {
		t.Fatal("the progress clock's start was not observed")
	}
	l.progressOverdue(after(5*time.Second - time.Nanosecond))
	wantStops(t, c)
	l.progressOverdue(after(5 * time.Second))
	wantStops(t, c, syscall.SIGTERM)
	l.progressOverdue(after(6 * time.Second))
	wantStops(t, c, syscall.SIGTERM)
	if l.phase != stopping || !ev.has(Stalled) || ev.has(Lost) {
		t.Fatalf("phase %v, Stalled observed %v, Lost observed %v; want stopping, stalled, not lost", l.phase, ev.has(Stalled), ev.has(Lost))
	}
	l.childExited(after(7*time.Second), signals.Status{Signal: syscall.SIGTERM})
	_, err := l.result()
	var st *StalledError
	if !errors.As(err, &st) || !errors.Is(err, ErrStalled) || errors.Is(err, ErrLeadershipLost) {
		t.Fatalf("result %v, want a *StalledError", err)
	}
	if st.Since != 5*time.Second || st.Reported {
		t.Errorf("stalled %+v, want 5s since the start, never reported", st)
	}
	if want := "no progress reported for --progress-timeout 5s (none since the command started 5s ago)"; err.Error() != want {
		t.Errorf("error %q, want %q", err, want)
	}
	term := l.term("me", t0, after(7*time.Second), "")
	if term.End != backends.EndStalled || term.ExitCode != 143 || !strings.Contains(term.Reason, "--progress-timeout 5s") {
		t.Errorf("term %+v, want stalled with exit 143 and the reason", term)
	}
}

// TestProgressReportsMoveClock: each report moves the clock to its own time
// plus the timeout; an older report (out of order) never moves it back;
// the stop comes exactly the timeout after the newest report.
func TestProgressReportsMoveClock(t *testing.T) {
	l, c, _ := fixture(t, withProgress(5*time.Second))
	l.progressed(after(3*time.Second), after(3*time.Second))
	l.progressed(after(3*time.Second), after(2*time.Second))
	if want := after(8 * time.Second); !l.progressDue.Equal(want) {
		t.Fatalf("progress due %v, want %v", l.progressDue.Sub(t0), want.Sub(t0))
	}
	// The timer set for the start's clock fires: too early now.
	l.progressOverdue(after(5 * time.Second))
	l.progressOverdue(after(8*time.Second - time.Nanosecond))
	wantStops(t, c)
	l.progressOverdue(after(8 * time.Second))
	wantStops(t, c, syscall.SIGTERM)
	if l.stalled == nil || l.stalled.Since != 5*time.Second || !l.stalled.Reported {
		t.Fatalf("stalled %+v, want 5s since the last report", l.stalled)
	}
	if !strings.Contains(l.stalled.Error(), "(last report 5s ago)") {
		t.Errorf("error %q does not say how long since the last report", l.stalled)
	}
}

// TestProgressAfterStopChangesNothing: once the stop sequence began (for
// want of progress, a loss or a signal), a report neither stops it nor
// moves anything; once the child exited (a --min-hold), the clock is off.
func TestProgressAfterStopChangesNothing(t *testing.T) {
	t.Run("after the stall", func(t *testing.T) {
		l, c, _ := fixture(t, withProgress(5*time.Second))
		l.progressOverdue(after(5 * time.Second))
		l.progressed(after(5100*time.Millisecond), after(5100*time.Millisecond))
		l.progressOverdue(after(20 * time.Second))
		wantStops(t, c, syscall.SIGTERM)
		if l.phase != stopping || l.stalled.Since != 5*time.Second {
			t.Fatalf("phase %v, stalled %+v after a late report", l.phase, l.stalled)
		}
	})
	t.Run("after SIGTERM", func(t *testing.T) {
		l, c, _ := fixture(t, withProgress(5*time.Second))
		l.signalled(after(time.Second), syscall.SIGTERM)
		l.progressOverdue(after(6 * time.Second))
		wantStops(t, c, syscall.SIGTERM)
		l.childExited(after(7*time.Second), signals.Status{Signal: syscall.SIGTERM})
		if _, err := l.result(); err != nil || l.stalled != nil {
			t.Fatalf("result %v, stalled %v: a stop on SIGTERM is not a stall", err, l.stalled)
		}
	})
	t.Run("during the hold", func(t *testing.T) {
		l, c, _ := fixture(t, func(c *Config) { withProgress(5 * time.Second)(c); c.MinHold = time.Minute })
		l.childExited(after(time.Second), signals.Status{})
		l.progressOverdue(after(30 * time.Second))
		wantStops(t, c)
		if _, err := l.result(); err != nil || l.phase != holding {
			t.Fatalf("result %v, phase %v: a child that exited cannot stall", err, l.phase)
		}
	})
}

// TestLossWhileStalledIsLoss: a loss while the stalled child's tree is
// being stopped does not stop it again, and is reported as the loss it is
// (exit 76): the lock may not have been held to the end.
func TestLossWhileStalledIsLoss(t *testing.T) {
	l, c, _ := fixture(t, withProgress(5*time.Second))
	l.progressOverdue(after(5 * time.Second))
	l.leaseLost(after(5500*time.Millisecond), errors.New("key deleted"))
	wantStops(t, c, syscall.SIGTERM)
	l.childExited(after(6*time.Second), signals.Status{Signal: syscall.SIGTERM})
	if _, err := l.result(); !errors.Is(err, ErrLeadershipLost) {
		t.Fatalf("result %v, want ErrLeadershipLost", err)
	}
	if term := l.term("me", t0, after(6*time.Second), ""); term.End != backends.EndLost {
		t.Fatalf("term %+v, want lost", term)
	}
}

// TestProgressOff: without --progress-timeout nothing is timed, and
// reports are ignored.
func TestProgressOff(t *testing.T) {
	l, c, ev := fixture(t, nil)
	l.progressed(after(time.Second), after(time.Second))
	l.progressOverdue(after(time.Hour))
	wantStops(t, c)
	if l.phase != leading || ev.has(ProgressReported) {
		t.Fatalf("phase %v, ProgressReported observed %v", l.phase, ev.has(ProgressReported))
	}
}

// TestRunStopsStalledChild: the loop, with real timers and the fake
// child, takes reports from Progress (newest wins however many arrive
// between two wake-ups), never stops a child that keeps reporting, stops
// it once reports cease, no earlier than the timeout after the last one,
// and returns only once the child is gone.
func TestRunStopsStalledChild(t *testing.T) {
	// Long enough for the test's own report to follow the loop's event
	// on a machine loaded by the e2e and fault suites (300 ms was not).
	const timeout = time.Second
	ev := &events{seen: make(chan EventKind, 64)}
	cfg := Config{
		Timings: backends.DefaultTimings,
		Child:   signals.Spec{KillGrace: 3 * time.Second, KillSignal: syscall.SIGTERM}, Observer: ev,
		Log: slog.New(slog.NewTextHandler(io.Discard, nil)), ProgressTimeout: timeout, Progress: NewProgress(),
	}
	c := newFakeChild()
	lease := &fakeLease{Loss: backends.NewLoss(), released: make(chan struct{})}
	l := newLeadership(&cfg, cfg.Log, 7, c, time.Now(), time.Now())
	if k := <-ev.seen; k != ProgressReported {
		t.Fatalf("first event %v, want the clock's start", k)
	}
	returned := make(chan struct{})
	go func() {
		defer close(returned)
		l.run(context.Background(), lease)
	}()
	// Report for three timeouts, each report waiting for the loop to
	// take the one before.
	var last time.Time
	for begin := time.Now(); time.Since(begin) < 3*timeout; {
		last = time.Now()
		cfg.Progress.Report(last)
		k := <-ev.seen
		for k == Renewed { // the lease's own renewals go on meanwhile
			k = <-ev.seen
		}
		if k != ProgressReported {
			t.Fatalf("event %v while reporting, want ProgressReported", k)
		}
	}
	wantStops(t, c)
	for k := range ev.seen {
		if k == Stalled {
			break
		}
	}
	stalled := time.Now()
	wantStops(t, c, syscall.SIGTERM)
	if gap := stalled.Sub(last); gap < timeout {
		t.Fatalf("stopped %v after the last report, before the %v timeout", gap, timeout)
	}
	// A report now changes nothing; the loop waits for the child.
	cfg.Progress.Report(time.Now())
	select {
	case <-returned:
		t.Fatal("the loop returned while the child's tree was alive")
	default:
	}
	close(c.done)
	<-returned
	if _, err := l.result(); !errors.Is(err, ErrStalled) {
		t.Fatalf("result %v, want ErrStalled", err)
	}
	wantStops(t, c, syscall.SIGTERM)
}
