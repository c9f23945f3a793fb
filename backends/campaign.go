package backends

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"log/slog"
	"sync/atomic"
	"time"

	"k8s.io/apimachinery/pkg/util/wait"
)

// Candidate is who campaigns, and how.
type Candidate struct {
	// Identity is stored with the lock for status and history. Required.
	Identity string
	// Timings are the lease's timings, validated (Timings.Validate).
	Timings Timings
	// Try gives up at once, with an error wrapping ErrLocked, if the
	// lock (every slot of the pool) is held; an unreachable store is
	// then ErrUnavailable at once. Zero value: wait.
	Try bool
	// Wait gives up after this long: with an error wrapping ErrLocked
	// if the store answered and the lock stayed held, ErrUnavailable if
	// the store never answered. Until then an unreachable or failing
	// store is retried with backoff. Zero: wait for ever.
	Wait time.Duration
	// Holders is the size of the pool (--holders N): up to N holders at
	// once, each in a slot of its own (SlotLock), 1 to MaxHolders. Every
	// candidate of a lock must use the same N. Zero: 1.
	Holders int
	// Log receives the campaign's events. Nil: slog.Default().
	Log *slog.Logger
}

// MaxHolders bounds --holders: a candidate reads the status of every slot
// before it campaigns, and campaigns in all of them at once while it
// waits, so a pool costs each candidate about N requests and N waiting
// campaigns. A hundred is far more than a fleet's semaphore needs.
const MaxHolders = 100

// ErrHoldersDiffer means that a slot of the lock is held by a candidate
// of another pool size (--holders).
var ErrHoldersDiffer = errors.New("backends: candidates of the lock use different --holders")

// Campaign waits until the candidate holds lock in s, or one slot of its
// pool, and returns the lease; this is the only acquire loop there is.
// While the lock is held it waits, woken by the store or by its own
// timers; a store that fails or cannot be reached it retries with backoff
// and jitter, logging each failure once per change of error; a refusal
// ends it in every mode. It gives up as c.Try and c.Wait say.
//
// Cancelling ctx withdraws the candidacy (its queue entry and session,
// and a grant whose answer was lost), on a context of its own bounded by
// the timings, and returns ctx's error.
func Campaign(ctx context.Context, s Store, lock string, c Candidate) (*Lease, error) {
	if c.Identity == "" {
		return nil, errors.New("backends: a campaign needs an identity")
	}
	if c.Holders < 1 {
		c.Holders = 1
	}
	if c.Log == nil {
		c.Log = slog.Default()
	}
	e := &elector{store: s, lock: lock, c: c}
	wctx := ctx
	if c.Wait > 0 {
		var cancel context.CancelFunc
		wctx, cancel = context.WithTimeout(ctx, c.Wait)
		defer cancel()
	}
	l, err := e.acquire(wctx)
	return l, e.explain(ctx, wctx, err)
}

// elector is one Campaign.
type elector struct {
	store Store
	lock  string
	c     Candidate
	slots []Lock // the locks of the pool, slot 0 (the lock itself) first
	// answered is set once the store answered a request: a wait that
	// ends without a grant is then "held", not "unreachable". answers
	// counts them.
	answered atomic.Bool
	answers  atomic.Int64
	lastErr  atomic.Pointer[error] // the last failure, for the message when the wait ends
}

// explain turns what a campaign ended with into what the caller reads.
func (e *elector) explain(ctx, wctx context.Context, err error) error {
	switch {
	case err == nil:
		return nil
	case ctx.Err() != nil:
		return ctx.Err()
	case wctx.Err() != nil && e.answered.Load():
		if e.c.Holders > 1 {
			return &HeldError{Reason: fmt.Sprintf("all %d slots of lock %q still held after --wait %v", e.c.Holders, e.lock, e.c.Wait)}
		}
		return &HeldError{Reason: fmt.Sprintf("lock %q still held by another candidate after --wait %v", e.lock, e.c.Wait)}
	case wctx.Err() != nil:
		last := err
		if p := e.lastErr.Load(); p != nil {
			last = *p
		}
		return fmt.Errorf("no answer from %s within --wait %v: %w", e.store.Name(), e.c.Wait, last)
	case errors.Is(err, ErrLocked):
		if e.c.Holders > 1 {
			return &HeldError{Reason: fmt.Sprintf("all %d slots of lock %q are held (--try)", e.c.Holders, e.lock), Cause: err}
		}
		return &HeldError{Reason: fmt.Sprintf("lock %q is held by another candidate (--try)", e.lock), Cause: err}
	}
	return err
}

// HeldError is a campaign that gave up because the lock (every slot of
// its pool) stayed held: --try found it held, or --wait ran out while the
// store answered. It wraps ErrLocked.
type HeldError struct {
	// Reason says which lock stayed held, and why the campaign gave up.
	Reason string
	// Cause is the store's own word on it (who holds the lock), if any.
	Cause error
}

