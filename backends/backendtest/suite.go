// Package backendtest is the conformance suite that every backend passes:
// mutual exclusion, monotonic tokens, loss detection, release, try, wait and
// cancellation. Each backend's tests call Run against a real store.
package backendtest

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/leaderrun/leaderrun/backends"
)

// Harness tells the suite how to reach one store.
type Harness struct {
	// New returns a backend for lock. The suite closes it.
	New func(t *testing.T, lock string) backends.Backend
	// Drop makes the store end the lease behind its holder's back, the way
	// an operator or a failure would (revoke the etcd lease, destroy the
	// Consul session, remove the lock file).
	Drop func(t *testing.T, l backends.Lease)
	// Handovers is the number of grants in the token test. Zero: 50.
	Handovers int
}

var lockSeq atomic.Int64

// lockName is unique per test, so that tests against one store never meet.
func lockName(t *testing.T) string {
	return fmt.Sprintf("conf-%d-%d", time.Now().UnixNano()%1e9, lockSeq.Add(1))
}

// Run runs the whole suite.
func Run(t *testing.T, h Harness) {
	if h.Handovers == 0 {
		h.Handovers = 50
	}
	t.Run("MutualExclusionAndMonotonicTokens", func(t *testing.T) { testExclusion(t, h) })
	t.Run("Try", func(t *testing.T) { testTry(t, h) })
	t.Run("WaitTimesOutAndWithdraws", func(t *testing.T) { testWaitWithdraws(t, h) })
	t.Run("ReleaseWakesWaiter", func(t *testing.T) { testReleaseWakes(t, h) })
	t.Run("LossDetected", func(t *testing.T) { testLoss(t, h) })
	t.Run("Status", func(t *testing.T) { testStatus(t, h) })
}

func newBackend(t *testing.T, h Harness, lock string) backends.Backend {
	b := h.New(t, lock)
	t.Cleanup(func() { b.Close() })
	return b
}

// Campaign campaigns as id and fails the test if that does not succeed
// within 30 s.
func Campaign(t *testing.T, b backends.Backend, id string) backends.Lease {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	l, err := b.Campaign(ctx, backends.CampaignOptions{Identity: id})
	if err != nil {
		t.Fatalf("%s: campaign: %v", id, err)
	}
	return l
}

// Release releases l and reports an error to the test.
func Release(t *testing.T, l backends.Lease) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	if err := l.Release(ctx); err != nil {
		t.Errorf("release token %d: %v", l.Token(), err)
	}
}

// testExclusion runs 5 candidates for the same lock until Handovers grants
// were made, and checks that no two ever held it at once and that every
// grant's token is greater than the one before.
func testExclusion(t *testing.T, h Harness) {
	lock := lockName(t)
	const candidates = 5
	var (
		holders atomic.Int32
		mu      sync.Mutex
		tokens  []uint64
		grants  atomic.Int32
		wg      sync.WaitGroup
		errs    = make(chan error, candidates)
	)
	ctx, cancel := context.WithTimeout(context.Background(), 120*time.Second)
	defer cancel()
	for i := range candidates {
		b := newBackend(t, h, lock)
		wg.Add(1)
		go func() {
			defer wg.Done()
			id := fmt.Sprintf("candidate-%d", i)
			for grants.Load() < int32(h.Handovers) {
				l, err := b.Campaign(ctx, backends.CampaignOptions{Identity: id})
				if err != nil {
					errs <- fmt.Errorf("%s: campaign: %w", id, err)
					return
				}
				if n := holders.Add(1); n != 1 {
					errs <- fmt.Errorf("%s: %d holders at once (token %d)", id, n, l.Token())
				}
				mu.Lock()
				tokens = append(tokens, l.Token())
				mu.Unlock()
				grants.Add(1)
				// Hold long enough for the others to be queued on it.
				time.Sleep(2 * time.Millisecond)
				holders.Add(-1)
				rctx, rcancel := context.WithTimeout(context.Background(), 5*time.Second)
				err = l.Release(rctx)
				rcancel()
				if err != nil {
					errs <- fmt.Errorf("%s: release: %w", id, err)
					return
				}
			}
		}()
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		t.Error(err)
	}
	if len(tokens) < h.Handovers {
		t.Fatalf("only %d grants, want %d", len(tokens), h.Handovers)
	}
	for i := 1; i < len(tokens); i++ {
		if tokens[i] <= tokens[i-1] {
			t.Fatalf("grant %d has token %d, not greater than the previous grant's %d (all: %v)", i, tokens[i], tokens[i-1], tokens)
		}
	}
}

func testTry(t *testing.T, h Harness) {
	lock := lockName(t)
	a, b := newBackend(t, h, lock), newBackend(t, h, lock)
	la := Campaign(t, a, "a")
	start := time.Now()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	lb, err := b.Campaign(ctx, backends.CampaignOptions{Identity: "b", Try: true})
	if !errors.Is(err, backends.ErrLocked) {
		if lb != nil {
			Release(t, lb)
		}
		t.Fatalf("try on a held lock: got %v, want ErrLocked", err)
	}
	if d := time.Since(start); d > time.Second {
		t.Errorf("try on a held lock took %v, want well under 1s", d)
	}
	Release(t, la)
	lb, err = b.Campaign(ctx, backends.CampaignOptions{Identity: "b", Try: true})
	if err != nil {
		t.Fatalf("try on a released lock: %v", err)
	}
	if lb.Token() <= la.Token() {
		t.Errorf("token after try %d, not greater than %d", lb.Token(), la.Token())
	}
	Release(t, lb)
}

