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
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/leaderrun/leaderrun/backends"
)

// Harness tells the suite how to reach one store.
type Harness struct {
	// Open opens the store: a connection of its own, as a candidate on
	// another host would have. The suite closes it.
	Open func(t *testing.T) backends.Store
	// Drop makes the store end the lease l of lock behind its holder's
	// back, the way an operator or a failure would (revoke the etcd
	// lease, destroy the Consul session, delete the row, remove the lock
	// file).
	Drop func(t *testing.T, lock string, l *backends.Lease)
	// Handovers is the number of grants in the token test. Zero: 50.
	Handovers int
	// Timings are every campaign's. Zero: DefaultTimings.
	Timings backends.Timings
	// SlotGrants is the number of grants per slot in the test of a pool's
	// slots (three slots, two candidates each). Zero: 10.
	SlotGrants int
}

// DefaultTimings are the suite's: a lease of 10 s (Consul's smallest
// session TTL), and a retry period short enough that a store without
// notifications wakes a waiter well within a second.
var DefaultTimings = backends.Timings{LeaseDuration: 10 * time.Second, RenewDeadline: 6 * time.Second,
	RetryPeriod: 300 * time.Millisecond, KillGrace: 3 * time.Second}

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
	if h.Timings == (backends.Timings{}) {
		h.Timings = DefaultTimings
	}
	if h.SlotGrants == 0 {
		h.SlotGrants = 10
	}
	if err := h.Timings.Validate(); err != nil {
		t.Fatalf("harness timings: %v", err)
	}
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
	t.Run("PoolMismatchRefused", func(t *testing.T) { testPoolMismatch(t, h) })
}

// candidate is one candidate of the suite: a store of its own, and the
// lock it campaigns for.
type candidate struct {
	h     Harness
	store backends.Store
	lock  string
}

// open opens a store for a candidate for lock, closed when the test ends.
func open(t *testing.T, h Harness, lock string) *candidate {
	s := h.Open(t)
	t.Cleanup(func() { s.Close() })
	return &candidate{h: h, store: s, lock: lock}
}

// slot is the candidate for slot i of c's lock, through c's store.
func (c *candidate) slot(i int) *candidate {
	return &candidate{h: c.h, store: c.store, lock: backends.SlotLock(c.lock, i)}
}

// campaign campaigns as id, in a pool of holders (0: none) with try.
func (c *candidate) campaign(ctx context.Context, id string, holders int, try bool) (*backends.Lease, error) {
	return backends.Campaign(ctx, c.store, c.lock, backends.Candidate{Identity: id, Timings: c.h.Timings,
		Holders: holders, Try: try})
}

func (c *candidate) status(ctx context.Context) (backends.Status, error) {
	return backends.ReadStatus(ctx, c.store, c.lock)
}

func (c *candidate) history(ctx context.Context, limit int) ([]backends.Term, error) {
	return backends.ReadHistory(ctx, c.store, c.lock, limit)
}

func (c *candidate) completed(ctx context.Context, key string) (*backends.Marker, error) {
	return backends.ReadMarker(ctx, c.store, c.lock, key)
}

// Campaign campaigns as id and fails the test if that does not succeed
// within 30 s.
func (c *candidate) Campaign(t *testing.T, id string) *backends.Lease {
	t.Helper()
	return campaignIn(t, c, id, 0, false)
}

// Release releases l, recording no term, and reports an error to the test.
func Release(t *testing.T, l *backends.Lease) { ReleaseTerm(t, l, nil) }

// ReleaseTerm releases l, recording term, and reports an error to the test.
func ReleaseTerm(t *testing.T, l *backends.Lease, term *backends.Term) {
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
	var cs []*candidate
	for range 5 {
		cs = append(cs, open(t, h, lock))
	}
	ctx, cancel := context.WithTimeout(context.Background(), 120*time.Second)
	defer cancel()
	tokens := contend(ctx, t, cs, h.Handovers, 0)
	if len(tokens) < h.Handovers {
		t.Fatalf("only %d grants, want %d", len(tokens), h.Handovers)
	}
	increasing(t, "grant", tokens)
}

