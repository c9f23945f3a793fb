package runner_test

import (
	"context"
	"errors"
	"fmt"
	"os"
	"os/signal"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/leaderrun/leaderrun/backends"
	"github.com/leaderrun/leaderrun/backends/local"
	"github.com/leaderrun/leaderrun/runner"
	"github.com/leaderrun/leaderrun/signals"
	// The test binary is its own watchdog, as leaderrun is.
	_ "github.com/leaderrun/leaderrun/takeover"
)

// TestMain lets the test binary act as a child that records when it
// starts and when it is signalled (it is its own watchdog through the
// init of package takeover).
func TestMain(m *testing.M) {
	if path := os.Getenv("RUNNER_TEST_CHILD"); path != "" {
		os.Exit(child(path))
	}
	// A race-enabled watchdog would sleep a second at exit, and the
	// runner waits for it.
	if os.Getenv("GORACE") == "" {
		os.Setenv("GORACE", "atexit_sleep_ms=0")
	}
	os.Exit(m.Run())
}

func child(path string) int {
	sigs := make(chan os.Signal, 1)
	signal.Notify(sigs, syscall.SIGTERM)
	record(path, "start")
	<-sigs
	record(path, "signalled")
	return 0
}

func record(path, what string) {
	f, err := os.OpenFile(path, os.O_WRONLY|os.O_APPEND|os.O_CREATE, 0o600)
	if err != nil {
		return
	}
	defer f.Close()
	fmt.Fprintf(f, "%s %d %s %s\n", what, time.Now().UnixNano(), os.Getenv("FENCE_TOKEN"), os.Getenv("LEADERRUN_SLOT"))
}

// recorded returns the time of the first line for what, waiting for it.
func recorded(t *testing.T, path, what string) time.Time {
	t.Helper()
	deadline := time.Now().Add(10 * time.Second)
	for time.Now().Before(deadline) {
		data, _ := os.ReadFile(path)
		for _, line := range strings.Split(string(data), "\n") {
			f := strings.Fields(line)
			if len(f) >= 2 && f[0] == what {
				ns, _ := strconv.ParseInt(f[1], 10, 64)
				return time.Unix(0, ns)
			}
		}
		time.Sleep(2 * time.Millisecond)
	}
	t.Fatalf("child never recorded %q", what)
	return time.Time{}
}

// flaky wraps the real local store and lets a test decide what renewals
// do, standing in for a store that stops answering: the one thing a local
// flock cannot be made to do for real.
type flaky struct {
	backends.Store
	mu   sync.Mutex
	fail func(n int) error // nil: pass through
	// complete, if set, is what a fenced write of the markers returns
	// instead of writing.
	complete error
	delay    time.Duration
	sends    []time.Time // send time of each acknowledged renewal
	n        int
}

func newFlaky(dir string) *flaky { return &flaky{Store: local.Open(dir)} }

func (f *flaky) Lock(name string) backends.Lock {
	return &flakyLock{RecordLock: f.Store.Lock(name).(backends.RecordLock), f: f}
}

type flakyLock struct {
	backends.RecordLock
	f *flaky
}

// Take grants a lease of 10 s, as a store with a clock would, rather
// than the flock's, which never expires.
func (l *flakyLock) Take(ctx context.Context, prev backends.Record, c backends.Claim) (backends.Record, error) {
	rec, err := l.RecordLock.Take(ctx, prev, c)
	rec.TTL = 10 * time.Second
	return rec, err
}

func (l *flakyLock) Keep(ctx context.Context, held backends.Record) (backends.Record, error) {
	sent := time.Now()
	l.f.mu.Lock()
	l.f.n++
	n, fail, delay := l.f.n, l.f.fail, l.f.delay
	l.f.mu.Unlock()
	if delay > 0 {
		select {
		case <-time.After(delay):
		case <-ctx.Done():
			return held, ctx.Err()
		}
	}
	if fail != nil {
		if err := fail(n); err != nil {
			return held, err
		}
	}
	rec, err := l.RecordLock.Keep(ctx, held)
	if err != nil {
		return rec, err
	}
	l.f.mu.Lock()
	l.f.sends = append(l.f.sends, sent)
	l.f.mu.Unlock()
	return rec, nil
}

// WriteDocHeld fails as the store's fenced write does when the lease was
// lost after the command exited, if the test says so.
func (l *flakyLock) WriteDocHeld(ctx context.Context, d backends.Doc, held backends.Record) error {
	if err := l.f.complete; err != nil && d.Name == backends.DocMarkers {
		return err
	}
	return l.RecordLock.WriteDocHeld(ctx, d, held)
}

