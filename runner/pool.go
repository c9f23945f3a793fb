package runner

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"time"

	"github.com/leaderrun/leaderrun/backends"
)

// MaxHolders bounds --holders: a candidate reads the status of every slot
// before it campaigns and campaigns in all of them at once while it waits,
// so a pool costs each candidate about N requests and N waiting
// campaigns. A hundred is far more than a fleet's semaphore needs.
const MaxHolders = 100

// statusTimeout bounds one read of a slot's status for the agreement
// check.
const statusTimeout = 5 * time.Second

// validatePool checks --holders and --once-per-slot.
func (c *Config) validatePool() error {
	if c.Holders < 1 || c.Holders > MaxHolders {
		return configErrorf("--holders %d: want 1-%d", c.Holders, MaxHolders)
	}
	if c.OncePerSlot && c.OnceKey == "" {
		return configErrorf("--once-per-slot needs --once-per or --once-key")
	}
	return nil
}

// openSlots makes the backends of the pool's slots, which share the
// backend's connections (Backend.Slot). A lock of one holder has one
// slot: the backend itself, used exactly as before pools existed.
func (r *Runner) openSlots() {
	r.slots = []backends.Backend{r.cfg.Backend}
	for i := 1; i < r.cfg.Holders; i++ {
		r.slots = append(r.slots, r.cfg.Backend.Slot(i))
	}
}

// closeSlots closes what the slot backends hold of their own; the
// backend itself is its caller's to close, after them.
func (r *Runner) closeSlots() {
	for _, b := range r.slots[1:] {
		if err := b.Close(); err != nil {
			r.log.Debug("close a slot's backend", "error", err)
		}
	}
}

// campaignOptions are the options of a campaign in any slot.
func (r *Runner) campaignOptions() backends.CampaignOptions {
	return backends.CampaignOptions{Identity: r.cfg.Identity, Try: r.cfg.Try, LeaseDuration: r.cfg.LeaseDuration,
		Holders: r.cfg.Holders}
}

// acquire wins one slot: the lock itself for one holder; for a pool, the
// lowest free slot, else (unless --try) whichever slot frees first. Every
// holder of the pool must have campaigned with the same --holders: the
// status of every slot is read before and after the grant, and a holder
// with another N is a *ConfigError (docs/safety.md, "Pools").
func (r *Runner) acquire(ctx context.Context) (backends.Lease, int, error) {
	if r.cfg.Holders == 1 {
		l, err := r.cfg.Backend.Campaign(ctx, r.campaignOptions())
		return l, 0, err
	}
	if err := r.agree(ctx, -1); err != nil {
		return nil, 0, err
	}
	try := r.campaignOptions()
	try.Try = true
	for i, b := range r.slots {
		l, err := b.Campaign(ctx, try)
		switch {
		case err == nil:
			return r.agreed(ctx, l, i)
		case !errors.Is(err, backends.ErrLocked):
			return nil, 0, fmt.Errorf("slot %d: %w", i, err)
		}
	}
	if r.cfg.Try {
		return nil, 0, fmt.Errorf("all %d slots are held: %w", len(r.slots), backends.ErrLocked)
	}
	r.log.Info("every slot is held; waiting for the first to free", "holders", len(r.slots))
	l, i, err := r.race(ctx)
	if err != nil {
		return nil, 0, err
	}
	return r.agreed(ctx, l, i)
}

// agreed checks, once slot i is won, that no other slot is held by a
// holder with another --holders (a candidate that checked before this one
// won); if one is, the grant is released, unused, and the error says so.
func (r *Runner) agreed(ctx context.Context, l backends.Lease, i int) (backends.Lease, int, error) {
	if err := r.agree(ctx, i); err != nil {
		r.releaseUnused(l, i)
		return nil, 0, err
	}
	return l, i, nil
}

