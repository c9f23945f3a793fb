package local_test

import (
	"context"
	"os"
	"path/filepath"
	"syscall"
	"testing"
	"time"

	"github.com/leaderrun/leaderrun/backends"
	"github.com/leaderrun/leaderrun/backends/backendtest"
	"github.com/leaderrun/leaderrun/backends/local"
)

func TestConformance(t *testing.T) {
	dir := t.TempDir()
	backendtest.Run(t, backendtest.Harness{
		Open:       func(t *testing.T) backends.Store { return local.Open(dir) },
		SlotGrants: 200,
		Drop: func(t *testing.T, lock string, l *backends.Lease) {
			// Removing the lock file lets a newcomer lock a new one.
			if err := os.Remove(filepath.Join(dir, lock+".lock")); err != nil {
				t.Fatal(err)
			}
		},
	})
}

// TestWaiterWokenTooEarlyTriesAgain: the kernel reports the close of a
// lock file before it drops the flock that goes with it (a holder that
// died without unlocking). Here the same order, made slow: another open
// file of the lock is closed (waking the waiter) while the holder still
// locks it, and the holder unlocks 5 ms later, which wakes nobody. The
// waiter must still get the lock, not wait for an event that never comes.
func TestWaiterWokenTooEarlyTriesAgain(t *testing.T) {
	dir := t.TempDir()
	s := local.Open(dir)
	defer s.Close()
	cand := func(id string) backends.Candidate {
		return backends.Candidate{Identity: id, Timings: backends.DefaultTimings}
	}
	holder, err := backends.Campaign(context.Background(), s, "early", cand("holder"))
	if err != nil {
		t.Fatal(err)
	}
	got := make(chan error, 1)
	go func() {
		w := local.Open(dir)
		defer w.Close()
		l, err := backends.Campaign(context.Background(), w, "early", cand("waiter"))
		if err == nil {
			err = l.Release(context.Background(), nil)
		}
		got <- err
	}()
	for end := time.Now().Add(10 * time.Second); ; time.Sleep(5 * time.Millisecond) {
		st, err := backends.ReadStatus(context.Background(), s, "early")
		if err == nil && st.Waiting == 1 {
			break
		}
		if time.Now().After(end) {
			t.Fatal("the waiter never queued")
		}
	}
	other, err := os.OpenFile(filepath.Join(dir, "early.lock"), os.O_RDWR, 0)
	if err != nil {
		t.Fatal(err)
	}
	other.Close()                    // the close event, with the lock still held
	time.Sleep(5 * time.Millisecond) // the kernel's window, made long
	lf := holder.LockFile()
	if err := syscall.Flock(int(lf.Fd()), syscall.LOCK_UN); err != nil {
		t.Fatal(err)
	}
	select {
	case err := <-got:
		if err != nil {
			t.Fatal(err)
		}
	case <-time.After(5 * time.Second):
		t.Fatal("the waiter, woken while the lock was still held, never took it once it was free")
	}
	_ = holder.Release(context.Background(), nil)
}