// testWaitWithdraws: a waiter whose context ends returns the context's
// error, and leaves nothing behind that could later hold the lock.
func testWaitWithdraws(t *testing.T, h Harness) {
	lock := lockName(t)
	a, b, c := newBackend(t, h, lock), newBackend(t, h, lock), newBackend(t, h, lock)
	la := Campaign(t, a, "a")
	ctx, cancel := context.WithTimeout(context.Background(), 300*time.Millisecond)
	defer cancel()
	start := time.Now()
	lb, err := b.Campaign(ctx, backends.CampaignOptions{Identity: "b"})
	took := time.Since(start)
	if !errors.Is(err, context.DeadlineExceeded) {
		if lb != nil {
			Release(t, lb)
		}
		t.Fatalf("waiting past the deadline: got %v, want context.DeadlineExceeded", err)
	}
	if took < 250*time.Millisecond || took > 2*time.Second {
		t.Errorf("waiter gave up after %v, want about 300ms", took)
	}
	Release(t, la)
	// The withdrawn waiter must not have been queued: c gets the lock at once.
	tctx, tcancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer tcancel()
	lc, err := c.Campaign(tctx, backends.CampaignOptions{Identity: "c", Try: true})
	if err != nil {
		t.Fatalf("after the waiter withdrew and the holder released, try: %v", err)
	}
	Release(t, lc)
}

func testReleaseWakes(t *testing.T, h Harness) {
	lock := lockName(t)
	a, b := newBackend(t, h, lock), newBackend(t, h, lock)
	la := Campaign(t, a, "a")
	got := make(chan backends.Lease, 1)
	go func() {
		l, err := b.Campaign(context.Background(), backends.CampaignOptions{Identity: "b"})
		if err != nil {
			t.Errorf("waiter: %v", err)
		}
		got <- l
	}()
	WaitFor(t, "the waiter to be queued", func() bool {
		st, err := a.Status(context.Background())
		return err == nil && (st.Waiting != 0)
	})
	// Hold on a while, so that the waiter's campaign is old when it wins:
	// its lease's Acquired must still be recent (the runner counts its
	// first deadline from it).
	time.Sleep(500 * time.Millisecond)
	released := time.Now()
	Release(t, la)
	select {
	case lb := <-got:
		if lb == nil {
			return
		}
		if d := time.Since(released); d > time.Second {
			t.Errorf("waiter took %v after release, want well under 1s", d)
		}
		if lb.Token() <= la.Token() {
			t.Errorf("waiter's token %d not greater than %d", lb.Token(), la.Token())
		}
		if age := released.Sub(lb.Acquired()); age > 100*time.Millisecond {
			t.Errorf("waiter's Acquired() is %v before the release that let it win: stale proof of life", age)
		}
		Release(t, lb)
	case <-time.After(10 * time.Second):
		t.Fatal("waiter not granted within 10s of release")
	}
}

func testLoss(t *testing.T, h Harness) {
	lock := lockName(t)
	a := newBackend(t, h, lock)
	la := Campaign(t, a, "a")
	defer Release(t, la)
	if err := la.Err(); err != nil {
		t.Fatalf("fresh lease reports %v", err)
	}
	h.Drop(t, la)
	dropped := time.Now()
	select {
	case <-la.Lost():
		t.Logf("loss reported %v after the drop", time.Since(dropped))
	case <-time.After(time.Second):
		t.Fatal("Lost() not closed within 1s of the store dropping the lease")
	}
	if !errors.Is(la.Err(), backends.ErrLeaseLost) {
		t.Errorf("Err() = %v, want ErrLeaseLost", la.Err())
	}
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	if err := la.Renew(ctx); !errors.Is(err, backends.ErrLeaseLost) {
		t.Errorf("Renew after loss = %v, want ErrLeaseLost", err)
	}
}

func testStatus(t *testing.T, h Harness) {
	lock := lockName(t)
	a := newBackend(t, h, lock)
	ctx := context.Background()
	st, err := a.Status(ctx)
	if err != nil {
		t.Fatalf("status of a free lock: %v", err)
	}
	if st.Held {
		t.Fatalf("free lock reported held: %+v", st)
	}
	la := Campaign(t, a, "holder-1")
	st, err = a.Status(ctx)
	if err != nil {
		t.Fatalf("status: %v", err)
	}
	if !st.Held || st.Identity != "holder-1" || st.Token != la.Token() {
		t.Errorf("status = %+v, want held by holder-1 with token %d", st, la.Token())
	}
	Release(t, la)
	st, err = a.Status(ctx)
	if err != nil {
		t.Fatalf("status: %v", err)
	}
	if st.Held {
		t.Errorf("released lock reported held: %+v", st)
	}
}

// WaitFor polls cond: a condition in another process or store has no
// channel to wait on. It fails the test after 10 s.
func WaitFor(t *testing.T, what string, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(10 * time.Second)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("timed out waiting for %s", what)
		}
		time.Sleep(5 * time.Millisecond)
	}
}
