// Package backendtest is the conformance suite that every backend passes:
// mutual exclusion, monotonic tokens, loss detection, release, try, wait and
// cancellation, completion markers and history, and the slots of a pool
// (--holders). Each backend's tests call Run against a real store.
package backendtest

import (
	"context"
	"errors"
	"fmt"
	"slices"
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
	// SlotGrants is the number of grants per slot in the test of a pool's
	// slots (three slots, two candidates each). Zero: 10.
	SlotGrants int
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
	if h.SlotGrants == 0 {
		h.SlotGrants = 10
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
	t.Run("Holders", func(t *testing.T) { testHolders(t, h) })
	t.Run("SlotsAreLocks", func(t *testing.T) { testSlotsAreLocks(t, h) })
	t.Run("SlotTokens", func(t *testing.T) { testSlotTokens(t, h) })
	t.Run("MarkersOfSlots", func(t *testing.T) { testMarkersOfSlots(t, h) })
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
	var bs []backends.Backend
	for range 5 {
		bs = append(bs, newBackend(t, h, lock))
	}
	ctx, cancel := context.WithTimeout(context.Background(), 120*time.Second)
	defer cancel()
	tokens := contend(ctx, t, bs, h.Handovers, 0)
	if len(tokens) < h.Handovers {
		t.Fatalf("only %d grants, want %d", len(tokens), h.Handovers)
	}
	increasing(t, "grant", tokens)
}

// contend runs one candidate on each of bs, all backends for the same
// lock, campaigning with holders as CampaignOptions.Holders, until grants
// grants were made between them. It reports to the test any moment when
// two held the lock at once, and returns the tokens in the order they
// were granted.
func contend(ctx context.Context, t *testing.T, bs []backends.Backend, grants, holders int) []uint64 {
	var (
		held   atomic.Int32
		mu     sync.Mutex
		tokens []uint64
		n      atomic.Int32
		wg     sync.WaitGroup
	)
	for i, b := range bs {
		wg.Go(func() {
			id := fmt.Sprintf("candidate-%d", i)
			opts := Options(id)
			opts.Holders = holders
			for n.Load() < int32(grants) {
				l, err := b.Campaign(ctx, opts)
				if err != nil {
					t.Errorf("%s: campaign: %v", id, err)
					return
				}
				if k := held.Add(1); k != 1 {
					t.Errorf("%s: %d holders at once (token %d)", id, k, l.Token())
				}
				mu.Lock()
				tokens = append(tokens, l.Token())
				mu.Unlock()
				n.Add(1)
				// Hold long enough for the others to be queued on it.
				time.Sleep(2 * time.Millisecond)
				held.Add(-1)
				rctx, rcancel := context.WithTimeout(context.Background(), 5*time.Second)
				err = l.Release(rctx, nil)
				rcancel()
				if err != nil {
					t.Errorf("%s: release: %v", id, err)
					return
				}
			}
		})
	}
	wg.Wait()
	return tokens
}

// increasing fails the test unless every token is greater than the one
// before it.
func increasing(t *testing.T, what string, tokens []uint64) {
	t.Helper()
	for i := 1; i < len(tokens); i++ {
		if tokens[i] <= tokens[i-1] {
			t.Fatalf("%s %d has token %d, not greater than the previous one's %d (all: %v)", what, i, tokens[i], tokens[i-1], tokens)
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
	if m, err := a.Completed(ctx, "period-1"); err != nil || m != nil {
		t.Fatalf("marker of a key never completed: %+v, %v; want nil, nil", m, err)
	}
	want, err := complete(ctx, la, "period-1", "a", time.Hour)
	if err != nil {
		t.Fatalf("complete while holding the lock: %v", err)
	}
	Release(t, la)
	lb := Campaign(t, b, "b")
	defer Release(t, lb)
	got, err := b.Completed(ctx, "period-1")
	if err != nil || got == nil {
		t.Fatalf("next leader reads the marker: %+v, %v", got, err)
	}
	if got.Key != want.Key || got.Identity != "a" || got.Token != la.Token() ||
		absDiff(got.At, want.At) > time.Millisecond || absDiff(got.Expires, want.Expires) > time.Second {
		t.Errorf("marker read back as %+v, want %+v", *got, want)
	}
	if m, err := b.Completed(ctx, "period-2"); err != nil || m != nil {
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
	if m, err := b.Completed(ctx, "fenced"); err != nil || m != nil {
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
	if m, err := a.Completed(ctx, "short"); err != nil || m == nil {
		t.Fatalf("marker right after writing it: %+v, %v", m, err)
	}
	WaitFor(t, "the marker to expire", func() bool {
		m, err := a.Completed(ctx, "short")
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

// slot is slot i of b, closed when the test ends (before b, which was
// made first) unless it is b itself.
func slot(t *testing.T, b backends.Backend, i int) backends.Backend {
	s := b.Slot(i)
	if i != 0 {
		t.Cleanup(func() { s.Close() })
	}
	return s
}

// campaignIn campaigns as id in a pool of holders, and fails the test if
// that does not succeed within 30 s. With try, it does not wait.
func campaignIn(t *testing.T, b backends.Backend, id string, holders int, try bool) backends.Lease {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	opts := Options(id)
	opts.Holders, opts.Try = holders, try
	l, err := b.Campaign(ctx, opts)
	if err != nil {
		t.Fatalf("%s: campaign: %v", id, err)
	}
	return l
}

// testHolders: the pool size a holder campaigned with is in its record,
// where Status reads it from any backend of the lock; a holder that named
// none (or 1) reads as 0 or 1, whatever the grant before it recorded.
func testHolders(t *testing.T, h Harness) {
	lock := lockName(t)
	a, b := newBackend(t, h, lock), newBackend(t, h, lock)
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	for _, tc := range []struct {
		name          string
		slot, holders int
		want          []int
	}{
		{"pool of 3, slot 0", 0, 3, []int{3}},
		{"none named after a pool", 0, 0, []int{0, 1}},
		{"pool of 3, slot 2", 2, 3, []int{3}},
		{"one holder after a pool", 2, 1, []int{0, 1}},
		{"pool of 7", 0, 7, []int{7}},
	} {
		l := campaignIn(t, slot(t, a, tc.slot), "holder", tc.holders, false)
		st, err := slot(t, b, tc.slot).Status(ctx)
		Release(t, l)
		switch {
		case err != nil:
			t.Errorf("%s: status: %v", tc.name, err)
		case !st.Held || st.Token != l.Token():
			t.Errorf("%s: status = %+v, want held with token %d", tc.name, st, l.Token())
		case !slices.Contains(tc.want, st.Holders):
			t.Errorf("%s: status reports %d holders, want one of %v", tc.name, st.Holders, tc.want)
		}
	}
}

// testSlotsAreLocks: the slots of one lock are locks of their own: two
// can be held at once, a held slot is refused to --try while another is
// free, Status of each names its own holder, releasing one frees only it,
// and a slot backend's Close leaves the backend it came from usable.
func testSlotsAreLocks(t *testing.T, h Harness) {
	lock := lockName(t)
	a, b := newBackend(t, h, lock), newBackend(t, h, lock)
	if a.Slot(0) != a {
		t.Errorf("Slot(0) is not the backend itself")
	}
	a1, b1, b2 := slot(t, a, 1), slot(t, b, 1), slot(t, b, 2)
	l0 := campaignIn(t, a, "a0", 3, true)
	l1 := campaignIn(t, a1, "a1", 3, true)
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	try := Options("b1")
	try.Holders, try.Try = 3, true
	if l, err := b1.Campaign(ctx, try); !errors.Is(err, backends.ErrLocked) {
		if l != nil {
			Release(t, l)
		}
		t.Fatalf("try on slot 1 while it is held: got %v, want ErrLocked", err)
	}
	l2 := campaignIn(t, b2, "b2", 3, true)
	for i, want := range []backends.Lease{l0, l1, l2} {
		st, err := slot(t, b, i).Status(ctx)
		if err != nil {
			t.Fatalf("status of slot %d: %v", i, err)
		}
		if id := []string{"a0", "a1", "b2"}[i]; !st.Held || st.Identity != id || st.Token != want.Token() {
			t.Errorf("status of slot %d = %+v, want held by %s with token %d", i, st, id, want.Token())
		}
	}
	Release(t, l1)
	l1b := campaignIn(t, b1, "b1", 3, true)
	if l1b.Token() <= l1.Token() {
		t.Errorf("slot 1's next token %d is not greater than its last %d", l1b.Token(), l1.Token())
	}
	if st, err := a.Status(ctx); err != nil || !st.Held || st.Identity != "a0" {
		t.Errorf("slot 0 after slot 1 changed hands: %+v, %v; want still held by a0", st, err)
	}
	Release(t, l2)
	if err := b2.Close(); err != nil {
		t.Errorf("close slot 2's backend: %v", err)
	}
	if st, err := b.Status(ctx); err != nil || !st.Held || st.Identity != "a0" {
		t.Errorf("status through a backend whose slot 2 was closed: %+v, %v", st, err)
	}
	if err := l0.Renew(ctx); err != nil {
		t.Errorf("renew slot 0: %v", err)
	}
	Release(t, l0)
	Release(t, l1b)
	l := campaignIn(t, b, "b0", 3, true)
	if l.Token() <= l0.Token() {
		t.Errorf("slot 0's next token %d is not greater than its last %d", l.Token(), l0.Token())
	}
	Release(t, l)
}

// testSlotTokens: three slots of one lock, two candidates on each (every
// candidate a backend of its own), all at once, until SlotGrants grants
// per slot: no slot ever has two holders, and each slot's tokens strictly
// increase.
func testSlotTokens(t *testing.T, h Harness) {
	lock := lockName(t)
	const slots, candidates = 3, 2
	ctx, cancel := context.WithTimeout(context.Background(), 300*time.Second)
	defer cancel()
	tokens := make([][]uint64, slots)
	var wg sync.WaitGroup
	for i := range slots {
		var bs []backends.Backend
		for range candidates {
			bs = append(bs, slot(t, newBackend(t, h, lock), i))
		}
		wg.Go(func() { tokens[i] = contend(ctx, t, bs, h.SlotGrants, slots) })
	}
	wg.Wait()
	for i, ts := range tokens {
		if len(ts) < h.SlotGrants {
			t.Fatalf("slot %d: only %d grants, want %d", i, len(ts), h.SlotGrants)
		}
		increasing(t, fmt.Sprintf("slot %d: grant", i), ts)
	}
	t.Logf("%d grants per slot, tokens strictly increasing in each of %d slots", h.SlotGrants, slots)
}

// testMarkersOfSlots: Backend.Completed reads, without a lease, the
// markers that the leases of its lock wrote, and only those: a marker
// written through slot 1 is read through another backend's Slot(1), and
// is not slot 0's.
func testMarkersOfSlots(t *testing.T, h Harness) {
	lock := lockName(t)
	a, b := newBackend(t, h, lock), newBackend(t, h, lock)
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	la := Campaign(t, a, "a")
	if m, err := b.Completed(ctx, "k0"); err != nil || m != nil {
		t.Fatalf("marker of a key never completed: %+v, %v; want nil, nil", m, err)
	}
	want, err := complete(ctx, la, "k0", "a", time.Hour)
	if err != nil {
		t.Fatalf("complete: %v", err)
	}
	// While a holds the lock, and once nobody does.
	for _, when := range []string{"held", "released"} {
		if when == "released" {
			Release(t, la)
		}
		if m, err := b.Completed(ctx, "k0"); err != nil || m == nil || m.Token != want.Token || m.Identity != "a" {
			t.Errorf("%s: another backend reads the marker as %+v, %v; want %+v", when, m, err, want)
		}
	}
	l1 := campaignIn(t, slot(t, a, 1), "a1", 2, false)
	want1, err := complete(ctx, l1, "k1", "a1", time.Hour)
	if err != nil {
		t.Fatalf("complete through slot 1: %v", err)
	}
	Release(t, l1)
	b1 := slot(t, b, 1)
	if m, err := b1.Completed(ctx, "k1"); err != nil || m == nil || m.Token != want1.Token || m.Identity != "a1" {
		t.Errorf("another backend's Slot(1) reads slot 1's marker as %+v, %v; want %+v", m, err, want1)
	}
	if m, err := b.Completed(ctx, "k1"); err != nil || m != nil {
		t.Errorf("slot 0 reads slot 1's marker: %+v, %v; want nil, nil", m, err)
	}
	if m, err := b1.Completed(ctx, "k0"); err != nil || m != nil {
		t.Errorf("slot 1 reads slot 0's marker: %+v, %v; want nil, nil", m, err)
	}
}
