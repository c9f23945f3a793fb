//go:build !linux

package local

import (
	"context"
	"io"
	"os"
	"strconv"
	"syscall"
	"time"
)

var errEOF = io.EOF

// pollInterval is how often waiters retry the lock where there is no
// inotify. The local backend is for development off Linux; production hosts
// run Linux.
const pollInterval = 100 * time.Millisecond

type watcher struct{}

func newWatcher(string) (*watcher, error) { return &watcher{}, nil }

func (w *watcher) wait(ctx context.Context) error {
	t := time.NewTimer(pollInterval)
	defer t.Stop()
	select {
	case <-ctx.Done():
		return ctx.Err()
	case <-t.C:
		return nil
	}
}

func (w *watcher) close() {}

// watchLoss has no fast path here; Renew detects a removed lock file.
func (l *lease) watchLoss() error { return nil }

// isHeld trusts the holder record while its pid is alive.
func isHeld(_ *os.File, info map[string]string) (bool, error) {
	pid, err := strconv.Atoi(info["pid"])
	if err != nil || pid <= 0 {
		return false, nil
	}
	err = syscall.Kill(pid, 0)
	return err == nil || err == syscall.EPERM, nil
}

func countWaiters(*dir, string) int { return -1 }
