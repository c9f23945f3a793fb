package runner

import (
	"context"
	"errors"
	"fmt"
	"syscall"

	"github.com/leaderrun/leaderrun/backends"
	"github.com/leaderrun/leaderrun/signals"
)

// campaign waits for leadership of a slot (see acquire), withdrawing on a
// signal, on ctx, on --try or when --wait runs out.
func (r *Runner) campaign(ctx context.Context) (backends.Lease, int, error) {
	cctx, cancel := context.WithCancel(ctx)
	defer cancel()
	waitCtx := cctx
	if r.cfg.Wait > 0 {
		var c2 context.CancelFunc
		waitCtx, c2 = context.WithTimeout(cctx, r.cfg.Wait)
		defer c2()
	}
	type result struct {
		lease backends.Lease
		slot  int
		err   error
	}
	done := make(chan result, 1)
	if r.cfg.Holders > 1 {
		r.log.Info("campaigning", "try", r.cfg.Try, "wait", r.cfg.Wait, "holders", r.cfg.Holders)
	} else {
		r.log.Info("campaigning", "try", r.cfg.Try, "wait", r.cfg.Wait)
	}
	r.cfg.Observer.Observe(Event{Kind: Campaigning})
	go func() {
		l, slot, err := r.acquire(waitCtx)
		done <- result{l, slot, err}
	}()

	var interrupted syscall.Signal
	for {
		select {
		case res := <-done:
			if interrupted != 0 {
				if res.lease != nil {
					r.release(res.lease, nil)
				}
				r.log.Info("candidacy withdrawn", "signal", signals.Name(interrupted))
				return nil, 0, &InterruptedError{Signal: interrupted}
			}
			return res.lease, res.slot, r.campaignErr(ctx, waitCtx, res.err)
		case s := <-r.cfg.Signals:
			sig, _ := s.(syscall.Signal)
			switch sig {
			case syscall.SIGTERM, syscall.SIGINT, syscall.SIGHUP, syscall.SIGQUIT:
				if interrupted == 0 {
					interrupted = sig
					cancel()
				}
			default:
				r.log.Debug("signal ignored while waiting for leadership", "signal", signals.Name(sig))
			}
		}
	}
}

// campaignErr says why a campaign that returned err won nothing; nil if
// err is.
func (r *Runner) campaignErr(ctx, waitCtx context.Context, err error) error {
	switch {
	case err == nil:
		return nil
	case errors.Is(err, backends.ErrLocked) && r.cfg.Holders > 1:
		return &NotAcquiredError{Reason: fmt.Sprintf("all %d slots of lock %q are held (--try)", r.cfg.Holders, r.cfg.Lock)}
	case errors.Is(err, backends.ErrLocked):
		return &NotAcquiredError{Reason: fmt.Sprintf("lock %q is held by another candidate (--try)", r.cfg.Lock)}
	case errors.As(err, new(*ConfigError)):
		return err
	case r.cfg.Wait > 0 && errors.Is(waitCtx.Err(), context.DeadlineExceeded) && ctx.Err() == nil:
		// Only our own --wait timer counts as "not acquired"; a
		// backend error that merely wraps a deadline is not.
		if r.cfg.Holders > 1 {
			return &NotAcquiredError{Reason: fmt.Sprintf("all %d slots of lock %q still held after --wait %v", r.cfg.Holders, r.cfg.Lock, r.cfg.Wait)}
		}
		return &NotAcquiredError{Reason: fmt.Sprintf("lock %q still held by another candidate after --wait %v", r.cfg.Lock, r.cfg.Wait)}
	case ctx.Err() != nil:
		return &InterruptedError{Signal: syscall.SIGTERM}
	default:
		return fmt.Errorf("campaign for %q: %w", r.cfg.Lock, err)
	}
}
