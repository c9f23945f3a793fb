package postgres

import (
	"context"
	"errors"
	"sync"

	"github.com/leaderrun/leaderrun/internal/pgwire"
)

// pool lends up to its bound of connections to one statement at a time,
// connecting as needed and keeping those that are still usable.
type pool struct {
	cfg   *pgwire.Config
	slots chan struct{} // one token per connection lent

	mu     sync.Mutex
	idle   []*pgwire.Conn
	closed bool
}

var errPoolClosed = errors.New("postgres: the backend is closed")

func newPool(cfg *pgwire.Config, max int) *pool {
	return &pool{cfg: cfg, slots: make(chan struct{}, max)}
}

// with runs fn on a connection: an idle one, or a new one.
func (p *pool) with(ctx context.Context, fn func(*pgwire.Conn) error) error {
	select {
	case p.slots <- struct{}{}:
	case <-ctx.Done():
		return ctx.Err()
	}
	defer func() { <-p.slots }()
	p.mu.Lock()
	if p.closed {
		p.mu.Unlock()
		return errPoolClosed
	}
	var c *pgwire.Conn
	if n := len(p.idle); n > 0 {
		c, p.idle = p.idle[n-1], p.idle[:n-1]
	}
	p.mu.Unlock()
	if c == nil {
		var err error
		if c, err = pgwire.Connect(ctx, p.cfg); err != nil {
			return err
		}
		// Through a pooler in transaction mode a statement may run on a
		// server connection where another client LISTENed: what arrives
		// is dropped (OnNotification is nil).
	}
	err := fn(c)
	p.mu.Lock()
	defer p.mu.Unlock()
	if !c.Idle() || p.closed {
		// Closed, or left in a transaction (no statement here opens one).
		c.Close()
	} else {
		p.idle = append(p.idle, c)
	}
	return err
}

// close closes the idle connections; those lent are closed when returned.
func (p *pool) close() {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.closed = true
	for _, c := range p.idle {
		c.Close()
	}
	p.idle = nil
}