func (f *flaky) lastAck(before time.Time) time.Time {
	f.mu.Lock()
	defer f.mu.Unlock()
	var last time.Time
	for _, s := range f.sends {
		if s.Before(before) && s.After(last) {
			last = s
		}
	}
	return last
}

func baseConfig(t *testing.T, s backends.Store, events string) runner.Config {
	self, err := os.Executable()
	if err != nil {
		t.Fatal(err)
	}
	return runner.Config{
		Store:    s,
		Lock:     "runner",
		Identity: t.Name(),
		Timings: backends.Timings{LeaseDuration: 10 * time.Second, RenewDeadline: 600 * time.Millisecond,
			RetryPeriod: 100 * time.Millisecond, KillGrace: 2 * time.Second},
		Child: signals.Spec{Path: self, Args: []string{self}},
		Env:   append(os.Environ(), "RUNNER_TEST_CHILD="+events, "GORACE=atexit_sleep_ms=0"),
	}
}

// run is runner.New and Run.
func run(ctx context.Context, cfg runner.Config) (signals.Status, error) {
	r, err := runner.New(cfg)
	if err != nil {
		return signals.Status{}, err
	}
	return r.Run(ctx)
}

// TestRenewDeadline (S2): once renewals stop being acknowledged the child
// gets the kill signal no later than --renew-deadline after the send time of
// the last acknowledged renewal, and not before.
func TestRenewDeadline(t *testing.T) {
	cases := []struct {
		name  string
		fail  func(n int) error
		delay time.Duration
	}{
		{name: "store errors", fail: func(n int) error {
			if n > 3 {
				return errors.New("connection refused")
			}
			return nil
		}},
		{name: "store stalls", delay: time.Hour},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			dir := t.TempDir()
			events := filepath.Join(dir, "events")
			f := newFlaky(dir)
			f.fail = tc.fail
			cfg := baseConfig(t, f, events)
			done := make(chan error, 1)
			go func() {
				_, err := run(context.Background(), cfg)
				done <- err
			}()
			recorded(t, events, "start")
			if tc.delay > 0 {
				// Let a few renewals succeed, then stall every later one.
				waitUntil(t, func() bool { f.mu.Lock(); defer f.mu.Unlock(); return len(f.sends) >= 3 })
				f.mu.Lock()
				f.delay = tc.delay
				f.mu.Unlock()
			}
			signalled := recorded(t, events, "signalled")
			err := <-done
			if !errors.Is(err, runner.ErrLeadershipLost) {
				t.Errorf("Run returned %v, want ErrLeadershipLost", err)
			}
			last := f.lastAck(signalled)
			gap := signalled.Sub(last)
			t.Logf("child signalled %v after the send time of the last acknowledged renewal (deadline %v)", gap, cfg.Timings.RenewDeadline)
			if gap > cfg.Timings.RenewDeadline+100*time.Millisecond {
				t.Errorf("signalled %v after the last acknowledged send, beyond the %v deadline", gap, cfg.Timings.RenewDeadline)
			}
			if gap < cfg.Timings.RenewDeadline {
				t.Errorf("signalled after only %v, before the %v deadline", gap, cfg.Timings.RenewDeadline)
			}
		})
	}
}

// TestTransientFailuresTolerated: renewals that fail for less than the
// deadline do not stop the child.
func TestTransientFailuresTolerated(t *testing.T) {
	dir := t.TempDir()
	events := filepath.Join(dir, "events")
	f := newFlaky(dir)
	// Attempts 2-4 fail: 300 ms without an ack, half the deadline.
	f.fail = func(n int) error {
		if n >= 2 && n <= 4 {
			return errors.New("connection reset")
		}
		return nil
	}
	cfg := baseConfig(t, f, events)
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() {
		_, err := run(ctx, cfg)
		done <- err
	}()
	recorded(t, events, "start")
	waitUntil(t, func() bool { f.mu.Lock(); defer f.mu.Unlock(); return f.n >= 10 })
	cancel()
	if err := <-done; err != nil {
		t.Errorf("Run returned %v after transient failures and cancel, want nil", err)
	}
}

