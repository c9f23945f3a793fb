package runner

import (
	"context"
	"errors"
	"io"
	"log/slog"
	"os"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/leaderrun/leaderrun/backends"
	"github.com/leaderrun/leaderrun/signals"
)

// These tests drive the leadership's state machine with made-up times and a
// fake child: every rule of docs/safety.md that the runner owns, exactly,
// with no process and no sleep. runner_test.go runs the same rules with
// real processes.

// fakeChild records what the leadership asks of the command.
type fakeChild struct {
	mu        sync.Mutex
	stops     []syscall.Signal
	sigs      []syscall.Signal
	deadlines []time.Time
	expired   bool
	done      chan struct{}
	status    signals.Status
	// signalled is told of every Signal, for tests that run the loop.
	signalled chan syscall.Signal
}

func newFakeChild() *fakeChild {
	return &fakeChild{done: make(chan struct{}), signalled: make(chan syscall.Signal, 16)}
}

func (c *fakeChild) Pid() int { return 4242 }
func (c *fakeChild) Stop(sig syscall.Signal) {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.stops = append(c.stops, sig)
}
func (c *fakeChild) Signal(sig syscall.Signal) error {
	c.mu.Lock()
	c.sigs = append(c.sigs, sig)
	c.mu.Unlock()
	c.signalled <- sig
	return nil
}
func (c *fakeChild) SetDeadline(t time.Time) {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.deadlines = append(c.deadlines, t)
}
func (c *fakeChild) Expired() bool {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.expired
}
func (c *fakeChild) Done() <-chan struct{}  { return c.done }
func (c *fakeChild) Status() signals.Status { <-c.done; return c.status }

func (c *fakeChild) stopped() []syscall.Signal {
	c.mu.Lock()
	defer c.mu.Unlock()
	return append([]syscall.Signal(nil), c.stops...)
}

// events records the observer's events.
type events struct {
	mu   sync.Mutex
	all  []EventKind
	seen chan EventKind
}

func (e *events) Observe(ev Event) {
	e.mu.Lock()
	e.all = append(e.all, ev.Kind)
	e.mu.Unlock()
	if e.seen != nil {
		e.seen <- ev.Kind
	}
}

func (e *events) has(k EventKind) bool {
	e.mu.Lock()
	defer e.mu.Unlock()
	for _, x := range e.all {
		if x == k {
			return true
		}
	}
	return false
}

var t0 = time.Date(2026, 12, 1, 12, 0, 0, 0, time.UTC)

// fixture is a leadership that started its child at t0 with a fresh grant
// sent at t0.
func fixture(t *testing.T, mutate func(*Config)) (*leadership, *fakeChild, *events) {
	t.Helper()
	ev := &events{}
	cfg := Config{
		Timings:  backends.DefaultTimings,
		Child:    signals.Spec{KillGrace: 3 * time.Second, KillSignal: syscall.SIGTERM},
		Observer: ev,
		Log:      slog.New(slog.NewTextHandler(io.Discard, nil)),
	}
	if mutate != nil {
		mutate(&cfg)
	}
	c := newFakeChild()
	return newLeadership(&cfg, cfg.Log, 7, c, t0, t0), c, ev
}

func after(d time.Duration) time.Time { return t0.Add(d) }

func wantStops(t *testing.T, c *fakeChild, want ...syscall.Signal) {
	t.Helper()
	got := c.stopped()
	if len(got) != len(want) {
		t.Fatalf("Stop called with %v, want %v", got, want)
	}
	for i := range want {
		if got[i] != want[i] {
			t.Fatalf("Stop called with %v, want %v", got, want)
		}
	}
}

