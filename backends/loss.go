package backends

import "sync"

// Loss is the liveness of one lease as a backend tracks it: it records,
// once, why the lease was lost and closes a channel when it happens, and it
// lets exactly one Release do the work. Backends embed one to implement
// Lease.Lost and Lease.Err. Its zero value is not usable; use NewLoss.
type Loss struct {
	ch       chan struct{}
	mu       sync.Mutex
	err      error
	released bool
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

// BeginRelease reports whether this is the first call: Lease.Release does
// its work only then, and returns nil at once on every later call (the
// contract of Lease.Release). It is safe for concurrent use.
func (l *Loss) BeginRelease() bool {
	l.mu.Lock()
	defer l.mu.Unlock()
	first := !l.released
	l.released = true
	return first
}