func (e *HeldError) Error() string { return e.Reason }

func (e *HeldError) Unwrap() error {
	if e.Cause != nil {
		return e.Cause
	}
	return ErrLocked
}

// candidacy is one candidate's campaign for one lock, as its kind of
// store needs it (record.go, queue.go). step runs until the candidate
// holds the lock, the lock is held and the candidacy tries (ErrLocked),
// ctx ends, or a request fails; after a failure the driver calls step
// again, and the candidacy goes on from what it knows. withdraw removes
// every trace of the candidacy; it is called once, unless step returned
// a grant, on a bounded context.
type candidacy interface {
	step(ctx context.Context) (Grant, error)
	withdraw(ctx context.Context)
}

func (e *elector) newCandidacy(lk Lock, try, quick bool) (candidacy, error) {
	claim := Claim{Identity: e.c.Identity, Owner: newOwner(), Timings: e.c.Timings}
	if e.c.Holders > 1 {
		claim.Holders = e.c.Holders
	}
	switch lk := lk.(type) {
	case RecordLock:
		return &recordCandidacy{lock: lk, claim: claim, try: try, quick: quick, answered: e.noteAnswer}, nil
	case QueueLock:
		return &queueCandidacy{lock: lk, claim: claim, try: try, answered: e.noteAnswer}, nil
	}
	return nil, fmt.Errorf("backends: %s hands out a lock of type %T, neither a record nor a queue", e.store.Name(), lk)
}

func (e *elector) noteAnswer() {
	e.answered.Store(true)
	e.answers.Add(1)
}

// newOwner is a Claim.Owner: 16 random hex digits.
func newOwner() string {
	var b [8]byte
	_, _ = rand.Read(b[:])
	return hex.EncodeToString(b[:])
}

// campaign wins one lock, the slot i of the pool: the retry loop. quick
// is a try that does not watch a record that looks expired (a pool's
// first look at each slot).
func (e *elector) campaign(ctx context.Context, i int, try, quick bool) (*Lease, error) {
	lk := e.slots[i]
	cand, err := e.newCandidacy(lk, try, quick)
	if err != nil {
		return nil, err
	}
	won := false
	defer func() {
		if !won {
			wctx, cancel := cleanupContext(ctx, e.c.Timings)
			defer cancel()
			cand.withdraw(wctx)
		}
	}()
	backoff := e.backoff()
	var logged string
	answers := e.answers.Load()
	for {
		g, err := cand.step(ctx)
		if n := e.answers.Load(); n != answers && err != nil {
			// The store answered since the last failure: a new outage
			// is logged, and backed off, from the start.
			answers, backoff = n, e.backoff()
			if logged != "" {
				e.c.Log.Info("store answered again", "slot", i)
				logged = ""
			}
		}
		if err == nil {
			won = true
			return &Lease{g: g, lock: lk, slots: e.slots[:e.c.Holders], slot: i, log: e.c.Log}, nil
		}
		if retryable(err) {
			// Kept for the message of a wait that ends without an
			// answer, even when the wait's end cut this attempt short.
			e.lastErr.Store(&err)
		}
		if ctx.Err() != nil {
			return nil, ctx.Err()
		}
		if !retryable(err) || try {
			return nil, err
		}
		pause := backoff.Step()
		if msg := err.Error(); msg != logged {
			logged = msg
			e.c.Log.Warn("store failed; retrying", "slot", i, "error", err, "in", pause.Round(time.Millisecond))
		}
		t := time.NewTimer(pause)
		select {
		case <-ctx.Done():
			t.Stop()
			return nil, ctx.Err()
		case <-t.C:
		}
	}
}

// retryable reports whether asking the store again may help: it could not
// be reached, or the candidacy ended while it waited. A refusal, a lock
// held under --try and everything else (the local store's unsafe or
// corrupt state, a grant too short) are final.
func retryable(err error) bool {
	if errors.Is(err, ErrRefused) || errors.Is(err, ErrLocked) {
		return false
	}
	return errors.Is(err, ErrUnavailable) || errors.Is(err, ErrEnded)
}

// backoff is the pause schedule between attempts: 100 ms doubling, with
// jitter so that a fleet that lost its store does not come back in step,
// up to the retry period.
func (e *elector) backoff() *wait.Backoff {
	return &wait.Backoff{Duration: 100 * time.Millisecond, Factor: 2, Jitter: 0.5, Steps: 64,
		Cap: max(e.c.Timings.RetryPeriod, 100*time.Millisecond)}
}

// cleanupContext bounds a withdrawal or a release that must run even
// though ctx has ended.
func cleanupContext(ctx context.Context, t Timings) (context.Context, context.CancelFunc) {
	return context.WithTimeout(context.WithoutCancel(ctx), max(t.AttemptTimeout(), time.Second))
}