// TestDeadlineCountsFromSendTime (S2): the deadline is the send time of the
// last acknowledged renewal plus --renew-deadline, however late the
// acknowledgement came; the child gets the kill signal at that instant,
// not a nanosecond before, and once.
func TestDeadlineCountsFromSendTime(t *testing.T) {
	l, c, _ := fixture(t, nil)
	// Sent at 1 s, acknowledged at 4 s: the deadline is 11 s, not 14 s.
	l.renewed(after(4*time.Second), renewal{sent: after(time.Second), latency: 3 * time.Second})
	if want := after(11 * time.Second); !l.deadline.Equal(want) {
		t.Fatalf("deadline %v, want %v", l.deadline, want)
	}
	l.deadlinePassed(after(11*time.Second - time.Nanosecond))
	wantStops(t, c)
	if l.phase != leading {
		t.Fatalf("phase %v before the deadline", l.phase)
	}
	l.deadlinePassed(after(11 * time.Second))
	wantStops(t, c, syscall.SIGTERM)
	l.deadlinePassed(after(12 * time.Second))
	wantStops(t, c, syscall.SIGTERM)
	if l.phase != stopping || l.lost == nil || !strings.Contains(l.lost.Error(), "--renew-deadline 10s") {
		t.Fatalf("phase %v, lost %v; want stopping with the deadline as the reason", l.phase, l.lost)
	}
}

// TestStaleAcknowledgementKeepsDeadline: acknowledgements that arrive out of
// order never move the deadline back to an older send time.
func TestStaleAcknowledgementKeepsDeadline(t *testing.T) {
	l, _, _ := fixture(t, nil)
	l.renewed(after(3*time.Second), renewal{sent: after(2 * time.Second)})
	l.renewed(after(4*time.Second), renewal{sent: after(1 * time.Second)})
	if want := after(12 * time.Second); !l.deadline.Equal(want) {
		t.Fatalf("deadline %v, want %v", l.deadline, want)
	}
}

// TestWatchdogGetsEveryDeadline (S10): every renewal that moves the
// deadline hands the new one to the watchdog, which holds it should
// leaderrun freeze; one that does not move it (out of order) sends
// nothing.
func TestWatchdogGetsEveryDeadline(t *testing.T) {
	l, c, _ := fixture(t, nil)
	l.renewed(after(3*time.Second), renewal{sent: after(2 * time.Second)})
	l.renewed(after(4*time.Second), renewal{sent: after(1 * time.Second)})
	l.renewed(after(5*time.Second), renewal{sent: after(4 * time.Second)})
	l.renewed(after(6*time.Second), renewal{sent: after(6 * time.Second), err: errors.New("timeout")})
	c.mu.Lock()
	got := append([]time.Time(nil), c.deadlines...)
	c.mu.Unlock()
	want := []time.Time{after(12 * time.Second), after(14 * time.Second)}
	if len(got) != len(want) || !got[0].Equal(want[0]) || !got[1].Equal(want[1]) {
		t.Fatalf("deadlines sent to the watchdog %v, want %v", got, want)
	}
}

// TestWatchdogStoppedChildIsLoss (S10): the watchdog stopped the child at
// the deadline while leaderrun was frozen; on resume the child's end is
// the first event leaderrun sees, and it is the loss it is, not a child
// that exited by itself.
func TestWatchdogStoppedChildIsLoss(t *testing.T) {
	l, c, ev := fixture(t, nil)
	c.expired = true
	l.childExited(after(30*time.Second), signals.Status{Signal: syscall.SIGTERM})
	if _, err := l.result(); !errors.Is(err, ErrLeadershipLost) || !ev.has(Lost) {
		t.Fatalf("result %v (Lost observed %v), want ErrLeadershipLost", err, ev.has(Lost))
	}
	if term := l.term("me", t0, after(30*time.Second), ""); term.End != backends.EndLost ||
		!strings.Contains(term.Reason, "the watchdog stopped the child") {
		t.Fatalf("term %+v, want lost, stopped by the watchdog", term)
	}
	if l.phase != done {
		t.Fatalf("phase %v, want done", l.phase)
	}
}

// TestTransientFailureTolerated: a failed renewal that is not a loss leaves
// the deadline where it was.
func TestTransientFailureTolerated(t *testing.T) {
	l, c, ev := fixture(t, nil)
	l.renewed(after(2*time.Second), renewal{sent: after(2 * time.Second), err: errors.New("connection refused")})
	wantStops(t, c)
	if !l.deadline.Equal(after(10*time.Second)) || !ev.has(RenewFailed) {
		t.Fatalf("deadline %v (want 10 s), RenewFailed observed: %v", l.deadline.Sub(t0), ev.has(RenewFailed))
	}
}

