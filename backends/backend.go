// Package backends defines what the runner needs from a coordination store
// (S1-S9 below are the promises of docs/safety.md):
// a Backend that campaigns for one named lock and a Lease that proves, for as
// long as it is renewed, that this process holds it.
//
// A backend speaks to its store and nothing else. It never touches processes,
// and it owns no timing policy beyond what its store imposes: the runner
// decides when to renew and when a silence has lasted too long (see
// runner.Config). That split follows client-go's leaderelection, where the
// lock stores state and one elector owns time.
//
// One rule for who renews: from the moment Campaign returns a Lease, the
// runner's calls to Lease.Renew are the only renewals of it. A backend may
// keep a session alive on its own while it waits in line (a waiter has no
// runner deadline yet), but it stops doing so before Campaign returns, so
// that a lease the runner has stopped renewing (its deadline passed, the
// child is being stopped) is never kept alive behind its back. ZooKeeper is
// the one exception the store imposes: its client library heartbeats the
// session by protocol, so there Renew proves that the session and the
// leader's znode are still ours instead of extending anything.
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

	// ErrCorruptState means state kept by the backend itself (the local
	// backend's token counter) is corrupt or unreadable: going on could
	// hand out a token that was granted before, so it stops and says
	// which file.
	ErrCorruptState = errors.New("backends: stored state is corrupt or unreadable")

	// ErrUnsafeState means the place the backend keeps its state in (the
	// local backend's directory) could be tampered with by another user.
	ErrUnsafeState = errors.New("backends: state directory is not safe")
)

// Backend campaigns for one lock in one store. A Backend is bound to its lock
// name when it is built; it may be used for several campaigns in a row, but
// for one at a time.
type Backend interface {
	// Name is the backend's name as the CLI spells it: "etcd", "consul",
	// "postgres", "kubernetes", "zookeeper", "redis", "local".
	Name() string

	// Campaign blocks until this candidate holds the lock and returns the
	// lease that proves it.
	//
	// With opts.Try it returns an error wrapping ErrLocked at once if another
	// candidate holds the lock, and leaves no trace of its candidacy in the
	// store. Cancelling ctx withdraws the candidacy (its key, session or
	// queue slot) before Campaign returns ctx's error; the withdrawal runs on
	// its own short context so that a cancelled caller still cleans up.
	// An unreachable store, or one that refuses the request (credentials,
	// permissions), is an error wrapping ErrUnavailable; a refusal is final,
	// in every mode, and names what was refused.
	Campaign(ctx context.Context, opts CampaignOptions) (Lease, error)

	// Status reports who holds the lock, without campaigning.
	Status(ctx context.Context) (Status, error)

	// History returns the most recent terms of the lock, newest first, at
	// most limit of them (limit <= 0: all that the store keeps, at most
	// HistoryLimit). A lock that was never held has an empty history.
	History(ctx context.Context, limit int) ([]Term, error)

	// Completed returns the completion marker recorded for a once-key by a
	// lease of this backend's lock (see Lease.Complete), or nil if there
	// is none or it has expired. It is a plain read and needs no lease, so
	// that a candidate can read the markers of every slot of a pool (see
	// Slot) while it holds one of them.
	Completed(ctx context.Context, key string) (*Marker, error)

	// Slot returns the backend for slot i of this backend's lock: the lock
	// named SlotLock(lock, i), a lock of its own with its own lease and
	// its own tokens, reached through this backend's connections (client,
	// pool, session), so that a candidate for N slots does not open N
	// connections. Slot(0) returns the backend itself; the slots of a slot
	// backend are those of the lock it was made from. i must not be
	// negative. Closing this backend closes what its slot backends share
	// with it, so it is closed last; closing a slot backend releases only
	// what is its own.
	Slot(i int) Backend

	// Close releases the backend's connections. Leases must be released first.
	Close() error
}

// LeaseDurationChecker is implemented by backends whose store bounds the
// lease duration it accepts (Consul: 10 s to 24 h). The runner asks before
// it campaigns, so that a duration the store would refuse or change is a
// configuration error, not a surprise after the grant.
type LeaseDurationChecker interface {
	CheckLeaseDuration(d time.Duration) error
}

