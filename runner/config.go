package runner

import (
	"fmt"
	"log/slog"
	"os"
	"syscall"
	"time"

	"github.com/leaderrun/leaderrun/backends"
	"github.com/leaderrun/leaderrun/signals"
)

// The command line's defaults of the timing flags (README, "Flags of
// run"). The runner has no defaults for them: a caller sets all four.
const (
	DefaultLeaseDuration = 15 * time.Second
	DefaultRenewDeadline = 10 * time.Second
	DefaultRetryPeriod   = 2 * time.Second
	DefaultKillGrace     = 3 * time.Second
)

// Config is everything one run needs. New validates it and sets the
// defaults noted per field.
type Config struct {
	// Backend is the store to campaign in. Required.
	Backend backends.Backend
	// Lock and Identity are passed to the child and shown in logs.
	// Identity is stored with the lock for status; empty:
	// "hostname:pid".
	Lock     string
	Identity string

	// LeaseDuration is the TTL asked of the store: how long after the last
	// renewal another candidate may take over. Longer means slower failover
	// after a crash; shorter means a slow store or a GC pause can cost
	// leadership. Must exceed RenewDeadline + Child.KillGrace so that the
	// child is dead before the store lets the lease go. Required; the
	// command line's default is DefaultLeaseDuration.
	LeaseDuration time.Duration

	// RenewDeadline is how long the runner tolerates no acknowledged renewal,
	// counted from the send time of the last one, before it stops the child.
	// Too short stops healthy jobs on a brief store hiccup; too long leaves
	// too little of the lease for the kill grace. Required; the command
	// line's default is DefaultRenewDeadline.
	RenewDeadline time.Duration

	// RetryPeriod is the interval between renewals, and between retries of a
	// failed one. Must be well under RenewDeadline (RenewDeadline > 1.2 ×
	// RetryPeriod) so that several attempts fit. Required; the command
	// line's default is DefaultRetryPeriod.
	RetryPeriod time.Duration

	// Try returns ErrNotAcquired at once if the lock is held.
	Try bool

	// Wait gives up with ErrNotAcquired after this long. Zero waits forever.
	Wait time.Duration

	// MinHold keeps leadership at least this long after the child starts,
	// even if the child exits sooner, so that a late cron run on another
	// host finds the lock held. Zero: release as soon as the child exits.
	MinHold time.Duration

	// Child is the command and how it is stopped: Path (resolved, see
	// signals.Resolve) and Args (Args[0] included) are required;
	// KillSignal starts the stop sequence (zero: SIGTERM); KillGrace,
	// from the kill signal to SIGKILL of the whole tree, is required and
	// counts against LeaseDuration. Log zero: Log with the lock and
	// identity.
	Child signals.Spec

	// Env is the environment the child inherits before leaderrun's own
	// variables are set. Nil: os.Environ().
	Env []string

	// Unset are variables removed from the child's environment: the
	// store's credentials, whose only purpose is the lock (a job holding
	// them could delete other locks' keys). Nil: none.
	Unset []string

	// Signals delivers the signals leaderrun receives (signals.Forwarded).
	// Nil: the runner reacts to no signal.
	Signals <-chan os.Signal

	// Log receives one line per event. Nil: slog.Default().
	Log *slog.Logger

	// Observer is told of every state change (sd_notify, metrics, check).
	// Nil: nobody.
	Observer Observer

	// Socket is the unix socket that `leaderrun check` in the child asks,
	// passed as LEADERRUN_SOCKET. Empty: not set.
	Socket string

	// OnceKey, if set, makes the run happen at most once per key: a leader
	// that finds the key's completion marker in the store runs nothing
	// and Run returns *DoneError; a child that exits 0 while the lease
	// still holds gets the marker written, fenced by the lease. Empty: no
	// markers. cmd derives it from --once-per (the period's number) or
	// --once-key.
	OnceKey string

	// OnceKeep is how long the store keeps a marker. Required with OnceKey.
	OnceKeep time.Duration

	// ProgressTimeout, if set, stops the child when it goes this long
	// without a progress report (Progress), counted from its start or its
	// last report: the same stop sequence as a loss, then the lease is
	// released so that another host can take over, and Run returns a
	// *StalledError. Too short stops a healthy job between two reports;
	// too long leaves a wedged job holding the lock. At least
	// MinProgressTimeout, at most MaxWait. Zero: progress is not watched.
	ProgressTimeout time.Duration

	// Progress carries the child's reports (the check socket's
	// `leaderrun check --progress`). Required with ProgressTimeout;
	// ignored without it.
	Progress *Progress

	// Holders is the size of the pool (--holders N): up to N holders of
	// the lock at once, each in a slot of its own (see pool.go and
	// docs/safety.md, "Pools"), 1 to MaxHolders. Every candidate of a
	// lock must use the same N. Zero: 1, the lock alone.
	Holders int

	// OncePerSlot makes the once-key's marker count in the own slot only;
	// by default a marker in any slot of the pool counts. Needs OnceKey.
	OncePerSlot bool
}

// setDefaults fills in the fields whose zero value stands for a default.
func (c *Config) setDefaults() {
	if c.Identity == "" {
		host, err := os.Hostname()
		if err != nil {
			host = "unknown"
		}
		c.Identity = fmt.Sprintf("%s:%d", host, os.Getpid())
	}
	if c.Child.KillSignal == 0 {
		c.Child.KillSignal = syscall.SIGTERM
	}
	if c.Env == nil {
		c.Env = os.Environ()
	}
	if c.Log == nil {
		c.Log = slog.Default()
	}
	if c.Child.Log == nil {
		c.Child.Log = c.Log.With("lock", c.Lock, "identity", c.Identity)
	}
	if c.Observer == nil {
		c.Observer = nopObserver{}
	}
	if c.Holders == 0 {
		c.Holders = 1
	}
}