// TestPauseDetected (S7): after a pause past the deadline, the first event
// on resume stops the child: the deadline timer firing late, or a renewal
// that was sent only after the deadline had passed, even if acknowledged.
func TestPauseDetected(t *testing.T) {
	t.Run("timer fires on resume", func(t *testing.T) {
		l, c, _ := fixture(t, nil)
		l.deadlinePassed(after(40 * time.Second))
		wantStops(t, c, syscall.SIGTERM)
	})
	t.Run("renewal acknowledged after the deadline", func(t *testing.T) {
		// Sent at 9 s, before the 10 s deadline; its answer is handled
		// at 12 s, when the deadline has passed: too late.
		l, c, _ := fixture(t, nil)
		l.renewed(after(12*time.Second), renewal{sent: after(9 * time.Second), latency: 3 * time.Second})
		wantStops(t, c, syscall.SIGTERM)
		if l.lost == nil || !strings.Contains(l.lost.Error(), "before the renewal sent 3s earlier was acknowledged") {
			t.Fatalf("lost %v, want the late acknowledgement", l.lost)
		}
	})
	t.Run("renewal sent after the deadline", func(t *testing.T) {
		l, c, _ := fixture(t, nil)
		l.renewed(after(40*time.Second), renewal{sent: after(39 * time.Second)})
		wantStops(t, c, syscall.SIGTERM)
		if l.lost == nil || !strings.Contains(l.lost.Error(), "29s late") {
			t.Fatalf("lost %v, want the renewal 29s late", l.lost)
		}
	})
}

// TestStoreReportsLoss (S3): the store's word stops the child at once, with
// the kill signal; a renewal that says the lease is gone does the same.
func TestStoreReportsLoss(t *testing.T) {
	for _, tc := range []struct {
		name string
		do   func(*leadership)
	}{
		{"lost channel", func(l *leadership) { l.leaseLost(after(time.Second), errors.New("key deleted")) }},
		{"renewal", func(l *leadership) {
			l.renewed(after(time.Second), renewal{sent: after(time.Second), err: backends.ErrLeaseLost})
		}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			l, c, ev := fixture(t, func(c *Config) { c.Child.KillSignal = syscall.SIGINT })
			tc.do(l)
			wantStops(t, c, syscall.SIGINT)
			if l.phase != stopping || !ev.has(Lost) {
				t.Fatalf("phase %v, Lost observed %v", l.phase, ev.has(Lost))
			}
			l.childExited(after(2*time.Second), signals.Status{Signal: syscall.SIGINT})
			if _, err := l.result(); !errors.Is(err, ErrLeadershipLost) {
				t.Fatalf("result %v, want ErrLeadershipLost", err)
			}
			if term := l.term("me", t0, after(2*time.Second), ""); term.End != backends.EndLost || term.ExitCode != 130 {
				t.Fatalf("term %+v, want lost with exit 130", term)
			}
		})
	}
}

// TestMinHold: a child that exits before --min-hold keeps the lock until
// --min-hold after its start; a loss during the hold only ends the hold
// (the child finished on its own: its status stands, no exit 76).
func TestMinHold(t *testing.T) {
	l, c, _ := fixture(t, func(c *Config) { c.MinHold = 10 * time.Second })
	l.childExited(after(time.Second), signals.Status{})
	if l.phase != holding || !l.holdUntil.Equal(after(10*time.Second)) {
		t.Fatalf("phase %v hold until %v, want holding until 10 s", l.phase, l.holdUntil.Sub(t0))
	}
	l.holdOver(after(10*time.Second - time.Nanosecond))
	if l.phase != holding {
		t.Fatalf("hold ended early")
	}
	l.renewed(after(2*time.Second), renewal{sent: after(2 * time.Second)})
	l.leaseLost(after(3*time.Second), errors.New("revoked"))
	wantStops(t, c)
	if l.phase != done || l.holdLost == nil {
		t.Fatalf("phase %v holdLost %v after a loss during the hold", l.phase, l.holdLost)
	}
	if _, err := l.result(); err != nil {
		t.Fatalf("result %v after a loss during the hold, want the child's own status", err)
	}

	l, _, _ = fixture(t, func(c *Config) { c.MinHold = 10 * time.Second })
	l.childExited(after(time.Second), signals.Status{})
	l.holdOver(after(10 * time.Second))
	if l.phase != done {
		t.Fatalf("phase %v at the end of the hold", l.phase)
	}
	l, _, _ = fixture(t, func(c *Config) { c.MinHold = 10 * time.Second })
	l.childExited(after(time.Second), signals.Status{})
	l.signalled(after(2*time.Second), syscall.SIGTERM)
	if l.phase != done {
		t.Fatalf("phase %v after SIGTERM during the hold", l.phase)
	}
}

