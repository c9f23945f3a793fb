package runner_test

import (
	"context"
	"errors"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/leaderrun/leaderrun/backends"
	"github.com/leaderrun/leaderrun/backends/local"
	"github.com/leaderrun/leaderrun/runner"
)

// reportEvery reports progress every period until n reports are made, and
// returns the time of the last.
func reportEvery(p *runner.Progress, period time.Duration, n int) time.Time {
	tick := time.NewTicker(period)
	defer tick.Stop()
	var last time.Time
	for i := 0; i < n; i++ {
		last = time.Now()
		p.Report(last)
		<-tick.C
	}
	return last
}

// TestProgressTimeoutStopsChild: a real child whose reports cease gets the
// kill signal within --progress-timeout + 100 ms of its last report (and
// not before the timeout), Run returns a *StalledError, the lock's history
// records the term as stalled, and the lock is free at once.
func TestProgressTimeoutStopsChild(t *testing.T) {
	dir := t.TempDir()
	events := filepath.Join(dir, "events")
	b := local.Open(dir)
	cfg := baseConfig(t, b, events)
	cfg.ProgressTimeout, cfg.Progress = time.Second, runner.NewProgress()
	done := make(chan error, 1)
	go func() {
		_, err := run(context.Background(), cfg)
		done <- err
	}()
	recorded(t, events, "start")
	last := reportEvery(cfg.Progress, 200*time.Millisecond, 5)
	signalled := recorded(t, events, "signalled")
	gap := signalled.Sub(last)
	t.Logf("child signalled %v after its last report (--progress-timeout %v)", gap, cfg.ProgressTimeout)
	if gap < cfg.ProgressTimeout || gap > cfg.ProgressTimeout+100*time.Millisecond {
		t.Errorf("signalled %v after the last report, want within [%v, %v]", gap, cfg.ProgressTimeout, cfg.ProgressTimeout+100*time.Millisecond)
	}
	err := <-done
	var st *runner.StalledError
	if !errors.As(err, &st) || !st.Reported {
		t.Fatalf("Run returned %v, want a *StalledError after reports", err)
	}
	terms, herr := backends.ReadHistory(context.Background(), b, cfg.Lock, 1)
	if herr != nil || len(terms) != 1 || terms[0].End != backends.EndStalled || !strings.Contains(terms[0].Reason, "--progress-timeout 1s") {
		t.Errorf("history %+v (%v), want one stalled term with the reason", terms, herr)
	}
	next, err := backends.Campaign(context.Background(), local.Open(dir), cfg.Lock,
		backends.Candidate{Identity: "next", Try: true, Timings: cfg.Timings})
	if err != nil {
		t.Fatalf("the lock is not free after the stall: %v", err)
	}
	_ = next.Release(context.Background(), nil)
}

// TestProgressKeepsChild: a child that keeps reporting is never stopped
// for want of progress, however long it runs; cancelling still stops it as
// SIGTERM does.
func TestProgressKeepsChild(t *testing.T) {
	dir := t.TempDir()
	events := filepath.Join(dir, "events")
	cfg := baseConfig(t, local.Open(dir), events)
	cfg.ProgressTimeout, cfg.Progress = time.Second, runner.NewProgress()
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() {
		_, err := run(ctx, cfg)
		done <- err
	}()
	recorded(t, events, "start")
	reportEvery(cfg.Progress, 300*time.Millisecond, 12)
	select {
	case err := <-done:
		t.Fatalf("Run returned %v while the child kept reporting", err)
	default:
	}
	cancelled := time.Now()
	cancel()
	if signalled := recorded(t, events, "signalled"); signalled.Before(cancelled) {
		t.Errorf("child signalled %v before the cancel, while it kept reporting", cancelled.Sub(signalled))
	}
	if err := <-done; err != nil {
		t.Errorf("Run returned %v after the cancel, want nil", err)
	}
}