// TestLostStopsChildAndReleasesAfter (S3, S8): a loss that the store
// reports stops the child at once, and the lock is free only once the child
// is gone.
func TestLostStopsChildAndReleasesAfter(t *testing.T) {
	dir := t.TempDir()
	events := filepath.Join(dir, "events")
	b := local.Open(dir)
	cfg := baseConfig(t, b, events)
	cfg.Timings.RenewDeadline = 5 * time.Second
	cfg.Timings.RetryPeriod = time.Second
	done := make(chan error, 1)
	go func() {
		_, err := run(context.Background(), cfg)
		done <- err
	}()
	recorded(t, events, "start")
	removed := time.Now()
	if err := os.Remove(filepath.Join(dir, "runner.lock")); err != nil {
		t.Fatal(err)
	}
	signalled := recorded(t, events, "signalled")
	if d := signalled.Sub(removed); d > 100*time.Millisecond {
		t.Errorf("child signalled %v after the loss, want under 100ms", d)
	} else {
		t.Logf("child signalled %v after the loss", d)
	}
	err := <-done
	var lost *runner.LostError
	if !errors.As(err, &lost) {
		t.Fatalf("Run returned %v, want *LostError", err)
	}
}

// TestTTLTooShortRefused: a lease the store granted shorter than the
// deadline plus grace is refused before the child starts.
func TestTTLTooShortRefused(t *testing.T) {
	dir := t.TempDir()
	events := filepath.Join(dir, "events")
	f := newFlaky(dir)
	cfg := baseConfig(t, f, events)
	// 12s asked passes the check of the flags; the 10s the wrapper grants
	// is not more than 9s + 2s grace.
	cfg.Timings.LeaseDuration = 12 * time.Second
	cfg.Timings.RenewDeadline = 9 * time.Second
	cfg.Timings.RetryPeriod = time.Second
	_, err := run(context.Background(), cfg)
	var ce *runner.ConfigError
	if !errors.As(err, &ce) {
		t.Fatalf("Run returned %v, want *ConfigError", err)
	}
	// The wrapper grants 10s whatever is asked: 1s more would do.
	if want := fmt.Sprintf("raise --lease-duration above %v", cfg.Timings.LeaseDuration+time.Second); !strings.Contains(err.Error(), want) {
		t.Errorf("error %q does not say %q", err, want)
	}
	if _, err := os.Stat(events); err == nil {
		t.Error("the child ran although the granted TTL was refused")
	}
}

// TestMarkerLostIsALostTerm: a command that exits 0 under --once-per,
// whose fenced completion marker then cannot be written because the lease
// was lost meanwhile, makes Run return a *LostError (exit 76), and the
// lock's history records the term as lost, with the reason, not as a run
// that exited.
func TestMarkerLostIsALostTerm(t *testing.T) {
	dir := t.TempDir()
	f := newFlaky(dir)
	f.complete = fmt.Errorf("lock file removed: %w", backends.ErrLeaseLost)
	cfg := baseConfig(t, f, filepath.Join(dir, "events"))
	cfg.Child.Path, cfg.Child.Args = "/bin/sh", []string{"sh", "-c", "exit 0"}
	cfg.OnceKey, cfg.OnceKeep = "every-60s-1", time.Hour
	status, err := run(context.Background(), cfg)
	var lost *runner.LostError
	if !errors.As(err, &lost) || !errors.Is(err, backends.ErrLeaseLost) {
		t.Fatalf("Run returned %v (status %v), want a *LostError for the marker", err, status)
	}
	terms, err := backends.ReadHistory(context.Background(), f, cfg.Lock, 1)
	if err != nil || len(terms) != 1 {
		t.Fatalf("history: %v, %v", terms, err)
	}
	term := terms[0]
	if term.End != backends.EndLost || !strings.Contains(term.Reason, "completion marker") || !strings.Contains(term.Reason, "lock file removed") {
		t.Errorf("term recorded as %q (reason %q), want lost, saying the completion marker could not be written and why", term.End, term.Reason)
	}
	if term.ExitCode != 0 || term.OnceKey != cfg.OnceKey {
		t.Errorf("term %+v: want the command's exit code 0 and the once-key", term)
	}
	if m, err := backends.ReadMarker(context.Background(), f, cfg.Lock, cfg.OnceKey); err != nil || m != nil {
		t.Errorf("marker %+v, %v: want none", m, err)
	}
}

