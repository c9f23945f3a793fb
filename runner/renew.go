package runner

import (
	"context"
	"errors"
	"time"

	"github.com/leaderrun/leaderrun/backends"
)

// renewal is the outcome of one Renew call.
type renewal struct {
	sent    time.Time
	latency time.Duration
	err     error
}

// fresh returns the send time from which the first renew deadline counts.
// A grant whose proof of life is old (a candidate that waited in the
// queue, a slow store) is renewed once, so that the child starts with a
// whole deadline; if that renewal fails, the old proof stands, unless the
// deadline has passed or the store says the lease is gone.
func (r *Runner) fresh(ctx context.Context, lease Lease) (time.Time, error) {
	cfg := &r.cfg
	lastAck := lease.Acquired()
	if time.Since(lastAck) > cfg.Timings.RetryPeriod {
		sent := time.Now()
		rctx, cancel := context.WithTimeout(ctx, cfg.Timings.AttemptTimeout())
		err := lease.Renew(rctx)
		cancel()
		switch {
		case err == nil:
			lastAck = sent
		case errors.Is(err, backends.ErrLeaseLost):
			return lastAck, err
		default:
			r.log.Warn("renewal before starting the child failed", "token", lease.Token(), "error", err)
		}
	}
	if !time.Now().Before(lastAck.Add(cfg.Timings.RenewDeadline)) {
		return lastAck, errors.New("renew deadline passed before the child could start")
	}
	return lastAck, nil
}

// renewLoop renews every period until ctx ends or the lease is lost for
// good, reporting each attempt with its send time. During leadership it
// is the lease's only renewal (backends/backend.go).
func renewLoop(ctx context.Context, lease Lease, period, timeout time.Duration, out chan<- renewal) {
	t := time.NewTimer(period)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		}
		sent := time.Now()
		rctx, cancel := context.WithTimeout(ctx, timeout)
		err := lease.Renew(rctx)
		cancel()
		select {
		case out <- renewal{sent: sent, latency: time.Since(sent), err: err}:
		case <-ctx.Done():
			return
		}
		if errors.Is(err, backends.ErrLeaseLost) {
			return
		}
		// Every period from the send time, so that a slow or timed-out
		// attempt does not push the next one back.
		t.Reset(max(period-time.Since(sent), 0))
	}
}
