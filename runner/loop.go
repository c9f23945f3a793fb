package runner

import (
	"context"
	"sync"
	"syscall"
	"time"
)

// run drives the leadership from real events until it is done: renewals
// from a goroutine of its own, the deadline, progress and hold timers,
// the child's progress reports, the store's loss report, the child's end,
// signals and ctx.
func (l *leadership) run(ctx context.Context, lease Lease) {
	cfg := l.cfg
	renewals := make(chan renewal)
	rctx, stopRenewing := context.WithCancel(context.Background())
	var wg sync.WaitGroup
	wg.Add(1)
	go func() {
		defer wg.Done()
		renewLoop(rctx, lease, cfg.Timings.RetryPeriod, cfg.Timings.AttemptTimeout(), renewals)
	}()
	defer func() {
		stopRenewing()
		wg.Wait()
	}()

	deadline := time.NewTimer(time.Until(l.deadline))
	defer deadline.Stop()
	var progress progressTimer
	progress.set(l)
	defer progress.stop()
	var (
		lost      = lease.Lost()
		childDone = l.child.Done()
		ctxDone   = ctx.Done()
		hold      <-chan time.Time
		late      <-chan time.Time
	)
	for l.phase != done {
		select {
		case rn := <-renewals:
			l.renewed(time.Now(), rn)
		case <-deadline.C:
			l.deadlinePassed(time.Now())
		case <-progress.c:
			l.progressOverdue(time.Now())
		case <-cfg.Progress.woken():
			l.progressed(time.Now(), cfg.Progress.Latest())
		case <-lost:
			lost = nil
			l.leaseLost(time.Now(), lease.Err())
		case <-childDone:
			childDone = nil
			l.childExited(time.Now(), l.child.Status())
		case <-hold:
			l.holdOver(time.Now())
		case <-late:
			l.lateStopDue(time.Now())
		case s := <-cfg.Signals:
			sig, _ := s.(syscall.Signal)
			l.signalled(time.Now(), sig)
		case <-ctxDone:
			ctxDone = nil
			l.cancelled(time.Now())
		}
		// Re-arm the timers from the state the event left.
		if l.lost == nil && l.phase != done {
			deadline.Reset(time.Until(l.deadline))
		}
		progress.set(l)
		if l.phase == holding && hold == nil {
			hold = time.After(time.Until(l.holdUntil))
		}
		if !l.lateStop.IsZero() && late == nil {
			late = time.After(time.Until(l.lateStop))
		}
		if l.phase == done && childDone != nil {
			// A hold ended by a loss or a signal after the child had
			// exited: nothing left to wait for.
			childDone = nil
		}
	}
}