// TestSignals (S6): SIGTERM and SIGINT start the stop sequence once; other
// signals are forwarded; a signal while stopping is forwarded and starts no
// second sequence; a stopped child is not held for --min-hold.
func TestSignals(t *testing.T) {
	l, c, _ := fixture(t, func(c *Config) { c.MinHold = time.Hour })
	l.signalled(after(time.Second), syscall.SIGHUP)
	if l.phase != leading {
		t.Fatalf("phase %v after SIGHUP", l.phase)
	}
	l.signalled(after(2*time.Second), syscall.SIGTERM)
	wantStops(t, c, syscall.SIGTERM)
	l.signalled(after(3*time.Second), syscall.SIGINT)
	wantStops(t, c, syscall.SIGTERM)
	if want := []syscall.Signal{syscall.SIGHUP, syscall.SIGINT}; len(c.sigs) != 2 || c.sigs[0] != want[0] || c.sigs[1] != want[1] {
		t.Fatalf("forwarded %v, want %v", c.sigs, want)
	}
	l.childExited(after(4*time.Second), signals.Status{Code: 143 - 128, Signal: 0})
	if l.phase != done {
		t.Fatalf("phase %v: a stopped child must not be held for --min-hold", l.phase)
	}
	if _, err := l.result(); err != nil {
		t.Fatalf("result %v after a SIGTERM stop, want the child's status", err)
	}
	if term := l.term("me", t0, after(4*time.Second), ""); term.End != backends.EndStopped || term.Signal != "SIGTERM" {
		t.Fatalf("term %+v, want stopped by SIGTERM", term)
	}
}

// TestLossWhileStopping: a loss after a SIGTERM stop does not stop the
// child a second time, and is reported.
func TestLossWhileStopping(t *testing.T) {
	l, c, _ := fixture(t, nil)
	l.signalled(after(time.Second), syscall.SIGTERM)
	l.leaseLost(after(2*time.Second), errors.New("expired"))
	wantStops(t, c, syscall.SIGTERM)
	l.childExited(after(3*time.Second), signals.Status{Signal: syscall.SIGTERM})
	if _, err := l.result(); !errors.Is(err, ErrLeadershipLost) {
		t.Fatalf("result %v, want ErrLeadershipLost", err)
	}
}

// fakeLease is a lease whose loss the test decides.
type fakeLease struct {
	*backends.Loss
	released chan struct{}
}

func (l *fakeLease) Token() uint64                   { return 7 }
func (l *fakeLease) TTL() time.Duration              { return 15 * time.Second }
func (l *fakeLease) Acquired() time.Time             { return time.Now() }
func (l *fakeLease) Renew(ctx context.Context) error { return l.Err() }
func (l *fakeLease) Slot() int                       { return 0 }
func (l *fakeLease) LockFile() *os.File              { return nil }
func (l *fakeLease) Completed(context.Context, string, bool) (*backends.Marker, error) {
	return nil, nil
}
func (l *fakeLease) Complete(context.Context, backends.Marker) error { return nil }
func (l *fakeLease) Release(context.Context, *backends.Term) error {
	close(l.released)
	return nil
}