// agree reads the status of every slot but skip (-1: none), all at once,
// and returns a *ConfigError naming both pool sizes if a slot is held by a
// holder that recorded another one (nothing recorded counts as 1).
func (r *Runner) agree(ctx context.Context, skip int) error {
	n := len(r.slots)
	sts := make([]backends.Status, n)
	errs := make([]error, n)
	var wg sync.WaitGroup
	for j, b := range r.slots {
		if j == skip {
			continue
		}
		wg.Go(func() {
			sctx, cancel := context.WithTimeout(ctx, statusTimeout)
			defer cancel()
			sts[j], errs[j] = b.Status(sctx)
		})
	}
	wg.Wait()
	for j := range n {
		if errs[j] != nil {
			return fmt.Errorf("status of slot %d: %w", j, errs[j])
		}
		// A holder always records an identity (Config.Identity has a
		// default): a held slot that names none is one whose record is
		// not written yet (the local store takes the flock first, then
		// writes the record), not a holder of one.
		st := sts[j]
		if got := max(st.Holders, 1); j != skip && st.Held && st.Identity != "" && got != n {
			return configErrorf("--holders %d: slot %d of lock %q is held by %q, which runs with --holders %d; "+
				"every candidate of a lock must use the same --holders", n, j, r.cfg.Lock, st.Identity, got)
		}
	}
	return nil
}

// race campaigns in every slot at once and keeps the first grant. The
// other campaigns are cancelled, which withdraws them; a grant that came
// in meanwhile is released unused: no child ever ran under it, so it
// leaves no term in the history. race returns once every campaign has.
func (r *Runner) race(ctx context.Context) (backends.Lease, int, error) {
	rctx, cancel := context.WithCancel(ctx)
	defer cancel()
	type grant struct {
		slot  int
		lease backends.Lease
		err   error
	}
	grants := make(chan grant, len(r.slots))
	opts := r.campaignOptions()
	for i, b := range r.slots {
		go func() {
			l, err := b.Campaign(rctx, opts)
			grants <- grant{i, l, err}
		}()
	}
	var won *grant
	var failed error
	for range r.slots {
		g := <-grants
		if g.err == nil && g.lease == nil {
			// A campaign that returns neither is not a grant.
			g.err = fmt.Errorf("campaign returned no lease: %w", backends.ErrUnavailable)
		}
		switch {
		case g.err == nil && won == nil:
			won = &g
			cancel()
		case g.err == nil:
			r.releaseUnused(g.lease, g.slot)
		case won == nil && failed == nil && rctx.Err() == nil:
			// A campaign that failed by itself (the store refused it)
			// ends them all, as it ends the campaign of one holder.
			failed = fmt.Errorf("slot %d: %w", g.slot, g.err)
			cancel()
		}
	}
	switch {
	case won != nil:
		return won.lease, won.slot, nil
	case failed != nil:
		return nil, 0, failed
	}
	return nil, 0, ctx.Err()
}

// releaseUnused gives back the grant of slot i under which nothing ran,
// with no term and no event: the run holds (or will hold) another slot,
// or none.
func (r *Runner) releaseUnused(l backends.Lease, i int) {
	ctx, cancel := context.WithTimeout(context.Background(), releaseTimeout)
	defer cancel()
	if err := l.Release(ctx, nil); err != nil {
		r.log.Warn("release of an unused slot failed; its lease will expire in the store", "slot", i, "token", l.Token(), "error", err)
		return
	}
	r.log.Info("released an unused slot", "slot", i, "token", l.Token())
}

// completedIn reads the once-key's marker for the holder of slot own:
// in its own slot alone for one holder or with --once-per-slot, else in
// every slot of the pool (the first found), since by default the period
// is the pool's.
func (r *Runner) completedIn(ctx context.Context, own int) (*backends.Marker, error) {
	if len(r.slots) == 1 || r.cfg.OncePerSlot {
		return r.slots[own].Completed(ctx, r.cfg.OnceKey)
	}
	for j, b := range r.slots {
		m, err := b.Completed(ctx, r.cfg.OnceKey)
		if err != nil {
			return nil, fmt.Errorf("slot %d: %w", j, err)
		}
		if m != nil {
			return m, nil
		}
	}
	return nil, nil
}

// slotted tells its observer which slot the run holds, on every event.
type slotted struct {
	Observer
	slot int
}

func (s slotted) Observe(e Event) {
	e.Slot = s.slot
	s.Observer.Observe(e)
}
