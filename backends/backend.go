// Package backends is leaderrun's one election loop (Campaign) and the
// narrow interfaces a coordination store implements under it, split as in
// client-go's leaderelection and etcd's concurrency package: a store keeps
// state, and the loop that decides when to try, wait, retry, give up and
// take over exists once, here. A store is opened once (Store) and hands
// out locks by name; a lock holds no connection of its own, so the slots
// of a pool (--holders) are more locks, named by SlotLock. A lock is a
// RecordLock (a compare-and-set record, as client-go's resourcelock) or a
// QueueLock (a queue the store orders, as etcd's Election), and keeps its
// history and completion markers beside its lease (journal.go).
// docs/adding-a-store.md walks a new store through them.
//
// One rule for who renews: from the moment a campaign returns a lease, the
// runner's renewals are the only renewals of it. A store may keep a
// session alive while a candidate waits in line (a waiter has no deadline
// yet), but stops before it hands out the grant, so that a lease the
// runner has stopped renewing is never kept alive behind its back.
// ZooKeeper is the one exception the store imposes: its client heartbeats
// the session by protocol, so there a renewal proves that the session and
// the leader's znode are still ours instead of extending anything
// (docs/safety.md).
package backends

import (
	"context"
	"errors"
	"time"
)

// Shared errors. Stores wrap them with detail (endpoint, key, cause). A
// store's failure that may pass must wrap ErrUnavailable, or the driver
// takes it for final and ends the campaign.
var (
	// ErrLocked means the lock is held by another candidate and the
	// candidate asked not to wait (--try), or its --wait ran out.
	ErrLocked = errors.New("backends: lock held by another candidate")
	// ErrUnavailable means the store could not be reached, or refused
	// the request, before leadership was won.
	ErrUnavailable = errors.New("backends: store unavailable")
	// ErrRefused marks what asking again cannot fix: the store refused
	// the request (credentials, permissions), or answered as no store of
	// its kind does (too large, malformed, a redirect). It always comes
	// with ErrUnavailable, and ends a campaign in every mode.
	ErrRefused = errors.New("backends: refused")
	// ErrLeaseLost means the store reports that this candidate's lease is
	// gone: revoked, expired, its key deleted or taken by another.
	ErrLeaseLost = errors.New("backends: lease lost")
	// ErrConflict means a conditional write found the record or document
	// changed since it was read: read it again and decide again.
	ErrConflict = errors.New("backends: changed since it was read")
	// ErrEnded means a waiting candidacy ended before it won (its
	// session expired or was destroyed): the driver joins again.
	ErrEnded = errors.New("backends: candidacy ended while waiting")
	// ErrCorruptState means state the store keeps itself (the local
	// store's token counter) is corrupt or unreadable: going on could
	// hand out a token granted before, so it stops and names the file.
	ErrCorruptState = errors.New("backends: stored state is corrupt or unreadable")
	// ErrUnsafeState means the place the store keeps its state in (the
	// local store's directory) could be tampered with by another user.
	ErrUnsafeState = errors.New("backends: state directory is not safe")
)

// Store is an open connection to one coordination store. Close it after
// every lease was released.
type Store interface {
	// Name is the backend's name as the command line spells it ("etcd").
	Name() string
	// Lock returns the lock named name (one ValidateLockName accepts, or
	// a slot's from SlotLock): a RecordLock or a QueueLock that uses the
	// store's connections. It does no I/O and cannot fail.
	Lock(name string) Lock
	Close() error
}

// TimingsChecker is implemented by stores that cannot keep every timing
// (Consul takes lease durations of 10 s to 24 h; Azure Blob, 15 to 60 s;
// Kubernetes whole seconds that client-go electors see change). runner.New
// asks before it campaigns, so that such timings are a configuration
// error, not a surprise after the grant. The message names the flags.
type TimingsChecker interface {
	CheckTimings(t Timings) error
}

