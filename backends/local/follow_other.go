//go:build !linux

package local

import (
	"context"
	"os"
	"syscall"

	"github.com/leaderrun/leaderrun/backends"
)

// Follow: without inotify, waiters look again every retry period and
// holders rely on their renewals.
func (l *lock) Follow(context.Context, backends.Claim, *backends.Record) (backends.Follower, error) {
	return nil, nil
}

// isHeld trusts the holder record while its pid is alive.
func isHeld(_ *os.File, pid int) (bool, error) {
	if pid <= 0 {
		return false, nil
	}
	err := syscall.Kill(pid, 0)
	return err == nil || err == syscall.EPERM, nil
}

func countWaiters(*dir, string) int { return -1 }
