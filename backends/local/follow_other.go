//go:build !linux

package local

import (
	"context"
	"io"
	"os"
	"syscall"

	"github.com/leaderrun/leaderrun/backends"
)

var errEOF = io.EOF

// Follow implements backends.RecordLock: without inotify, waiters look
// again every retry period and holders rely on their renewals. The local
// store is for development off Linux; production hosts run Linux.
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