// Lock is one lock of a store, with the documents it keeps beside its
// lease.
type Lock interface {
	// Key is where the lock lives in the store (a key, a row, an
	// object, a file), for messages and status.
	Key() string
	// ReadDoc reads the lock's document name (DocHistory, DocMarkers),
	// bounded to MaxDoc. One that does not exist reads as a Doc with nil
	// Data and nil Version.
	ReadDoc(ctx context.Context, name string) (Doc, error)
	// WriteDoc replaces document d.Name with d.Data if it is still at
	// d.Version (nil: only if it does not exist), else returns
	// ErrConflict. It needs no lease: a leader that lost its lease still
	// records its term.
	WriteDoc(ctx context.Context, d Doc) error
}

// Doc is one of a lock's documents, and the version a conditional write
// of it is conditioned on.
type Doc struct {
	Name string // DocHistory or DocMarkers
	Data []byte // at most MaxDoc bytes; nil if none exists
	// Version is the store's own version of what was read (a revision,
	// an index, an ETag), opaque to the driver; nil if none exists.
	Version any
}

// The documents of a lock.
const (
	DocHistory = "history"
	DocMarkers = "markers"
)

// MaxDoc bounds a document, read or written, in every store.
const MaxDoc = 128 << 10

// Claim is what a candidate asks of a store.
type Claim struct {
	// Identity is stored with the lock for status. Never empty.
	Identity string
	// Owner is a random value, new for every candidacy, written with
	// the grant where the store's record has room for it: it tells this
	// candidacy's grant from any other, even one of the same identity
	// (a grant whose answer was lost is recognised by it).
	Owner string
	// Holders is the pool size recorded in the holder's record: 0 for a
	// lock of one holder, whose record is then exactly what leaderrun
	// wrote before pools existed.
	Holders int
	// Timings: a store asks for LeaseDuration as the TTL, and paces and
	// bounds its requests by RetryPeriod and AttemptTimeout.
	Timings Timings
}

// Grant is a lease that a QueueLock handed out. Its methods are safe for
// concurrent use.
type Grant interface {
	// Token is the fencing token: strictly greater than the token of
	// every earlier grant of the same lock in the same store.
	Token() uint64
	// TTL is the lease lifetime the store granted, which may differ from
	// what was asked (etcd rounds to whole seconds and raises small
	// values): how long after its last renewal the store may let another
	// candidate take over.
	TTL() time.Duration
	// Acquired is the send time of the latest request the store
	// acknowledged while the lease was alive, at or before the grant.
	Acquired() time.Time
	// Renew asks the store to extend the lease once and returns nil only
	// if it acknowledged. An error wrapping ErrLeaseLost means the lease
	// is gone for good; others may pass.
	Renew(ctx context.Context) error
	// Lost is closed when the store reports the lease gone (revoked,
	// expired, key deleted or taken): the fast path of S3. Err says why;
	// nil before.
	Lost() <-chan struct{}
	Err() error
	// WriteDoc is Lock.WriteDoc fenced by this grant, in one conditional
	// write that succeeds only while the grant holds the lock. If it
	// does not, nothing is written and the error wraps ErrLeaseLost.
	WriteDoc(ctx context.Context, d Doc) error
	// Release gives the lock up. It is safe to call after Lost closed
	// and more than once.
	Release(ctx context.Context) error
}

// QueueLock is a lock whose store orders its candidates in a queue.
type QueueLock interface {
	Lock
	// Status reports who holds the lock, without campaigning; the
	// driver fills in Lock, Backend and Key.
	Status(ctx context.Context) (Status, error)
	// Join enters c in the lock's queue, in a session of its own that
	// the store keeps alive while the candidate waits. With try it may
	// answer ErrLocked at once, leaving no trace, if another candidate
	// holds the lock.
	Join(ctx context.Context, c Claim, try bool) (Ticket, error)
}

// Ticket is a candidate's place in a QueueLock's queue.
type Ticket interface {
	// Lead waits until the ticket is first in line and returns the
	// grant. A ticket joined with try answers ErrLocked at once if
	// another candidate is ahead. ErrEnded: the ticket's session ended
	// while it waited; the driver leaves and joins again. Cancelling ctx
	// returns its error; the driver then leaves.
	Lead(ctx context.Context) (Grant, error)
	// Leave withdraws the candidacy: its entry, its session, and a grant
	// it may hold without having learnt so. It does nothing once Lead
	// returned a grant (the grant is released instead).
	Leave(ctx context.Context) error
}

