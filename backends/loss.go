package backends

import "sync"

// Loss records, once, why a lease was lost, and closes a channel when it
// happens. Backends embed one to implement Lease.Lost and Lease.Err. Its
// zero value is not usable; use NewLoss.
type Loss struct {
	ch  chan struct{}
	mu  sync.Mutex
	err error
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

// Set records err as the reason and closes Lost; later calls do nothing.
// err should wrap ErrLeaseLost.
func (l *Loss) Set(err error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	if l.err == nil {
		l.err = err
		close(l.ch)
	}
}
