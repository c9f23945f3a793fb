package cmd

import (
	"context"
	"errors"
	"fmt"
	"syscall"
	"testing"

	"github.com/leaderrun/leaderrun/backends"
	"github.com/leaderrun/leaderrun/runner"
	"github.com/leaderrun/leaderrun/signals"
)

// TestExitCode pins the one error → exit code table that the README lists.
func TestExitCode(t *testing.T) {
	cases := []struct {
		name string
		err  error
		want int
	}{
		{name: "success", err: nil, want: 0},
		{name: "usage", err: usageErrorf("--lock is required"), want: 64},
		{name: "timing configuration", err: runner.ValidateTimings(1, 2, 1, 1), want: 64},
		{name: "store unreachable", err: fmt.Errorf("etcd http://127.0.0.1:1: %w", backends.ErrUnavailable), want: 69},
		{name: "not acquired", err: fmt.Errorf("%w: held", runner.ErrNotAcquired), want: 75},
		{name: "leadership lost", err: &runner.LostError{Reason: backends.ErrLeaseLost}, want: 76},
		{name: "lost wins over unavailable", err: &runner.LostError{Reason: fmt.Errorf("renew: %w", backends.ErrUnavailable)}, want: 76},
		{name: "not executable", err: fmt.Errorf("x: %w", signals.ErrNotExecutable), want: 126},
		{name: "not found", err: fmt.Errorf("x: %w", signals.ErrNotFound), want: 127},
		{name: "interrupted by SIGTERM while waiting", err: &runner.InterruptedError{Signal: syscall.SIGTERM}, want: 143},
		{name: "no leader", err: errNoLeader, want: 3},
		{name: "anything else", err: errors.New("boom"), want: 70},
		{name: "cancelled context is not a conflict", err: context.DeadlineExceeded, want: 70},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			if got := exitCode(tc.err, ExitConflict); got != tc.want {
				t.Errorf("exitCode(%v) = %d, want %d", tc.err, got, tc.want)
			}
		})
	}
	if got := exitCode(runner.ErrNotAcquired, 0); got != 0 {
		t.Errorf("--conflict-exit-code 0: got %d", got)
	}
}
