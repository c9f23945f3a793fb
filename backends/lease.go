package backends

import (
	"context"
	"fmt"
	"log/slog"
	"os"
	"sync/atomic"
	"time"
)

// Lease is held leadership of one lock, or of one slot of a pool: what
// Campaign returns. From the grant on, the runner's calls to Renew are its
// only renewals. Its methods are safe for concurrent use.
type Lease struct {
	g     Grant
	lock  Lock
	slots []Lock // the pool's locks, for the markers of every slot
	slot  int
	log   *slog.Logger

	released atomic.Bool
}

// Token, TTL, Acquired, Renew, Lost and Err are the grant's (Grant). A
// TTL of zero is never expired by time (the local store). The runner
// counts its first renewal deadline from Acquired, and records a
// renewal's send time before it calls Renew.
func (l *Lease) Token() uint64                   { return l.g.Token() }
func (l *Lease) TTL() time.Duration              { return l.g.TTL() }
func (l *Lease) Acquired() time.Time             { return l.g.Acquired() }
func (l *Lease) Renew(ctx context.Context) error { return l.g.Renew(ctx) }
func (l *Lease) Lost() <-chan struct{}           { return l.g.Lost() }
func (l *Lease) Err() error                      { return l.g.Err() }

// Slot is the slot of the pool the lease holds (0 for one holder).
func (l *Lease) Slot() int { return l.slot }

// Grant is the store's own grant, for a store's tests: a QueueLock's
// Grant, or for a RecordLock one whose Handle method returns the held
// record's Handle.
func (l *Lease) Grant() Grant { return l.g }

// LockFile is the open file whose lock the lease is, for stores whose lock
// is one (the local store's flock): the child's watchdog keeps it open so
// that the lock outlives leaderrun as long as the child does. Nil for
// every other store.
func (l *Lease) LockFile() *os.File {
	var h any = l.g
	if r, ok := l.g.(*recordGrant); ok {
		h = r.Handle()
	}
	if f, ok := h.(interface{ LockFile() *os.File }); ok {
		return f.LockFile()
	}
	return nil
}

// Completed returns the unexpired completion marker of the once-key key
// that counts for this lease, or nil: the marker of its own slot with
// ownSlot (or in a lock of one holder), else the first found in any slot
// of the pool, since by default the period is the pool's.
func (l *Lease) Completed(ctx context.Context, key string, ownSlot bool) (*Marker, error) {
	now := time.Now()
	if ownSlot || len(l.slots) < 2 {
		return completedIn(ctx, l.lock, key, now)
	}
	for i, lk := range l.slots {
		m, err := completedIn(ctx, lk, key, now)
		if err != nil {
			return nil, fmt.Errorf("slot %d: %w", i, err)
		}
		if m != nil {
			return m, nil
		}
	}
	return nil, nil
}

// Complete records m for the lease's lock, fenced: every write of it is
// conditional on the lease still holding the lock. If it no longer does,
// nothing is written and the error wraps ErrLeaseLost; any other error may
// or may not have written it (a lost answer), which the caller logs.
func (l *Lease) Complete(ctx context.Context, m Marker) error {
	now := time.Now()
	return updateDoc(ctx, l.lock, DocMarkers, func(data []byte) ([]byte, error) {
		return withMarker(data, m, now)
	}, l.g.WriteDoc)
}

// Release gives the lock up, then appends term to its history (nil: no
// term, for a grant under which nothing ran). The lock is given up first,
// so that the next leader waits for nothing else; the caller must have
// stopped everything that the lease protects (S8). The history is written
// even when the lease was lost, and a failure to write it is logged, not
// returned: the lock is free either way. Only the first call records term.
func (l *Lease) Release(ctx context.Context, term *Term) error {
	err := l.g.Release(ctx)
	if l.released.Swap(true) || term == nil {
		return err
	}
	if herr := appendTerm(ctx, l.lock, *term); herr != nil {
		l.log.Warn("could not record the term in the lock's history", "token", term.Token, "error", herr)
	}
	return err
}
