package runner

import (
	"context"
	"errors"
	"fmt"
	"os"
	"syscall"
	"time"

	"github.com/leaderrun/leaderrun/backends"
	"github.com/leaderrun/leaderrun/signals"
)

// Lease is what the runner needs of held leadership: *backends.Lease.
type Lease interface {
	Token() uint64
	TTL() time.Duration
	Acquired() time.Time
	Renew(ctx context.Context) error
	Lost() <-chan struct{}
	Err() error
	Slot() int
	Completed(ctx context.Context, key string, ownSlot bool) (*backends.Marker, error)
	Complete(ctx context.Context, m backends.Marker) error
	Release(ctx context.Context, term *backends.Term) error
	LockFile() *os.File
}

// campaign waits for leadership of the lock or a slot of its pool
// (backends.Campaign), withdrawing on a signal or on ctx; the driver gives
// up on --try and when --wait runs out.
func (r *Runner) campaign(ctx context.Context) (Lease, error) {
	cctx, cancel := context.WithCancel(ctx)
	defer cancel()
	type result struct {
		lease *backends.Lease
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
		l, err := backends.Campaign(cctx, r.cfg.Store, r.cfg.Lock, backends.Candidate{Identity: r.cfg.Identity,
			Timings: r.cfg.Timings, Try: r.cfg.Try, Wait: r.cfg.Wait, Holders: r.cfg.Holders, Log: r.log})
		done <- result{l, err}
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
				return nil, &InterruptedError{Signal: interrupted}
			}
			if res.err != nil {
				return nil, r.campaignErr(ctx, res.err)
			}
			return res.lease, nil
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

// campaignErr says why a campaign that returned err won nothing.
func (r *Runner) campaignErr(ctx context.Context, err error) error {
	var held *backends.HeldError
	switch {
	case errors.As(err, &held):
		return &NotAcquiredError{Reason: held.Reason}
	case errors.Is(err, backends.ErrHoldersDiffer):
		return &ConfigError{msg: err.Error()}
	case ctx.Err() != nil:
		return &InterruptedError{Signal: syscall.SIGTERM}
	}
	return fmt.Errorf("campaign for %q: %w", r.cfg.Lock, err)
}
