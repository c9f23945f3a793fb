package local_test

import (
	"context"
	"errors"
	"os"
	"path/filepath"
	"testing"
	"time"

	"github.com/leaderrun/leaderrun/backends"
	"github.com/leaderrun/leaderrun/backends/local"
)

// reviewDir is a state directory for the review's tests: under
// $LEADERRUN_REVIEW_DIR if set (a btrfs mount, where stat's st_dev is the
// subvolume's and /proc/locks prints the superblock's), else a temporary
// directory.
func reviewDir(t *testing.T) string {
	base := os.Getenv("LEADERRUN_REVIEW_DIR")
	if base == "" {
		return t.TempDir()
	}
	dir, err := os.MkdirTemp(base, "review-")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { os.RemoveAll(dir) })
	return filepath.Join(dir, "state")
}

// TestReviewWaiterWithdrawsOnCancel: a waiter for a held lock is
// cancelled (a signal while waiting, S6) and must withdraw at once. On
// btrfs the local store's Get reads the held lock as free (isHeld matches
// fstat's st_dev against /proc/locks, which print different devices
// there), Take answers ErrConflict, and record.go's step goes from Take
// back to Get without a pause and without looking at ctx (Get and Take of
// the local store ignore it): the waiter spins on a core and never
// returns, whatever signal it gets.
//
// On ext4 it passes. To see it fail (as root, btrfs-progs installed):
//
//	truncate -s 300M /tmp/b.img && mkfs.btrfs -q /tmp/b.img && mkdir -p /mnt/b && mount -o loop /tmp/b.img /mnt/b
//	LEADERRUN_REVIEW_DIR=/mnt/b go test -race -run TestReview ./backends/local/
//
// There stat gives st_dev 00:29 (the subvolume's anonymous device) and
// /proc/locks 00:28 (the superblock's, as /proc/self/mountinfo shows it):
// the held lock reads as free (status says no leader), the waiter spins,
// and the holder's own follower reads its record as "ran out by the
// store's clock" (Left 0): a second candidate costs the holder its lease.
func TestWaiterWithdrawsOnCancel(t *testing.T) {
	dir := reviewDir(t)
	s := local.Open(dir)
	defer s.Close()
	cand := func(id string) backends.Candidate {
		return backends.Candidate{Identity: id, Timings: backends.DefaultTimings}
	}
	holder, err := backends.Campaign(context.Background(), s, "held", cand("holder"))
	if err != nil {
		t.Fatal(err)
	}
	defer holder.Release(context.Background(), nil)

	st, err := backends.ReadStatus(context.Background(), s, "held")
	if err != nil || !st.Held {
		t.Errorf("status of the held lock: held=%v, err=%v; want held", st.Held, err)
	}

	ctx, cancel := context.WithTimeout(context.Background(), 300*time.Millisecond)
	defer cancel()
	got := make(chan error, 1)
	go func() {
		w := local.Open(dir)
		defer w.Close()
		l, err := backends.Campaign(ctx, w, "held", cand("waiter"))
		if err == nil {
			_ = l.Release(context.Background(), nil)
			err = errors.New("won a lock that another candidate holds")
		}
		got <- err
	}()
	select {
	case err := <-got:
		if !errors.Is(err, context.DeadlineExceeded) {
			t.Fatalf("waiter: %v, want its context's error", err)
		}
	case <-time.After(3 * time.Second):
		t.Error("the waiter was cancelled 300 ms in and had not withdrawn 2.7 s later")
	}
	if err := holder.Err(); err != nil {
		t.Errorf("the holder, which still holds its flock, was told its lease is lost: %v", err)
	}
}
