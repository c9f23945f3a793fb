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

// Config is everything one run needs. New validates it and sets the
// defaults noted per field.
type Config struct {
	// Store is the store to campaign in. Required.
	Store backends.Store
	// Lock and Identity are passed to the child and shown in logs.
	// Identity is stored with the lock for status; empty:
	// "hostname:pid".
	Lock     string
	Identity string

	// Timings are the lease's timings (backends.Timings, whose fields
	// say what each means and what goes wrong if it is too short or too
	// long): validated by New, and handed to the store with every
	// campaign. KillGrace is also the child's, from the kill signal to
	// SIGKILL of the whole tree. Required; the command line's defaults
	// are backends.DefaultTimings.
	Timings backends.Timings

	// Try returns ErrNotAcquired at once if the lock is held.
	Try bool

	// Wait gives up with ErrNotAcquired after this long. Zero waits forever.
	Wait time.Duration

	// MinHold keeps leadership at least this long after the child starts,
	// even if the child exits sooner, so that a late cron run on another
	// host finds the lock held. Zero: release as soon as the child exits.
	MinHold time.Duration

	// Child is the command and how it is stopped: Path (resolved, see
	// command.Resolve) and Args (Args[0] included) are required;
	// KillSignal starts the stop sequence (zero: SIGTERM); KillGrace is
	// Timings.KillGrace (New sets it). Log zero: Log with the lock and
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
	// docs/safety.md, "Pools"), 1 to backends.MaxHolders. Every candidate of a
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
	c.Child.KillGrace = c.Timings.KillGrace
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