// RecordLock is a lock kept as one compare-and-set record.
type RecordLock interface {
	Lock
	// Get reads the lock's record: Version "" if there is none.
	Get(ctx context.Context) (Record, error)
	// Take grants the lock to c, conditional on the stored record still
	// being prev (by its Version; "": only if there is none), or, for a
	// store whose own clock times its leases, on the record being free or
	// run out by that clock when the write is made. It draws a new token,
	// and returns the record it wrote. ErrConflict: the record changed
	// since prev was read. ErrLocked: the store keeps the free lock for a
	// waiter ahead of c in its queue (c waits to be woken). Any other
	// error may or may not have written it (a lost answer); the driver
	// then looks for c.Owner when it withdraws.
	Take(ctx context.Context, prev Record, c Claim) (Record, error)
	// Keep renews held, the record this candidate holds, and returns it
	// with what the renewal changed (its Version, its Renewed time), its
	// Handle kept. An error wrapping ErrLeaseLost if the record is no
	// longer held's (by owner or version, as the store can tell); the
	// driver then reads the record once to say what became of it, unless
	// the store is a HeldChecker (its refusal says why).
	Keep(ctx context.Context, held Record) (Record, error)
	// Free gives held up; nil if it is no longer held's. The record may
	// stay, freed, as proof of the last token granted. held may be a
	// record Get returned (a grant whose answer was lost, found again),
	// with no Handle.
	Free(ctx context.Context, held Record) error
	// WriteDocHeld is WriteDoc fenced by held, as Grant.WriteDoc.
	WriteDocHeld(ctx context.Context, d Doc, held Record) error
	// Follow starts following the record for the candidacy c while it
	// waits (held nil) or, once it holds the lock, for the holder of
	// held, to learn of a loss at once. A nil Follower (and nil error):
	// the store cannot tell of changes, and the driver looks again every
	// retry period while waiting, and relies on renewals while holding.
	// An error wrapping ErrRefused (a watch that permissions forbid)
	// ends the campaign.
	Follow(ctx context.Context, c Claim, held *Record) (Follower, error)
}

// HeldChecker is implemented by record stores that can tell whether a
// grant still holds the lock better than a read of the record can (an
// Azure blob lease, whose id only its holder knows): when the holder's
// Follower says to look again, the driver asks Check instead of reading
// the record. Check returns an error wrapping ErrLeaseLost if held no
// longer holds the lock, nil if it does; other errors decide nothing. It
// must not renew anything.
type HeldChecker interface {
	Check(ctx context.Context, held Record) error
}

// Follower tells a candidate or a holder when to look at a record again.
type Follower interface {
	// Changed receives when the record may have changed, or when a
	// waiter became first in the store's queue of waiters. Several
	// changes may arrive as one. It is never closed.
	Changed() <-chan struct{}
	// Behind reports whether another waiter is ahead of this one in the
	// store's queue of waiters: the one ahead times the holder and takes
	// the lock, and this one waits to be woken (always false for stores
	// without a queue).
	Behind() bool
	// Close stops following, and leaves the queue of waiters. It
	// returns promptly, whatever the store does: what it must still
	// send, it sends on a bounded context.
	Close()
}

// Record is a lock's lease as a RecordLock keeps it.
type Record struct {
	// Holder is the identity of the holder; "" if the lock is free.
	Holder string
	// Owner is the holder's Claim.Owner, "" if the store's record has no
	// room for it or the holder is not a leaderrun (a client-go elector
	// on a Kubernetes Lease).
	Owner   string
	Token   uint64 // of the holder's grant; 0 if none
	Holders int    // the pool size recorded at the grant (Claim.Holders)
	// TTL is the lease duration the holder's grant asked for, as the
	// store keeps it. Zero: the lease never expires by time (the local
	// store, where the kernel drops a dead holder's lock).
	TTL time.Duration
	// Acquired and Renewed are the holder's wall-clock times of its
	// grant and of its last renewal, zero where the store keeps none.
	// They are for status and for --try's guess alone, never for the
	// decision to take a lock over (hosts' clocks differ).
	Acquired, Renewed time.Time
	// Left is how long the lease has left by the store's own clock, for
	// stores that expire leases themselves: 0 once it ran out (or its
	// holder is gone), LeftUnknown while it runs if the store does not
	// say for how long. Stores that have no clock set NoClock, and the
	// driver times the record on its own monotonic clock from when it saw
	// it change.
	Left    time.Duration
	Waiting int    // the number of candidates waiting, -1 if unknown
	Node    string // the store node or host the holder is attached to, if known
	// Version identifies this state of the record and changes with every
	// write of it that the driver must notice (a grant, a renewal of a
	// store without a clock, a release); "" means there is no record.
	Version string
	// Handle is the store's own state of a grant (a lease ID, an open
	// file): Take sets it, and Keep, Free and WriteDocHeld get it back.
	Handle any
}

