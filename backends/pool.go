package backends

import (
	"context"
	"errors"
	"fmt"
	"sync"
)

// acquire wins one slot: the lock itself for one holder; for a pool, the
// lowest free slot, else (unless --try) whichever slot frees first.
//
// Every holder of a lock must have campaigned with the same pool size:
// the status of the other slots is read before the campaign (so that a
// candidate facing another pool fails at once rather than after its
// wait) and again after the grant, and a holder that recorded another
// size is ErrHoldersDiffer; the grant is then released unused. A
// candidate of one holder reads slot 1 alone, the slot every pool of two
// or more has. Of two candidates that start together, each reads the
// other's slot after its own grant, so at least one of them sees the other
// (docs/safety.md, "Pools").
func (e *elector) acquire(ctx context.Context) (*Lease, error) {
	n := e.c.Holders
	e.slots = make([]Lock, max(n, 2))
	for i := range e.slots {
		e.slots[i] = e.store.Lock(SlotLock(e.lock, i))
	}
	if n == 1 {
		return e.single(ctx)
	}
	e.slots = e.slots[:n]
	if err := e.agree(ctx, -1); err != nil {
		return nil, err
	}
	for i := range n {
		l, err := e.campaign(ctx, i, true)
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
	e.log.Info("every slot is held; waiting for the first to free", "holders", n)
	l, err := e.race(ctx)
	if err != nil {
		return nil, err
	}
	return e.agreed(ctx, l)
}

// single campaigns for a lock of one holder, while slot 1 is read beside
// the campaign; a pool there ends the campaign.
func (e *elector) single(ctx context.Context) (*Lease, error) {
	cctx, cancel := context.WithCancel(ctx)
	defer cancel()
	checked := make(chan error, 1)
	go func() {
		err := e.agree(cctx, 0)
		if err != nil && errors.Is(err, ErrHoldersDiffer) {
			cancel()
		}
		checked <- err
	}()
	l, err := e.campaign(cctx, 0, e.c.Try)
	pre := <-checked
	switch {
	case pre != nil && errors.Is(pre, ErrHoldersDiffer):
		if l != nil {
			e.releaseUnused(ctx, l)
		}
		return nil, pre
	case err != nil:
		return nil, err
	}
	return e.agreed(ctx, l)
}

// agreed checks, once l is won, that no other slot is held by a holder
// of another pool size (one that checked before this candidate won); if
// one is, the grant is released unused.
func (e *elector) agreed(ctx context.Context, l *Lease) (*Lease, error) {
	if err := e.agree(ctx, l.slot); err != nil {
		e.releaseUnused(ctx, l)
		return nil, err
	}
	return l, nil
}

// agree reads the status of every slot but skip (-1: none), all at once,
// and returns ErrHoldersDiffer naming both pool sizes if a slot is held
// by a holder that recorded another one (nothing recorded counts as 1).
// A store that fails to answer is no disagreement: the campaign meets it.
func (e *elector) agree(ctx context.Context, skip int) error {
	n := len(e.slots)
	sts := make([]Status, n)
	errs := make([]error, n)
	var wg sync.WaitGroup
	for j, lk := range e.slots {
		if j == skip {
			continue
		}
		wg.Go(func() {
			sctx, cancel := context.WithTimeout(ctx, max(e.c.Timings.AttemptTimeout(), statusTimeout))
			defer cancel()
			sts[j], errs[j] = lockStatus(sctx, lk)
		})
	}
	wg.Wait()
	for j := range n {
		if errs[j] != nil {
			if e.c.Holders > 1 {
				return fmt.Errorf("status of slot %d: %w", j, errs[j])
			}
			continue
		}
		// A holder always records an identity: a held slot that names
		// none is one whose record is not written yet (the local store
		// takes the flock first, then writes the record).
		st := sts[j]
		if got := max(st.Holders, 1); j != skip && st.Held && st.Identity != "" && got != e.c.Holders {
			return fmt.Errorf("--holders %d: slot %d of lock %q is held by %q, which runs with --holders %d; "+
				"every candidate of a lock must use the same --holders: %w", e.c.Holders, j, e.lock, st.Identity, got, ErrHoldersDiffer)
		}
	}
	return nil
}

// race campaigns in every slot at once and keeps the first grant. The
// other campaigns are cancelled, which withdraws them; a grant that came
// in meanwhile is released unused: no child ever ran under it, so it
// leaves no term in the history. race returns once every campaign has.
func (e *elector) race(ctx context.Context) (*Lease, error) {
	rctx, cancel := context.WithCancel(ctx)
	defer cancel()
	type grant struct {
		lease *Lease
		slot  int
		err   error
	}
	grants := make(chan grant, len(e.slots))
	for i := range e.slots {
		go func() {
			l, err := e.campaign(rctx, i, false)
			grants <- grant{l, i, err}
		}()
	}
	var won *Lease
	var failed error
	for range e.slots {
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

// releaseUnused gives back a grant under which nothing ran, with no term:
// the candidate holds (or will hold) another slot, or none.
func (e *elector) releaseUnused(ctx context.Context, l *Lease) {
	rctx, cancel := e.cleanupContext(ctx)
	defer cancel()
	if err := l.Release(rctx, nil); err != nil {
		e.log.Warn("release of an unused slot failed; its lease will expire in the store", "slot", l.slot, "token", l.Token(), "error", err)
		return
	}
	e.log.Info("released an unused slot", "slot", l.slot, "token", l.Token())
}