// CampaignOptions tune one campaign.
type CampaignOptions struct {
	// Identity is stored with the lock so that Status can show who holds it.
	Identity string

	// Try makes Campaign return ErrLocked instead of waiting when the lock
	// is held. Zero value: wait.
	Try bool

	// LeaseDuration is the lease lifetime to ask of the store: how long
	// after the last acknowledged renewal the store may let another
	// candidate take over. It comes from the runner, which owns every
	// timing (see docs/safety.md); the store may grant something else, which
	// Lease.TTL reports. Required for stores whose leases expire.
	LeaseDuration time.Duration

	// Holders is the size of the pool this candidate campaigns in
	// (--holders N: slots 0 to N-1, see SlotLock). It is recorded in the
	// holder's record at the grant, so that Status.Holders tells every
	// other candidate the N of the holder and they can all agree on it.
	// Zero value: 1, a lock of one holder, for which nothing is recorded:
	// its record is exactly what leaderrun wrote before pools existed.
	Holders int
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

	// Acquired is the send time of the latest request that the store
	// acknowledged while the lease was alive, at or before the grant. The
	// runner counts its first renewal deadline from it, and renews once
	// before it starts the child if it is old (a candidate that waited).
	// It is never later than the true start of the lease's current
	// lifetime in the store.
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

	// Complete records m for the lease's lock (Backend.Completed reads it
	// back), fenced: in one conditional write (a transaction,
	// or a write conditional on the lease's record) that succeeds only
	// while this lease still holds the lock. If the lease no longer holds,
	// nothing is written and the error wraps ErrLeaseLost; any other error
	// may or may not have written it (a lost answer), which the caller
	// logs. The store forgets the marker by itself after m.Expires.
	Complete(ctx context.Context, m Marker) error

	// Release gives the lock up and appends term to the lock's history
	// (term nil: no history, as for a candidacy that never ran anything).
	// It is safe to call after Lost was closed and more than once; only
	// the first call records term. The caller must have stopped everything
	// that the lease protects first (S8). The history is written even when
	// the lease was lost; a failure to write it does not keep the lock.
	Release(ctx context.Context, term *Term) error
}

// HistoryLimit is about how many terms a store keeps per lock; older ones
// are dropped by the writer or by the store's own expiry.
const HistoryLimit = 100

// Marker says that the run for one once-key completed successfully: the
// command exited 0 while its leader still held the lock.
type Marker struct {
	// Key is the once-key: a period number (--once-per) or a caller's key
	// (--once-key).
	Key string `json:"key"`
	// Identity and Token are those of the leader that completed the run.
	Identity string `json:"identity"`
	Token    uint64 `json:"token"`
	// At is when the command exited (wall clock of the completing host).
	At time.Time `json:"at"`
	// Expires is when the store may forget the marker.
	Expires time.Time `json:"expires"`
}

// How a term ended (Term.End).
const (
	// EndExited: the command exited by itself; ExitCode is its status.
	EndExited = "exited"
	// EndSignaled: the command died of a signal it was not sent by
	// leaderrun; Signal names it.
	EndSignaled = "signaled"
	// EndStopped: leaderrun stopped the command because it was asked to
	// (SIGTERM, SIGINT); Signal names what it received.
	EndStopped = "stopped"
	// EndLost: the lease was lost while the command ran, and leaderrun
	// stopped it; Reason says why.
	EndLost = "lost"
	// EndSkipped: the run for OnceKey had already completed; nothing ran.
	EndSkipped = "skipped"
	// EndNotStarted: the command could not be started.
	EndNotStarted = "not-started"
	// EndStalled: the command reported no progress for
	// --progress-timeout, and leaderrun stopped it; Reason says how long.
	EndStalled = "stalled"
)

// Term is one leader's tenure of the lock, as recorded when it released it.
type Term struct {
	Identity string    `json:"identity"`
	Token    uint64    `json:"token"`
	Acquired time.Time `json:"acquired"`
	// Started is when the command started; zero if it never did.
	Started time.Time `json:"started,omitzero"`
	// Ended is when the lock was given up.
	Ended time.Time `json:"ended"`
	// End is how the term ended: EndExited, EndSignaled, EndStopped,
	// EndLost, EndSkipped, EndNotStarted or EndStalled.
	End string `json:"end"`
	// ExitCode is the command's exit status (128+N for signal N); -1 if it
	// did not run.
	ExitCode int `json:"exit_code"`
	// Signal is the signal that ended the command or that leaderrun
	// received (EndSignaled, EndStopped), e.g. "SIGTERM".
	Signal string `json:"signal,omitempty"`
	// Reason says why the lease was lost (EndLost), why the command
	// could not start, or how long it went without progress (EndStalled).
	Reason string `json:"reason,omitempty"`
	// OnceKey is the once-key of the run, if --once-per or --once-key was set.
	OnceKey string `json:"once_key,omitempty"`
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
	// Holders is the pool size the holder campaigned with
	// (CampaignOptions.Holders), as recorded at its grant; 0 when none is
	// recorded (a lock of one holder, or a holder of a leaderrun that
	// predates pools), which means 1.
	Holders int `json:"holders,omitempty"`
}