// TestRunWaitsForChildTree (S8): after a loss, the loop keeps running (it
// still forwards signals) until the child's tree is gone, and only then
// returns, so that the lease is released after the child, never before.
func TestRunWaitsForChildTree(t *testing.T) {
	ev := &events{seen: make(chan EventKind, 16)}
	sigs := make(chan os.Signal, 1)
	cfg := Config{
		Timings: backends.DefaultTimings,
		Child:   signals.Spec{KillGrace: 3 * time.Second, KillSignal: syscall.SIGTERM}, Observer: ev,
		Log: slog.New(slog.NewTextHandler(io.Discard, nil)), Signals: sigs,
	}
	c := newFakeChild()
	lease := &fakeLease{Loss: backends.NewLoss(), released: make(chan struct{})}
	l := newLeadership(&cfg, cfg.Log, 7, c, time.Now(), time.Now())
	returned := make(chan struct{})
	go func() {
		defer close(returned)
		l.run(context.Background(), lease)
	}()
	lease.Set(errors.New("key deleted: " + backends.ErrLeaseLost.Error()))
	for k := range ev.seen {
		if k == Lost {
			break
		}
	}
	wantStops(t, c, syscall.SIGTERM)
	// The loop is still there: it forwards a signal.
	sigs <- syscall.SIGHUP
	if got := <-c.signalled; got != syscall.SIGHUP {
		t.Fatalf("forwarded %v", got)
	}
	select {
	case <-returned:
		t.Fatal("the loop returned while the child's tree was alive")
	default:
	}
	close(c.done)
	<-returned
	if l.phase != done {
		t.Fatalf("phase %v after the child is gone", l.phase)
	}
}

// staleLease is a grant whose proof of life is old, as a candidate that
// waited in the queue has; renew says what its Renew does.
type staleLease struct {
	fakeLease
	acquired time.Time
	renew    error
	renewed  int
}

func (l *staleLease) Acquired() time.Time { return l.acquired }
func (l *staleLease) Renew(context.Context) error {
	l.renewed++
	return l.renew
}

// TestFreshBeforeStart: the runner, not the backend, renews a grant whose
// proof of life is older than --retry-period before it starts the child,
// and counts the first deadline from that renewal; a grant the store says
// is gone starts nothing; a fresh grant is not renewed.
func TestFreshBeforeStart(t *testing.T) {
	cfg := Config{Timings: backends.DefaultTimings,
		Child: signals.Spec{KillGrace: 3 * time.Second}, Log: slog.New(slog.NewTextHandler(io.Discard, nil))}
	r := &Runner{cfg: cfg, log: cfg.Log}
	cases := []struct {
		name    string
		age     time.Duration
		renew   error
		renewed int
		wantErr error
		recent  bool // the deadline counts from the renewal, not the grant
	}{
		{name: "fresh grant", age: 0, renewed: 0, recent: true},
		{name: "old grant renewed", age: 5 * time.Second, renewed: 1, recent: true},
		{name: "old grant lost", age: 5 * time.Second, renew: backends.ErrLeaseLost, renewed: 1, wantErr: backends.ErrLeaseLost},
		{name: "old grant, renewal fails, deadline left", age: 5 * time.Second, renew: errors.New("timeout"), renewed: 1},
		{name: "grant past its deadline, renewal fails", age: 11 * time.Second, renew: errors.New("timeout"), renewed: 1,
			wantErr: errors.New("renew deadline passed")},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			acquired := time.Now().Add(-tc.age)
			l := &staleLease{fakeLease: fakeLease{Loss: backends.NewLoss()}, acquired: acquired, renew: tc.renew}
			before := time.Now()
			got, err := r.fresh(context.Background(), l)
			switch {
			case tc.wantErr == nil && err != nil:
				t.Fatalf("fresh: %v", err)
			case tc.wantErr != nil && (err == nil || !strings.Contains(err.Error(), tc.wantErr.Error())):
				t.Fatalf("fresh: %v, want %v", err, tc.wantErr)
			}
			if l.renewed != tc.renewed {
				t.Errorf("renewed %d times, want %d", l.renewed, tc.renewed)
			}
			if tc.wantErr == nil && tc.recent != !got.Before(before.Add(-time.Millisecond)) {
				t.Errorf("deadline counts from %v before the call; recent=%v wanted", before.Sub(got), tc.recent)
			}
		})
	}
}