// TestNewRefuses: New validates the configuration once, before anything
// starts, with a *ConfigError that names the flags involved.
func TestNewRefuses(t *testing.T) {
	cases := []struct {
		name   string
		change func(*runner.Config)
		want   string
	}{
		{name: "defaults of the command line", change: func(c *runner.Config) {
			c.Timings = backends.DefaultTimings
		}},
		{name: "lease equals deadline plus grace", change: func(c *runner.Config) {
			c.Timings = backends.Timings{LeaseDuration: 13 * time.Second, RenewDeadline: 10 * time.Second, RetryPeriod: 2 * time.Second, KillGrace: 3 * time.Second}
		}, want: "--lease-duration (13s) must be greater than --renew-deadline (10s) + --kill-grace (3s)"},
		{name: "retry too close to deadline", change: func(c *runner.Config) {
			c.Timings.RenewDeadline, c.Timings.RetryPeriod = 2*time.Second, 2*time.Second
		}, want: "1.2 × --retry-period"},
		{name: "zero grace", change: func(c *runner.Config) { c.Timings.KillGrace = 0 }, want: "--kill-grace must be greater than 0"},
		{name: "zero lease", change: func(c *runner.Config) { c.Timings.LeaseDuration = 0 }, want: "--lease-duration must be greater than 0"},
		{name: "overflowing deadline", change: func(c *runner.Config) { c.Timings.RenewDeadline = 1 << 62 }, want: "--renew-deadline 1281023h"},
		{name: "negative wait", change: func(c *runner.Config) { c.Wait = -time.Second }, want: "--wait -1s: must not be negative"},
		{name: "negative min-hold", change: func(c *runner.Config) { c.MinHold = -time.Second }, want: "--min-hold -1s"},
		{name: "huge wait", change: func(c *runner.Config) { c.Wait = 400 * 24 * time.Hour }, want: "--wait 9600h0m0s is longer than the 8784h0m0s"},
		{name: "try and wait", change: func(c *runner.Config) { c.Try, c.Wait = true, time.Second }, want: "--try and --wait 1s exclude each other"},
		{name: "kill signal that stops nothing", change: func(c *runner.Config) { c.Child.KillSignal = syscall.SIGSTOP }, want: "--kill-signal SIGSTOP"},
		{name: "once-key without a lifetime", change: func(c *runner.Config) { c.OnceKey = "k" }, want: "marker lifetime"},
		{name: "no command", change: func(c *runner.Config) { c.Child.Args = nil }, want: "no command"},
		{name: "no store", change: func(c *runner.Config) { c.Store = nil }, want: "no store"},
		{name: "progress timeout", change: func(c *runner.Config) { c.ProgressTimeout, c.Progress = time.Second, runner.NewProgress() }},
		{name: "progress timeout too short", change: func(c *runner.Config) {
			c.ProgressTimeout, c.Progress = 999*time.Millisecond, runner.NewProgress()
		}, want: "--progress-timeout 999ms: want at least 1s"},
		{name: "negative progress timeout", change: func(c *runner.Config) {
			c.ProgressTimeout, c.Progress = -time.Second, runner.NewProgress()
		}, want: "--progress-timeout -1s: want at least 1s"},
		{name: "huge progress timeout", change: func(c *runner.Config) {
			c.ProgressTimeout, c.Progress = 400*24*time.Hour, runner.NewProgress()
		}, want: "--progress-timeout 9600h0m0s is longer than the 8784h0m0s"},
		{name: "progress timeout without reports", change: func(c *runner.Config) { c.ProgressTimeout = time.Minute },
			want: "--progress-timeout 1m0s: no channel"},
		{name: "too many holders", change: func(c *runner.Config) { c.Holders = 101 }, want: "--holders 101: want 1-100"},
		{name: "negative holders", change: func(c *runner.Config) { c.Holders = -1 }, want: "--holders -1: want 1-100"},
		{name: "once-per-slot without a once-key", change: func(c *runner.Config) { c.Holders, c.OncePerSlot = 3, true },
			want: "--once-per-slot needs --once-per or --once-key"},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			dir := t.TempDir()
			cfg := baseConfig(t, local.Open(dir), filepath.Join(dir, "events"))
			tc.change(&cfg)
			r, err := runner.New(cfg)
			if tc.want == "" {
				if err != nil {
					t.Fatalf("New: %v", err)
				}
				r.Close()
				return
			}
			var ce *runner.ConfigError
			if !errors.As(err, &ce) || !strings.Contains(err.Error(), tc.want) {
				t.Fatalf("New: %v, want a *ConfigError containing %q", err, tc.want)
			}
			if r != nil {
				t.Fatal("New returned a runner with its error")
			}
			if entries, _ := os.ReadDir(dir); len(entries) != 0 {
				t.Errorf("New touched the state directory of a refused configuration: %v", entries)
			}
		})
	}
}

func waitUntil(t *testing.T, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(10 * time.Second)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatal("condition not met within 10s")
		}
		time.Sleep(2 * time.Millisecond)
	}
}