// Exists reports whether the store has a record.
func (r Record) Exists() bool { return r.Version != "" }

// Values of Record.Left that are not a time left.
const (
	// NoClock: the store does not expire leases by itself.
	NoClock time.Duration = -1
	// LeftUnknown: the store's clock will expire the lease, and does
	// not say when.
	LeftUnknown time.Duration = -2
)

// HistoryLimit is about how many terms a lock's history keeps.
const HistoryLimit = 100

// Marker says that the run for one once-key completed successfully: the
// command exited 0 while its leader still held the lock.
type Marker struct {
	// Key is the once-key: a period number (--once-per) or a caller's key
	// (--once-key).
	Key string `json:"key"`
	// Identity and Token are those of the leader that completed the run.
	Identity string    `json:"identity"`
	Token    uint64    `json:"token"`
	At       time.Time `json:"at"`      // when the command exited, by the completing host's clock
	Expires  time.Time `json:"expires"` // when the marker may be forgotten
}

// How a term ended (Term.End): the command exited by itself (ExitCode);
// died of a signal leaderrun did not send (Signal); was stopped because
// leaderrun was asked to (Signal: what it received); was stopped because
// the lease was lost (Reason: why); was skipped, its once-key's run having
// completed; could not be started; or reported no progress for
// --progress-timeout and was stopped (Reason: how long).
const (
	EndExited     = "exited"
	EndSignaled   = "signaled"
	EndStopped    = "stopped"
	EndLost       = "lost"
	EndSkipped    = "skipped"
	EndNotStarted = "not-started"
	EndStalled    = "stalled"
)

// Term is one leader's tenure of the lock, as recorded when it released it.
type Term struct {
	Identity string    `json:"identity"`
	Token    uint64    `json:"token"`
	Acquired time.Time `json:"acquired"`
	Started  time.Time `json:"started,omitzero"` // zero if the command never started
	Ended    time.Time `json:"ended"`            // when the lock was given up
	End      string    `json:"end"`              // one of the End constants
	// ExitCode is the command's exit status (128+N for signal N); -1 if it
	// did not run.
	ExitCode int `json:"exit_code"`
	// Signal is the signal that ended the command or that leaderrun
	// received (EndSignaled, EndStopped), e.g. "SIGTERM".
	Signal string `json:"signal,omitempty"`
	// Reason says why the lease was lost (EndLost), why the command
	// could not start, or how long it went without progress (EndStalled).
	Reason  string `json:"reason,omitempty"`
	OnceKey string `json:"once_key,omitempty"` // --once-per's or --once-key's
}

// Status is a snapshot of who holds a lock.
type Status struct {
	Lock    string `json:"lock"`
	Backend string `json:"backend"`
	Key     string `json:"key"`  // where the lock lives in the store
	Held    bool   `json:"held"` // false when nobody holds it; the fields below are then zero
	// Identity is the holder's identity as it campaigned.
	Identity string `json:"identity,omitempty"`
	Token    uint64 `json:"token,omitempty"`
	// TTL is the lease lifetime granted to the holder, zero if unknown or
	// not applicable.
	TTL time.Duration `json:"ttl_ns,omitempty"`
	// Remaining is how long the holder's lease has left before the store
	// may expire it, or -1 when the store does not tell.
	Remaining time.Duration `json:"remaining_ns,omitempty"`
	Waiting   int           `json:"waiting"`        // other candidates waiting, -1 if unknown
	Node      string        `json:"node,omitempty"` // the store node or host the holder is attached to
	// Holders is the pool size the holder recorded at its grant; 0 (none
	// recorded, a lock of one holder) means 1.
	Holders int `json:"holders,omitempty"`
}
