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
)

// TestMain lets the test binary act as a child that records when it
// starts and when it is signalled (it is its own watchdog through the
// signals package's init).
func TestMain(m *testing.M) {
	if path := os.Getenv("RUNNER_TEST_CHILD"); path != "" {
		os.Exit(child(path))
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
	fmt.Fprintf(f, "%s %d %s\n", what, time.Now().UnixNano(), os.Getenv("FENCE_TOKEN"))
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

// flaky wraps the real local backend and lets a test decide what renewals
// do, standing in for a store that stops answering: the one thing a local
// flock cannot be made to do for real.
type flaky struct {
	backends.Backend
	mu    sync.Mutex
	fail  func(n int) error // nil: pass through
	delay time.Duration
	sends []time.Time // send time of each acknowledged renewal
	n     int
}

func (f *flaky) Campaign(ctx context.Context, o backends.CampaignOptions) (backends.Lease, error) {
	l, err := f.Backend.Campaign(ctx, o)
	if err != nil {
		return nil, err
	}
	return &flakyLease{Lease: l, f: f}, nil
}

type flakyLease struct {
	backends.Lease
	f *flaky
}

func (l *flakyLease) TTL() time.Duration { return 10 * time.Second }

func (l *flakyLease) Renew(ctx context.Context) error {
	sent := time.Now()
	l.f.mu.Lock()
	l.f.n++
	n, fail, delay := l.f.n, l.f.fail, l.f.delay
	l.f.mu.Unlock()
	if delay > 0 {
		select {
		case <-time.After(delay):
		case <-ctx.Done():
			return ctx.Err()
		}
	}
	if fail != nil {
		if err := fail(n); err != nil {
			return err
		}
	}
	if err := l.Lease.Renew(ctx); err != nil {
		return err
	}
	l.f.mu.Lock()
	l.f.sends = append(l.f.sends, sent)
	l.f.mu.Unlock()
	return nil
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

func baseConfig(t *testing.T, b backends.Backend, events string) runner.Config {
	self, err := os.Executable()
	if err != nil {
		t.Fatal(err)
	}
	return runner.Config{
		Backend:       b,
		Lock:          "runner",
		Identity:      t.Name(),
		LeaseDuration: 10 * time.Second,
		RenewDeadline: 600 * time.Millisecond,
		RetryPeriod:   100 * time.Millisecond,
		KillGrace:     2 * time.Second,
		Path:          self,
		Args:          []string{self},
		Env:           append(os.Environ(), "RUNNER_TEST_CHILD="+events, "GORACE=atexit_sleep_ms=0"),
	}
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
			f := &flaky{Backend: local.New(local.Config{Dir: dir, Lock: "runner"})}
			f.fail = tc.fail
			cfg := baseConfig(t, f, events)
			done := make(chan error, 1)
			go func() {
				_, err := runner.Run(context.Background(), cfg)
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
			t.Logf("child signalled %v after the send time of the last acknowledged renewal (deadline %v)", gap, cfg.RenewDeadline)
			if gap > cfg.RenewDeadline+100*time.Millisecond {
				t.Errorf("signalled %v after the last acknowledged send, beyond the %v deadline", gap, cfg.RenewDeadline)
			}
			if gap < cfg.RenewDeadline {
				t.Errorf("signalled after only %v, before the %v deadline", gap, cfg.RenewDeadline)
			}
		})
	}
}

// TestTransientFailuresTolerated: renewals that fail for less than the
// deadline do not stop the child.
func TestTransientFailuresTolerated(t *testing.T) {
	dir := t.TempDir()
	events := filepath.Join(dir, "events")
	f := &flaky{Backend: local.New(local.Config{Dir: dir, Lock: "runner"})}
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
		_, err := runner.Run(ctx, cfg)
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
	b := local.New(local.Config{Dir: dir, Lock: "runner"})
	cfg := baseConfig(t, b, events)
	cfg.RenewDeadline = 5 * time.Second
	cfg.RetryPeriod = time.Second
	done := make(chan error, 1)
	go func() {
		_, err := runner.Run(context.Background(), cfg)
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
	f := &flaky{Backend: local.New(local.Config{Dir: dir, Lock: "runner"})}
	cfg := baseConfig(t, f, events)
	// 12s asked passes the check of the flags; the 10s the wrapper grants
	// is not more than 9s + 2s grace.
	cfg.LeaseDuration = 12 * time.Second
	cfg.RenewDeadline = 9 * time.Second
	cfg.RetryPeriod = time.Second
	_, err := runner.Run(context.Background(), cfg)
	var ce *runner.ConfigError
	if !errors.As(err, &ce) {
		t.Fatalf("Run returned %v, want *ConfigError", err)
	}
	// The wrapper grants 10s whatever is asked: 1s more would do.
	if want := fmt.Sprintf("raise --lease-duration above %v", cfg.LeaseDuration+time.Second); !strings.Contains(err.Error(), want) {
		t.Errorf("error %q does not say %q", err, want)
	}
	if _, err := os.Stat(events); err == nil {
		t.Error("the child ran although the granted TTL was refused")
	}
}

func TestValidateTimings(t *testing.T) {
	cases := []struct {
		name                          string
		lease, deadline, retry, grace time.Duration
		want                          string
	}{
		{name: "defaults", lease: 15 * time.Second, deadline: 10 * time.Second, retry: 2 * time.Second, grace: 3 * time.Second},
		{name: "lease equals deadline plus grace", lease: 13 * time.Second, deadline: 10 * time.Second, retry: 2 * time.Second, grace: 3 * time.Second, want: "--lease-duration (13s)"},
		{name: "retry too close to deadline", lease: 15 * time.Second, deadline: 2 * time.Second, retry: 2 * time.Second, grace: time.Second, want: "1.2 × --retry-period"},
		{name: "zero grace", lease: 15 * time.Second, deadline: 10 * time.Second, retry: 2 * time.Second, want: "--kill-grace must be greater than 0"},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			err := runner.ValidateTimings(tc.lease, tc.deadline, tc.retry, tc.grace)
			switch {
			case tc.want == "" && err != nil:
				t.Errorf("unexpected error %v", err)
			case tc.want != "" && (err == nil || !strings.Contains(err.Error(), tc.want)):
				t.Errorf("error %v, want one containing %q", err, tc.want)
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
