package backends

import (
	"sync"
	"sync/atomic"
)

// Loss is the liveness of one lease as a store tracks it: it records,
// once, why the lease was lost and closes a channel when it happens, and
// it lets exactly one Release do the work. Stores embed one to implement
// Grant.Lost and Grant.Err. Use NewLoss.
type Loss struct {
	ch       chan struct{}
	mu       sync.Mutex
	err      error
	released atomic.Bool
}

// NewLoss returns a Loss that has not happened.
func NewLoss() *Loss { return &Loss{ch: make(chan struct{})} }

// Lost is closed once Set was called.
func (l *Loss) Lost() <-chan struct{} { return l.ch }

// Err is the first error given to Set, nil before.
func (l *Loss) Err() error {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.err
}

// Set records err, which should wrap ErrLeaseLost, as the reason and
// closes Lost; later calls do nothing.
func (l *Loss) Set(err error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	if l.err == nil {
		l.err = err
		close(l.ch)
	}
}

// BeginRelease reports whether this is the first call: Grant.Release does
// its work only then, and returns nil at once on every later call.
func (l *Loss) BeginRelease() bool { return !l.released.Swap(true) }
