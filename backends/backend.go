// Package backends defines what the runner needs from a coordination store:
// a Backend that campaigns for one named lock and a Lease that proves, for as
// long as it is renewed, that this process holds it.
//
// A backend speaks to its store and nothing else. It never touches processes,
// and it owns no timing policy beyond what its store imposes: the runner
// decides when to renew and when a silence has lasted too long (see
// runner.Config). That split follows client-go's leaderelection, where the
// lock stores state and one elector owns time.
package backends

import (
	"context"
	"errors"
	"time"
)

// Shared errors. Backends wrap them with detail (endpoint, key, cause) so that
// callers can test with errors.Is and still print a useful message.
var (
	// ErrLocked means the lock is held by another candidate and the caller
	// asked not to wait (CampaignOptions.Try).
	ErrLocked = errors.New("backends: lock held by another candidate")

	// ErrUnavailable means the store could not be reached, or refused the
	// request (authentication, permissions), before leadership was won.
	ErrUnavailable = errors.New("backends: store unavailable")

	// ErrLeaseLost means the store reports that this candidate's lease is
	// gone: revoked, expired, its key deleted or taken by another session.
	ErrLeaseLost = errors.New("backends: lease lost")
)

// Backend campaigns for one lock in one store. A Backend is bound to its lock
// name when it is built; it may be used for several campaigns in a row, but
// for one at a time.
type Backend interface {
	// Name is the backend's name as the CLI spells it: "etcd", "consul", "local".
	Name() string

	// Campaign blocks until this candidate holds the lock and returns the
	// lease that proves it.
	//
	// With opts.Try it returns an error wrapping ErrLocked at once if another
	// candidate holds the lock, and leaves no trace of its candidacy in the
	// store. Cancelling ctx withdraws the candidacy (its key, session or
	// queue slot) before Campaign returns ctx's error; the withdrawal runs on
	// its own short context so that a cancelled caller still cleans up.
	// An unreachable store is an error wrapping ErrUnavailable.
	Campaign(ctx context.Context, opts CampaignOptions) (Lease, error)

	// Status reports who holds the lock, without campaigning.
	Status(ctx context.Context) (Status, error)

	// Close releases the backend's connections. Leases must be released first.
	Close() error
}

// CampaignOptions tune one campaign.
type CampaignOptions struct {
	// Identity is stored with the lock so that Status can show who holds it.
	Identity string

	// Try makes Campaign return ErrLocked instead of waiting when the lock
	// is held. Zero value: wait.
	Try bool
}

// Lease is held leadership. Its methods are safe for concurrent use.
type Lease interface {
	// Token is the fencing token of this grant: strictly greater than the
	// token of every earlier grant of the same lock in the same store.
	Token() uint64

	// TTL is the lease lifetime the store actually granted, which may differ
	// from what was asked (etcd rounds to whole seconds and raises small
	// values). It is how long after its last renewal the store may let
	// another candidate take over. Zero means the store never expires the
	// lease on its own (the local backend: the kernel drops the lock when
	// the process dies).
	TTL() time.Duration

	// Acquired is the send time of a request that the store acknowledged
	// while the lease was alive, at or before the grant. The runner measures
	// its first renewal deadline from it. It is never later than the true
	// start of the lease's current lifetime in the store.
	Acquired() time.Time

	// Renew asks the store to extend the lease once and returns nil only if
	// the store acknowledged it. The caller records the send time before
	// calling. An error wrapping ErrLeaseLost means the lease is gone for
	// good; other errors may be transient.
	Renew(ctx context.Context) error

	// Lost is closed when the store reports the lease gone (revoked,
	// expired, key deleted or taken). It is the fast path of S3; a store
	// that cannot report loss never closes it and relies on Renew.
	Lost() <-chan struct{}

	// Err says why Lost was closed; nil while the lease is believed held.
	Err() error

	// Release gives the lock up. It is safe to call after Lost was closed
	// and more than once. The caller must have stopped everything that the
	// lease protects first (S8).
	Release(ctx context.Context) error
}

// Status is a snapshot of who holds a lock.
type Status struct {
	// Lock is the lock name.
	Lock string `json:"lock"`
	// Backend is the backend's name.
	Backend string `json:"backend"`
	// Key is where the lock lives in the store (a key, or a file path).
	Key string `json:"key"`
	// Held is false when nobody holds the lock; the fields below are then zero.
	Held bool `json:"held"`
	// Identity is the holder's identity as it campaigned.
	Identity string `json:"identity,omitempty"`
	// Token is the holder's fencing token.
	Token uint64 `json:"token,omitempty"`
	// TTL is the lease lifetime granted to the holder, zero if unknown or
	// not applicable.
	TTL time.Duration `json:"ttl_ns,omitempty"`
	// Remaining is how long the holder's lease has left before the store
	// may expire it, or -1 when the store does not tell.
	Remaining time.Duration `json:"remaining_ns,omitempty"`
	// Waiting is the number of other candidates waiting, or -1 when the
	// store does not tell.
	Waiting int `json:"waiting"`
	// Node is the store node or host the holder is attached to, if known.
	Node string `json:"node,omitempty"`
}
