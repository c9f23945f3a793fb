package backends

import (
	"context"
	"time"
)

// Poll is the Follower of a holder in a store that tells nobody of a
// change (DynamoDB, an Azure blob): it asks the driver to look again every
// `every`. With due, it asks only once due() has passed, and looks at due
// again at each tick: a store whose grant was proved meanwhile (a renewal
// under way or answered) need not look.
func Poll(every time.Duration, due func() time.Time) Follower {
	ctx, cancel := context.WithCancel(context.Background())
	p := &poll{ch: make(chan struct{}, 1), cancel: cancel, done: make(chan struct{})}
	go p.run(ctx, every, due)
	return p
}

type poll struct {
	ch     chan struct{}
	cancel context.CancelFunc
	done   chan struct{}
}

func (p *poll) Changed() <-chan struct{} { return p.ch }
func (p *poll) Behind() bool             { return false }
func (p *poll) Close()                   { p.cancel(); <-p.done }

func (p *poll) run(ctx context.Context, every time.Duration, due func() time.Time) {
	defer close(p.done)
	t := time.NewTimer(every)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		}
		if due != nil {
			if wait := time.Until(due()); wait > 0 {
				t.Reset(wait)
				continue
			}
		}
		select {
		case p.ch <- struct{}{}:
		case <-ctx.Done():
			return
		}
		t.Reset(every)
	}
}

// Wake is the channel of a Follower's Changed: a wake-up that coalesces,
// so that a follower never blocks on a driver that has not looked yet.
type Wake chan struct{}

// NewWake returns a Wake with room for one wake-up.
func NewWake() Wake { return make(Wake, 1) }

// Poke wakes the driver, unless a wake-up is already waiting.
func (w Wake) Poke() {
	select {
	case w <- struct{}{}:
	default:
	}
}

// Changed is Follower.Changed.
func (w Wake) Changed() <-chan struct{} { return w }