// contend runs the candidates cs, all for the same lock, campaigning in a
// pool of holders (0: none), until grants grants were made between them.
// It reports to the test any moment when two held the lock at once, and
// returns the tokens in the order they were granted.
func contend(ctx context.Context, t *testing.T, cs []*candidate, grants, holders int) []uint64 {
	var (
		held   atomic.Int32
		mu     sync.Mutex
		tokens []uint64
		n      atomic.Int32
		wg     sync.WaitGroup
	)
	for i, c := range cs {
		wg.Go(func() {
			id := fmt.Sprintf("candidate-%d", i)
			for n.Load() < int32(grants) {
				l, err := c.campaign(ctx, id, holders, false)
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
	a, b := open(t, h, lock), open(t, h, lock)
	la := a.Campaign(t, "a")
	start := time.Now()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	lb, err := b.campaign(ctx, "b", 0, true)
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
	lb, err = b.campaign(ctx, "b", 0, true)
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
	a, b, c := open(t, h, lock), open(t, h, lock), open(t, h, lock)
	la := a.Campaign(t, "a")
	ctx, cancel := context.WithTimeout(context.Background(), 300*time.Millisecond)
	defer cancel()
	start := time.Now()
	lb, err := b.campaign(ctx, "b", 0, false)
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
	lc, err := c.campaign(tctx, "c", 0, true)
	if err != nil {
		t.Fatalf("after the waiter withdrew and the holder released, try: %v", err)
	}
	Release(t, lc)
}

func testReleaseWakes(t *testing.T, h Harness) {
	lock := lockName(t)
	a, b := open(t, h, lock), open(t, h, lock)
	la := a.Campaign(t, "a")
	got := make(chan *backends.Lease, 1)
	go func() {
		l, err := b.campaign(context.Background(), "b", 0, false)
		if err != nil {
			t.Errorf("waiter: %v", err)
		}
		got <- l
	}()
	WaitFor(t, "the waiter to be queued", func() bool {
		st, err := a.status(context.Background())
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
	a := open(t, h, lock)
	la := a.Campaign(t, "a")
	defer Release(t, la)
	if err := la.Err(); err != nil {
		t.Fatalf("fresh lease reports %v", err)
	}
	h.Drop(t, lock, la)
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
	a := open(t, h, lock)
	ctx := context.Background()
	st, err := a.status(ctx)
	if err != nil {
		t.Fatalf("status of a free lock: %v", err)
	}
	if st.Held {
		t.Fatalf("free lock reported held: %+v", st)
	}
	la := a.Campaign(t, "holder-1")
	st, err = a.status(ctx)
	if err != nil {
		t.Fatalf("status: %v", err)
	}
	if !st.Held || st.Identity != "holder-1" || st.Token != la.Token() || st.Lock != lock || st.Key == "" {
		t.Errorf("status = %+v, want lock %s held by holder-1 with token %d", st, lock, la.Token())
	}
	Release(t, la)
	st, err = a.status(ctx)
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
func complete(ctx context.Context, l *backends.Lease, key, id string, keep time.Duration) (backends.Marker, error) {
	now := time.Now()
	m := backends.Marker{Key: key, Identity: id, Token: l.Token(), At: now, Expires: now.Add(keep)}
	return m, l.Complete(ctx, m)
}

// testCompletion: a marker written by one leader is read back by the next
// one, for its key only.
func testCompletion(t *testing.T, h Harness) {
	lock := lockName(t)
	a, b := open(t, h, lock), open(t, h, lock)
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	la := a.Campaign(t, "a")
	if m, err := la.Completed(ctx, "period-1", false); err != nil || m != nil {
		t.Fatalf("marker of a key never completed: %+v, %v; want nil, nil", m, err)
	}
	want, err := complete(ctx, la, "period-1", "a", time.Hour)
	if err != nil {
		t.Fatalf("complete while holding the lock: %v", err)
	}
	Release(t, la)
	lb := b.Campaign(t, "b")
	defer Release(t, lb)
	got, err := lb.Completed(ctx, "period-1", false)
	if err != nil || got == nil {
		t.Fatalf("next leader reads the marker: %+v, %v", got, err)
	}
	if got.Key != want.Key || got.Identity != "a" || got.Token != la.Token() ||
		absDiff(got.At, want.At) > time.Millisecond || absDiff(got.Expires, want.Expires) > time.Second {
		t.Errorf("marker read back as %+v, want %+v", *got, want)
	}
	if m, err := lb.Completed(ctx, "period-2", false); err != nil || m != nil {
		t.Errorf("marker of another key: %+v, %v; want nil, nil", m, err)
	}
}

// testCompleteFenced: once the store has ended the lease, Complete writes
// nothing, even before the holder has noticed the loss: the store checks
// the lease, not the holder's belief.
func testCompleteFenced(t *testing.T, h Harness) {
	lock := lockName(t)
	a, b := open(t, h, lock), open(t, h, lock)
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	la := a.Campaign(t, "a")
	h.Drop(t, lock, la)
	if _, err := complete(ctx, la, "fenced", "a", time.Hour); !errors.Is(err, backends.ErrLeaseLost) {
		t.Errorf("complete after the store dropped the lease: %v, want ErrLeaseLost", err)
	}
	Release(t, la)
	lb := b.Campaign(t, "b")
	defer Release(t, lb)
	if m, err := b.completed(ctx, "fenced"); err != nil || m != nil {
		t.Errorf("a fenced-out marker was written: %+v, %v", m, err)
	}
}

// testMarkerExpires: a marker is gone once it expired.
func testMarkerExpires(t *testing.T, h Harness) {
	lock := lockName(t)
	a := open(t, h, lock)
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	la := a.Campaign(t, "a")
	defer Release(t, la)
	if _, err := complete(ctx, la, "short", "a", 1500*time.Millisecond); err != nil {
		t.Fatalf("complete: %v", err)
	}
	if m, err := a.completed(ctx, "short"); err != nil || m == nil {
		t.Fatalf("marker right after writing it: %+v, %v", m, err)
	}
	WaitFor(t, "the marker to expire", func() bool {
		m, err := a.completed(ctx, "short")
		return err == nil && m == nil
	})
}

// testHistory: every release appends its term; History lists them newest
// first, as they were written, even for a lease that was lost.
func testHistory(t *testing.T, h Harness) {
	lock := lockName(t)
	a := open(t, h, lock)
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	if terms, err := a.history(ctx, 0); err != nil || len(terms) != 0 {
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
		l := a.Campaign(t, fmt.Sprintf("h%d", i))
		term := end
		term.Identity = fmt.Sprintf("h%d", i)
		term.Token = l.Token()
		term.Acquired = time.Now().Add(-time.Second)
		term.Started = time.Now().Add(-900 * time.Millisecond)
		term.Ended = time.Now()
		if end.End == backends.EndLost {
			h.Drop(t, lock, l)
			select {
			case <-l.Lost():
			case <-time.After(5 * time.Second):
				t.Fatal("loss not reported")
			}
		}
		ReleaseTerm(t, l, &term)
		want = append([]backends.Term{term}, want...)
	}
	got, err := a.history(ctx, 0)
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
	if got, err := a.history(ctx, 2); err != nil || len(got) != 2 || got[0].Token != want[0].Token {
		t.Errorf("history limited to 2: %+v, %v", got, err)
	}
	// A release without a term records nothing.
	l := a.Campaign(t, "quiet")
	Release(t, l)
	if got, err := a.history(ctx, 0); err != nil || len(got) != len(want) {
		t.Errorf("a release without a term changed the history: %d terms, %v", len(got), err)
	}
}

// testHistoryBounded: the store keeps about HistoryLimit terms per lock,
// the newest ones.
func testHistoryBounded(t *testing.T, h Harness) {
	lock := lockName(t)
	a := open(t, h, lock)
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	n := backends.HistoryLimit + 5
	var last uint64
	for i := range n {
		l := a.Campaign(t, "b")
		now := time.Now()
		ReleaseTerm(t, l, &backends.Term{Identity: fmt.Sprintf("b%d", i), Token: l.Token(), Acquired: now, Ended: now,
			End: backends.EndExited, ExitCode: -1})
		last = l.Token()
	}
	got, err := a.history(ctx, 0)
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

// campaignIn campaigns as id in a pool of holders (0: none), and fails
// the test if that does not succeed within 30 s. With try, it does not
// wait.
func campaignIn(t *testing.T, c *candidate, id string, holders int, try bool) *backends.Lease {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	l, err := c.campaign(ctx, id, holders, try)
	if err != nil {
		t.Fatalf("%s: campaign: %v", id, err)
	}
	return l
}

// testHolders: the pool size a holder campaigned with is in its record,
// where status reads it through any store; a holder that named none (or
// 1) reads as 0 or 1, whatever the grant before it recorded.
func testHolders(t *testing.T, h Harness) {
	lock := lockName(t)
	a, b := open(t, h, lock), open(t, h, lock)
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
		// The slot's own lock, campaigned for as a lock of one holder
		// that records the pool's size: the driver's pool logic is
		// tested in testSlotsAreLocks.
		l := recordHolders(t, a.slot(tc.slot), "holder", tc.holders)
		st, err := b.slot(tc.slot).status(ctx)
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

// recordHolders takes c's lock as a slot of a pool of holders does: it
// campaigns in the pool and keeps trying until it wins the wanted slot
// (the lowest free one, since the others are free).
func recordHolders(t *testing.T, c *candidate, id string, holders int) *backends.Lease {
	t.Helper()
	base, i := c.lock, 0
	if j := strings.LastIndex(base, ".slot"); j >= 0 {
		base, i = base[:j], atoi(base[j+len(".slot"):])
	}
	if holders <= 1 {
		return campaignIn(t, &candidate{h: c.h, store: c.store, lock: c.lock}, id, 0, false)
	}
	// Hold the slots below i, so that the pool's campaign wins slot i.
	var below []*backends.Lease
	for k := range i {
		below = append(below, campaignIn(t, &candidate{h: c.h, store: c.store, lock: base}, fmt.Sprintf("%s-below-%d", id, k), holders, true))
	}
	l := campaignIn(t, &candidate{h: c.h, store: c.store, lock: base}, id, holders, true)
	for _, b := range below {
		Release(t, b)
	}
	if l.Slot() != i {
		t.Fatalf("%s: won slot %d, want %d", id, l.Slot(), i)
	}
	return l
}

func atoi(s string) int {
	n := 0
	for _, c := range s {
		n = n*10 + int(c-'0')
	}
	return n
}

// testSlotsAreLocks: the slots of one lock are locks of their own: two
// can be held at once, a candidate takes the lowest free slot, a full
// pool is refused to --try, status of each slot names its own holder,
// releasing one frees only it, and each slot's tokens grow on their own.
func testSlotsAreLocks(t *testing.T, h Harness) {
	lock := lockName(t)
	a, b := open(t, h, lock), open(t, h, lock)
	l0 := campaignIn(t, a, "a0", 3, true)
	l1 := campaignIn(t, a, "a1", 3, true)
	l2 := campaignIn(t, b, "b2", 3, true)
	for i, l := range []*backends.Lease{l0, l1, l2} {
		if l.Slot() != i {
			t.Fatalf("grant %d holds slot %d, want the lowest free one, %d", i, l.Slot(), i)
		}
	}
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	if l, err := b.campaign(ctx, "b3", 3, true); !errors.Is(err, backends.ErrLocked) {
		if l != nil {
			Release(t, l)
		}
		t.Fatalf("try on a full pool: got %v, want ErrLocked", err)
	}
	for i, want := range []*backends.Lease{l0, l1, l2} {
		st, err := b.slot(i).status(ctx)
		if err != nil {
			t.Fatalf("status of slot %d: %v", i, err)
		}
		if id := []string{"a0", "a1", "b2"}[i]; !st.Held || st.Identity != id || st.Token != want.Token() || st.Holders != 3 {
			t.Errorf("status of slot %d = %+v, want held by %s with token %d in a pool of 3", i, st, id, want.Token())
		}
	}
	Release(t, l1)
	l1b := campaignIn(t, b, "b1", 3, true)
	if l1b.Slot() != 1 || l1b.Token() <= l1.Token() {
		t.Errorf("after slot 1 was released, a candidate won slot %d with token %d; want slot 1 with a token above %d",
			l1b.Slot(), l1b.Token(), l1.Token())
	}
	if st, err := a.status(ctx); err != nil || !st.Held || st.Identity != "a0" {
		t.Errorf("slot 0 after slot 1 changed hands: %+v, %v; want still held by a0", st, err)
	}
	if err := l0.Renew(ctx); err != nil {
		t.Errorf("renew slot 0: %v", err)
	}
	Release(t, l2)
	Release(t, l0)
	Release(t, l1b)
	l := campaignIn(t, b, "b0", 3, true)
	if l.Slot() != 0 || l.Token() <= l0.Token() {
		t.Errorf("slot 0's next grant: slot %d, token %d; want slot 0 with a token above %d", l.Slot(), l.Token(), l0.Token())
	}
	Release(t, l)
}

// testSlotTokens: a pool of three slots, six candidates (each with a store
// of its own), all at once, until SlotGrants grants per slot on average:
// never more than three holders at once, and each slot's tokens strictly
// increase.
func testSlotTokens(t *testing.T, h Harness) {
	lock := lockName(t)
	const slots, candidates = 3, 6
	ctx, cancel := context.WithTimeout(context.Background(), 300*time.Second)
	defer cancel()
	var (
		mu     sync.Mutex
		tokens = make([][]uint64, slots)
		held   atomic.Int32
		grants atomic.Int32
		wg     sync.WaitGroup
	)
	for i := range candidates {
		c := open(t, h, lock)
		wg.Go(func() {
			id := fmt.Sprintf("candidate-%d", i)
			for grants.Load() < int32(h.SlotGrants*slots) {
				l, err := c.campaign(ctx, id, slots, false)
				if err != nil {
					t.Errorf("%s: campaign: %v", id, err)
					return
				}
				if k := held.Add(1); k > slots {
					t.Errorf("%s: %d holders at once in a pool of %d", id, k, slots)
				}
				mu.Lock()
				tokens[l.Slot()] = append(tokens[l.Slot()], l.Token())
				mu.Unlock()
				grants.Add(1)
				time.Sleep(2 * time.Millisecond)
				held.Add(-1)
				Release(t, l)
			}
		})
	}
	wg.Wait()
	for i, ts := range tokens {
		if len(ts) == 0 {
			t.Fatalf("slot %d was never granted", i)
		}
		increasing(t, fmt.Sprintf("slot %d: grant", i), ts)
	}
	t.Logf("%d grants in %d slots, tokens strictly increasing in each", grants.Load(), slots)
}

// testMarkersOfSlots: a lease reads the markers that count for it: its own
// slot's with ownSlot, else those of every slot of the pool; a marker
// written through slot 1 is read back through another store, and is not
// slot 0's.
func testMarkersOfSlots(t *testing.T, h Harness) {
	lock := lockName(t)
	a, b := open(t, h, lock), open(t, h, lock)
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	l0 := campaignIn(t, a, "a0", 2, true)
	l1 := campaignIn(t, a, "a1", 2, true)
	want1, err := complete(ctx, l1, "k1", "a1", time.Hour)
	if err != nil {
		t.Fatalf("complete through slot 1: %v", err)
	}
	if m, err := l0.Completed(ctx, "k1", false); err != nil || m == nil || m.Token != want1.Token {
		t.Errorf("slot 0 reads the pool's marker as %+v, %v; want %+v", m, err, want1)
	}
	if m, err := l0.Completed(ctx, "k1", true); err != nil || m != nil {
		t.Errorf("slot 0 reads slot 1's marker as its own: %+v, %v; want nil, nil", m, err)
	}
	Release(t, l0)
	Release(t, l1)
	if m, err := b.slot(1).completed(ctx, "k1"); err != nil || m == nil || m.Token != want1.Token || m.Identity != "a1" {
		t.Errorf("another store reads slot 1's marker as %+v, %v; want %+v", m, err, want1)
	}
	if m, err := b.completed(ctx, "k1"); err != nil || m != nil {
		t.Errorf("slot 0 reads slot 1's marker: %+v, %v; want nil, nil", m, err)
	}
}

// testPoolMismatch: a candidate whose pool size differs from the holders'
// is refused, in both directions, and takes nothing.
func testPoolMismatch(t *testing.T, h Harness) {
	lock := lockName(t)
	a, b := open(t, h, lock), open(t, h, lock)
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	// A pool of 2 holds both slots; a candidate of one holder waits.
	p0 := campaignIn(t, a, "p0", 2, true)
	p1 := campaignIn(t, a, "p1", 2, true)
	if l, err := b.campaign(ctx, "single", 0, false); !errors.Is(err, backends.ErrHoldersDiffer) {
		if l != nil {
			Release(t, l)
		}
		t.Errorf("a candidate of one holder facing a pool of 2: %v, want ErrHoldersDiffer", err)
	}
	// The pool's slot 0 frees: the single candidate still must not take it.
	Release(t, p0)
	if l, err := b.campaign(ctx, "single", 0, false); !errors.Is(err, backends.ErrHoldersDiffer) {
		if l != nil {
			Release(t, l)
		}
		t.Errorf("a candidate of one holder, slot 0 free, slot 1 held by a pool of 2: %v, want ErrHoldersDiffer", err)
	}
	Release(t, p1)
	// A lock of one holder is held; a pool's candidate is refused.
	s := b.Campaign(t, "single")
	defer Release(t, s)
	if l, err := a.campaign(ctx, "pool", 2, true); !errors.Is(err, backends.ErrHoldersDiffer) {
		if l != nil {
			Release(t, l)
		}
		t.Errorf("a pool's candidate facing a lock of one holder: %v, want ErrHoldersDiffer", err)
	}
	if st, err := a.slot(1).status(ctx); err != nil || st.Held {
		t.Errorf("the refused pool candidate left slot 1 as %+v, %v; want free", st, err)
	}
}
