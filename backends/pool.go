package backends

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"time"
)

// statusTimeout bounds one read of a slot's status for the agreement of a
// pool, at least.
const statusTimeout = 5 * time.Second

// acquire wins one slot: the lock itself for one holder; for a pool, the
// lowest free slot, else (unless --try) whichever slot frees first. Around
// it, the check that every holder of a lock campaigned with the same pool
// size (agree): before the campaign and after the grant for a pool, beside
// the campaign for one holder; docs/safety.md, "Pools", argues its reach.
func (e *elector) acquire(ctx context.Context) (*Lease, error) {
	n := e.c.Holders
	e.slots = make([]Lock, n+1) // the pool's, and the one just past it
	for i := range e.slots {
		e.slots[i] = e.store.Lock(SlotLock(e.lock, i))
	}
	if n == 1 {
		return e.single(ctx)
	}
	if err := e.agree(ctx, -1); err != nil {
		return nil, err
	}
	for i := range n {
		l, err := e.campaign(ctx, i, true, true)
		switch {
		case err == nil:
			return e.agreed(ctx, l)
		case errors.Is(err, ErrLocked), retryable(err) && !e.c.Try && ctx.Err() == nil:
			// Held, or the store failed and the race below retries it.
		default:
			return nil, fmt.Errorf("slot %d: %w", i, err)
		}
	}
	if e.c.Try {
		return nil, fmt.Errorf("all %d slots are held: %w", n, ErrLocked)
	}
	e.c.Log.Info("every slot is held; waiting for the first to free", "holders", n)
	l, err := e.race(ctx)
	if err != nil {
		return nil, err
	}
	return e.agreed(ctx, l)
}

// single campaigns for a lock of one holder, while slot 1, the slot every
// pool fills first, is read beside the campaign, so that a candidate
// facing a pool fails at once rather than after its wait. Once the lock is
// won, the read is waited for checkBound at most, then given up: it would
// delay the command.
func (e *elector) single(ctx context.Context) (*Lease, error) {
	cctx, cancel := context.WithCancel(ctx)
	defer cancel()
	rctx, stopRead := context.WithCancel(ctx)
	defer stopRead()
	checked := make(chan error, 1)
	go func() {
		err := e.agree(rctx, 0)
		if errors.Is(err, ErrHoldersDiffer) {
			cancel()
		}
		checked <- err
	}()
	l, err := e.campaign(cctx, 0, e.c.Try, false)
	if l == nil {
		stopRead()
	} else {
		defer time.AfterFunc(e.checkBound(), stopRead).Stop()
	}
	switch pre := <-checked; {
	case errors.Is(pre, ErrHoldersDiffer):
		if l != nil {
			e.releaseUnused(ctx, l)
		}
		return nil, pre
	case err != nil:
		return nil, err
	}
	return l, nil
}

// checkBound bounds a read of the status of the other slots that stands
// between a grant and the command's start: a small part of the renew
// deadline, which counts from before the grant.
func (e *elector) checkBound() time.Duration {
	return max(min(e.c.Timings.AttemptTimeout(), e.c.Timings.RenewDeadline/4), 10*time.Millisecond)
}

// agreed checks, once l is won, that no other slot is held by a holder
// of another pool size (one that checked before this candidate won); if
// one is, the grant is released unused.
func (e *elector) agreed(ctx context.Context, l *Lease) (*Lease, error) {
	actx, cancel := context.WithTimeout(ctx, e.checkBound())
	defer cancel()
	if err := e.agree(actx, l.slot); err != nil {
		e.releaseUnused(ctx, l)
		return nil, err
	}
	return l, nil
}

// agree reads, all at once, the status of the slots to check (for a pool,
// all of its own and the one past them, where a larger pool may hold, but
// skip; for one holder, slot 1), and returns ErrHoldersDiffer naming both
// pool sizes if one is held by a holder that recorded another size
// (nothing recorded counts as 1). A status that cannot be read decides
// nothing: the check finds misconfigurations, the store's own rules keep
// the lock.
func (e *elector) agree(ctx context.Context, skip int) error {
	n := len(e.slots)
	sts := make([]Status, n)
	errs := make([]error, n)
	var wg sync.WaitGroup
	for j, lk := range e.slots {
		if j == skip || e.c.Holders == 1 && j != 1 {
			continue
		}
		wg.Go(func() {
			sctx, cancel := context.WithTimeout(ctx, statusTimeout)
			defer cancel()
			sts[j], errs[j] = lockStatus(sctx, lk)
		})
	}
	wg.Wait()
	for j := range n {
		// A held slot that names no holder is one whose record is not
		// written yet (the local store takes the flock first).
		st := sts[j]
		if got := max(st.Holders, 1); errs[j] == nil && st.Held && st.Identity != "" && got != e.c.Holders &&
			(j < e.c.Holders || got > j) {
			return fmt.Errorf("--holders %d: slot %d of lock %q is held by %q, which runs with --holders %d; "+
				"every candidate of a lock must use the same --holders: %w", e.c.Holders, j, e.lock, st.Identity, got, ErrHoldersDiffer)
		}
	}
	return nil
}

// race campaigns in every slot at once and keeps the first grant. The
// other campaigns are cancelled, which withdraws them; a grant that came
// in meanwhile is released unused, with no term. race returns once every
// campaign has.
func (e *elector) race(ctx context.Context) (*Lease, error) {
	rctx, cancel := context.WithCancel(ctx)
	defer cancel()
	type grant struct {
		lease *Lease
		slot  int
		err   error
	}
	n := e.c.Holders
	grants := make(chan grant, n)
	for i := range n {
		go func() {
			l, err := e.campaign(rctx, i, false, false)
			grants <- grant{l, i, err}
		}()
	}
	var won *Lease
	var failed error
	for range n {
		g := <-grants
		switch {
		case g.err == nil && won == nil:
			won = g.lease
			cancel()
		case g.err == nil:
			e.releaseUnused(ctx, g.lease)
		case won == nil && failed == nil && rctx.Err() == nil:
			// A campaign that failed by itself (the store refused it)
			// ends them all, as it ends the campaign of one holder.
			failed = fmt.Errorf("slot %d: %w", g.slot, g.err)
			cancel()
		}
	}
	switch {
	case won != nil:
		return won, nil
	case failed != nil:
		return nil, failed
	}
	return nil, ctx.Err()
}

// releaseUnused gives back a grant under which nothing ran, with no term.
func (e *elector) releaseUnused(ctx context.Context, l *Lease) {
	rctx, cancel := cleanupContext(ctx, e.c.Timings)
	defer cancel()
	if err := l.Release(rctx, nil); err != nil {
		e.c.Log.Warn("release of an unused slot failed; its lease will expire in the store", "slot", l.slot, "token", l.Token(), "error", err)
		return
	}
	e.c.Log.Info("released an unused slot", "slot", l.slot, "token", l.Token())
}
