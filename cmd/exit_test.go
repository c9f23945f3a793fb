package cmd

import (
	"context"
	"errors"
	"fmt"
	"syscall"
	"testing"

	"github.com/leaderrun/leaderrun/backends"
	"github.com/leaderrun/leaderrun/command"
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
		{name: "configuration the runner refuses", err: configError(t), want: 64},
		{name: "store unreachable", err: fmt.Errorf("etcd http://127.0.0.1:1: %w", backends.ErrUnavailable), want: 69},
		{name: "companion missing", err: &companionError{store: "DynamoDB", name: "leaderrun-aws", err: errors.New("not installed")}, want: 69},
		{name: "not acquired", err: fmt.Errorf("%w: held", runner.ErrNotAcquired), want: 75},
		{name: "leadership lost", err: &runner.LostError{Reason: backends.ErrLeaseLost}, want: 76},
		{name: "lost wins over unavailable", err: &runner.LostError{Reason: fmt.Errorf("renew: %w", backends.ErrUnavailable)}, want: 76},
		{name: "not executable", err: fmt.Errorf("x: %w", command.ErrNotExecutable), want: 126},
		{name: "not found", err: fmt.Errorf("x: %w", command.ErrNotFound), want: 127},
		{name: "interrupted by SIGTERM while waiting", err: &runner.InterruptedError{Signal: syscall.SIGTERM}, want: 143},
		{name: "no leader", err: errNoLeader, want: 3},
		{name: "not leader (check)", err: errNotLeader, want: 1},
		{name: "child exited 0", err: &childExit{status: signals.Status{Code: 0}}, want: 0},
		{name: "child exited 3", err: &childExit{status: signals.Status{Code: 3}}, want: 3},
		{name: "child killed by SIGKILL", err: &childExit{status: signals.Status{Signal: syscall.SIGKILL}}, want: 137},
		{name: "already completed", err: &runner.DoneError{}, want: 0},
		{name: "corrupt token file", err: fmt.Errorf("local: token file /x: %w", backends.ErrCorruptState), want: 65},
		{name: "unsafe state directory", err: fmt.Errorf("local: /tmp/x: %w", backends.ErrUnsafeState), want: 64},
		{name: "anything else", err: errors.New("boom"), want: 70},
		{name: "cancelled context is not a conflict", err: context.DeadlineExceeded, want: 70},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			if got := exitCode(tc.err, defaultCodes); got != tc.want {
				t.Errorf("exitCode(%v) = %d, want %d", tc.err, got, tc.want)
			}
		})
	}
	if got := exitCode(runner.ErrNotAcquired, codes{conflict: 0}); got != 0 {
		t.Errorf("--conflict-exit-code 0: got %d", got)
	}
	if got := exitCode(&runner.DoneError{}, codes{conflict: 75, done: 9}); got != 9 {
		t.Errorf("--done-exit-code 9: got %d", got)
	}
}

// configError is what runner.New says of a configuration it refuses.
func configError(t *testing.T) error {
	_, err := runner.New(runner.Config{})
	if !errors.As(err, new(*runner.ConfigError)) {
		t.Fatalf("runner.New of an empty configuration: %v, want a *runner.ConfigError", err)
	}
	return err
}
