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
	// LeaseDuration is asked of the store in every campaign. Zero: 10 s
	// (Consul's smallest session TTL).
	LeaseDuration time.Duration
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
	if h.LeaseDuration == 0 {
		h.LeaseDuration = 10 * time.Second
	}
	leaseDuration = h.LeaseDuration
	t.Run("MutualExclusionAndMonotonicTokens", func(t *testing.T) { testExclusion(t, h) })
	t.Run("Try", func(t *testing.T) { testTry(t, h) })
	t.Run("WaitTimesOutAndWithdraws", func(t *testing.T) { testWaitWithdraws(t, h) })
	t.Run("ReleaseWakesWaiter", func(t *testing.T) { testReleaseWakes(t, h) })
	t.Run("LossDetected", func(t *testing.T) { testLoss(t, h) })
	t.Run("Status", func(t *testing.T) { testStatus(t, h) })
	t.Run("CompletionMarker", func(t *testing.T) { testCompletion(t, h) })
	t.Run("CompleteIsFenced", func(t *testing.T) { testCompleteFenced(t, h) })
	t.Run("MarkerExpires", func(t *testing.T) { testMarkerExpires(t, h) })
	t.Run("History", func(t *testing.T) { testHistory(t, h) })
	t.Run("HistoryIsBounded", func(t *testing.T) { testHistoryBounded(t, h) })
}

// leaseDuration is Harness.LeaseDuration for the helpers below; Run sets it
// before any test starts.
var leaseDuration = 10 * time.Second

// Options are the campaign options the suite uses for id.
func Options(id string) backends.CampaignOptions {
	return backends.CampaignOptions{Identity: id, LeaseDuration: leaseDuration}
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
	l, err := b.Campaign(ctx, Options(id))
	if err != nil {
		t.Fatalf("%s: campaign: %v", id, err)
	}
	return l
}

// Release releases l, recording no term, and reports an error to the test.
func Release(t *testing.T, l backends.Lease) { ReleaseTerm(t, l, nil) }

