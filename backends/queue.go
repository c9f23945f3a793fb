package backends

import (
	"context"
	"errors"
)

// queueCandidacy is one candidate's campaign for a QueueLock: a place in
// the store's queue, and the wait for its turn, as etcd's Election does
// it. A ticket whose session ended while it waited is left, and the next
// step joins again, at the end of the queue.
type queueCandidacy struct {
	lock     QueueLock
	claim    Claim
	try      bool
	answered func()
	ticket   Ticket
}

func (q *queueCandidacy) step(ctx context.Context) (Grant, error) {
	if q.ticket == nil {
		t, err := q.lock.Join(ctx, q.claim, q.try)
		if err == nil || errors.Is(err, ErrLocked) {
			q.answered()
		}
		if err != nil {
			return nil, err
		}
		q.ticket = t
	}
	g, err := q.ticket.Lead(ctx)
	if errors.Is(err, ErrEnded) && ctx.Err() == nil {
		lctx, cancel := cleanupContext(ctx, q.claim.Timings)
		_ = q.ticket.Leave(lctx)
		cancel()
		q.ticket = nil
	}
	return g, err
}

func (q *queueCandidacy) withdraw(ctx context.Context) {
	if q.ticket != nil {
		_ = q.ticket.Leave(ctx)
	}
}
