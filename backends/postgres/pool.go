package postgres

import (
	"context"
	"errors"
	"sync"

	"github.com/jackc/pgx/v5/pgconn"
)

// pool lends up to its bound of connections to one statement at a time,
// connecting as needed and keeping those that are still usable. It is
// pgxpool's job without pgx's typed layer, which the backend does not
// need, and without a health check before each use: a connection that
// broke while idle fails its next statement, which Backend.do retries
// once on a new one.
type pool struct {
	cfg   *pgconn.Config
	slots chan struct{} // one token per connection lent

	mu     sync.Mutex
	idle   []*conn
	closed bool
}

var errPoolClosed = errors.New("postgres: the backend is closed")

func newPool(cfg *pgconn.Config, max int) *pool {
	return &pool{cfg: cfg, slots: make(chan struct{}, max)}
}

// with runs fn on a connection: an idle one, or a new one.
func (p *pool) with(ctx context.Context, fn func(*conn) error) error {
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
	var c *conn
	if n := len(p.idle); n > 0 {
		c, p.idle = p.idle[n-1], p.idle[:n-1]
	}
	p.mu.Unlock()
	if c == nil {
		var err error
		if c, err = connect(ctx, p.cfg, nil); err != nil {
			return err
		}
	}
	err := fn(c)
	p.mu.Lock()
	if c.idle() && !p.closed {
		p.idle = append(p.idle, c)
		c = nil
	}
	p.mu.Unlock()
	if c != nil {
		// Closed, or left in a transaction.
		c.close()
	}
	return err
}

// close closes the idle connections; those lent are closed when returned.
func (p *pool) close() {
	p.mu.Lock()
	idle := p.idle
	p.closed, p.idle = true, nil
	p.mu.Unlock()
	for _, c := range idle {
		c.close()
	}
}