// ReleaseTerm releases l, recording term, and reports an error to the test.
func ReleaseTerm(t *testing.T, l backends.Lease, term *backends.Term) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	if err := l.Release(ctx, term); err != nil {
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
				l, err := b.Campaign(ctx, Options(id))
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
				err = l.Release(rctx, nil)
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
	try := Options("b")
	try.Try = true
	lb, err := b.Campaign(ctx, try)
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
	lb, err = b.Campaign(ctx, try)
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
	lb, err := b.Campaign(ctx, Options("b"))
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
	try := Options("c")
	try.Try = true
	lc, err := c.Campaign(tctx, try)
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
		l, err := b.Campaign(context.Background(), Options("b"))
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
	// its lease must still be alive and renewable (the runner renews a
	// lease whose Acquired is old before it starts the child).
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
		if lb.Acquired().After(time.Now()) {
			t.Errorf("waiter's Acquired() %v is in the future", lb.Acquired())
		}
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		defer cancel()
		if err := lb.Renew(ctx); err != nil {
			t.Errorf("the waiter's new lease cannot be renewed: %v", err)
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

// complete writes a marker for key with lease l, expiring after keep.
func complete(ctx context.Context, l backends.Lease, key, id string, keep time.Duration) (backends.Marker, error) {
	now := time.Now()
	m := backends.Marker{Key: key, Identity: id, Token: l.Token(), At: now, Expires: now.Add(keep)}
	return m, l.Complete(ctx, m)
}

// testCompletion: a marker written by one leader is read back by the next
// one, for its key only.
func testCompletion(t *testing.T, h Harness) {
	lock := lockName(t)
	a, b := newBackend(t, h, lock), newBackend(t, h, lock)
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	la := Campaign(t, a, "a")
	if m, err := la.Completed(ctx, "period-1"); err != nil || m != nil {
		t.Fatalf("marker of a key never completed: %+v, %v; want nil, nil", m, err)
	}
	want, err := complete(ctx, la, "period-1", "a", time.Hour)
	if err != nil {
		t.Fatalf("complete while holding the lock: %v", err)
	}
	Release(t, la)
	lb := Campaign(t, b, "b")
	defer Release(t, lb)
	got, err := lb.Completed(ctx, "period-1")
	if err != nil || got == nil {
		t.Fatalf("next leader reads the marker: %+v, %v", got, err)
	}
	if got.Key != want.Key || got.Identity != "a" || got.Token != la.Token() ||
		absDiff(got.At, want.At) > time.Millisecond || absDiff(got.Expires, want.Expires) > time.Second {
		t.Errorf("marker read back as %+v, want %+v", *got, want)
	}
	if m, err := lb.Completed(ctx, "period-2"); err != nil || m != nil {
		t.Errorf("marker of another key: %+v, %v; want nil, nil", m, err)
	}
}

// testCompleteFenced: once the store has ended the lease, Complete writes
// nothing, even before the holder has noticed the loss: the store checks
// the lease, not the holder's belief.
func testCompleteFenced(t *testing.T, h Harness) {
	lock := lockName(t)
	a, b := newBackend(t, h, lock), newBackend(t, h, lock)
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	la := Campaign(t, a, "a")
	h.Drop(t, la)
	if _, err := complete(ctx, la, "fenced", "a", time.Hour); !errors.Is(err, backends.ErrLeaseLost) {
		t.Errorf("complete after the store dropped the lease: %v, want ErrLeaseLost", err)
	}
	Release(t, la)
	lb := Campaign(t, b, "b")
	defer Release(t, lb)
	if m, err := lb.Completed(ctx, "fenced"); err != nil || m != nil {
		t.Errorf("a fenced-out marker was written: %+v, %v", m, err)
	}
}

// testMarkerExpires: a marker is gone once it expired.
func testMarkerExpires(t *testing.T, h Harness) {
	lock := lockName(t)
	a := newBackend(t, h, lock)
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	la := Campaign(t, a, "a")
	defer Release(t, la)
	if _, err := complete(ctx, la, "short", "a", 1500*time.Millisecond); err != nil {
		t.Fatalf("complete: %v", err)
	}
	if m, err := la.Completed(ctx, "short"); err != nil || m == nil {
		t.Fatalf("marker right after writing it: %+v, %v", m, err)
	}
	WaitFor(t, "the marker to expire", func() bool {
		m, err := la.Completed(ctx, "short")
		return err == nil && m == nil
	})
}

// testHistory: every release appends its term; History lists them newest
// first, as they were written, even for a lease that was lost.
func testHistory(t *testing.T, h Harness) {
	lock := lockName(t)
	a := newBackend(t, h, lock)
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	if terms, err := a.History(ctx, 0); err != nil || len(terms) != 0 {
		t.Fatalf("history of a lock never held: %+v, %v; want none", terms, err)
	}
	var want []backends.Term
	ends := []backends.Term{
		{End: backends.EndExited, ExitCode: 0, OnceKey: "k1"},
		{End: backends.EndExited, ExitCode: 3},
		{End: backends.EndStopped, ExitCode: 143, Signal: "SIGTERM"},
		{End: backends.EndLost, ExitCode: 137, Reason: "lease revoked"},
	}
	for i, end := range ends {
		l := Campaign(t, a, fmt.Sprintf("h%d", i))
		term := end
		term.Identity = fmt.Sprintf("h%d", i)
		term.Token = l.Token()
		term.Acquired = time.Now().Add(-time.Second)
		term.Started = time.Now().Add(-900 * time.Millisecond)
		term.Ended = time.Now()
		if end.End == backends.EndLost {
			h.Drop(t, l)
			select {
			case <-l.Lost():
			case <-time.After(5 * time.Second):
				t.Fatal("loss not reported")
			}
		}
		ReleaseTerm(t, l, &term)
		want = append([]backends.Term{term}, want...)
	}
	got, err := a.History(ctx, 0)
	if err != nil {
		t.Fatalf("history: %v", err)
	}
	if len(got) != len(want) {
		t.Fatalf("history has %d terms, want %d: %+v", len(got), len(want), got)
	}
	for i := range want {
		g, w := got[i], want[i]
		if g.Identity != w.Identity || g.Token != w.Token || g.End != w.End || g.ExitCode != w.ExitCode ||
			g.Signal != w.Signal || g.Reason != w.Reason || g.OnceKey != w.OnceKey ||
			absDiff(g.Acquired, w.Acquired) > time.Millisecond || absDiff(g.Started, w.Started) > time.Millisecond ||
			absDiff(g.Ended, w.Ended) > time.Millisecond {
			t.Errorf("term %d read back as %+v, want %+v", i, g, w)
		}
	}
	if got, err := a.History(ctx, 2); err != nil || len(got) != 2 || got[0].Token != want[0].Token {
		t.Errorf("history limited to 2: %+v, %v", got, err)
	}
	// A release without a term records nothing.
	l := Campaign(t, a, "quiet")
	Release(t, l)
	if got, err := a.History(ctx, 0); err != nil || len(got) != len(want) {
		t.Errorf("a release without a term changed the history: %d terms, %v", len(got), err)
	}
}

// testHistoryBounded: the store keeps about HistoryLimit terms per lock,
// the newest ones.
func testHistoryBounded(t *testing.T, h Harness) {
	lock := lockName(t)
	a := newBackend(t, h, lock)
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	n := backends.HistoryLimit + 5
	var last uint64
	for i := range n {
		l := Campaign(t, a, "b")
		now := time.Now()
		ReleaseTerm(t, l, &backends.Term{Identity: fmt.Sprintf("b%d", i), Token: l.Token(), Acquired: now, Ended: now,
			End: backends.EndExited, ExitCode: -1})
		last = l.Token()
	}
	got, err := a.History(ctx, 0)
	if err != nil {
		t.Fatalf("history: %v", err)
	}
	if len(got) != backends.HistoryLimit || got[0].Token != last || got[0].Identity != fmt.Sprintf("b%d", n-1) {
		t.Fatalf("after %d terms, history has %d, newest %+v; want %d ending with token %d",
			n, len(got), got[0], backends.HistoryLimit, last)
	}
	for i := 1; i < len(got); i++ {
		if got[i].Token >= got[i-1].Token {
			t.Fatalf("history not newest first at %d: %d after %d", i, got[i].Token, got[i-1].Token)
		}
	}
}

func absDiff(a, b time.Time) time.Duration {
	if d := a.Sub(b); d >= 0 {
		return d
	}
	return b.Sub(a)
}
