// Package runner owns the leadership loop: campaign, start the child with its
// fencing token, renew the lease and watch for its loss, stop the child, and
// release the lease only once the child is gone.
//
// The runner owns time; backends only speak to their store. The promises it
// keeps are S1-S10 of docs/safety.md, which also argues why they hold. It
// measures the renew deadline on the monotonic clock from the send time of
// the last renewal the store acknowledged (S2), so that the child is
// stopped before the store can let another candidate take over.
//
// What the runner cannot guarantee: a process that is paused (GC, SIGSTOP,
// VM freeze) cannot act during the pause. It signals the child the moment it
// resumes (S7), but the child may have resumed too and may issue a write in
// between. Resources must check $FENCE_TOKEN to be safe against that.
package runner

import (
	"errors"
	"fmt"
	"log/slog"
	"os"
	"syscall"
	"time"

	"github.com/leaderrun/leaderrun/backends"
	"github.com/leaderrun/leaderrun/signals"
)

// Defaults of the timing flags (README, "Flags of run").
const (
	DefaultLeaseDuration = 15 * time.Second
	DefaultRenewDeadline = 10 * time.Second
	DefaultRetryPeriod   = 2 * time.Second
	DefaultKillGrace     = 3 * time.Second
)

// Config is everything one run needs. Zero values are noted per field.
type Config struct {
	// Backend is the store to campaign in. Required.
	Backend backends.Backend
	// Lock and Identity are passed to the child and shown in logs.
	Lock     string
	Identity string

	// LeaseDuration is the TTL asked of the store: how long after the last
	// renewal another candidate may take over. Longer means slower failover
	// after a crash; shorter means a slow store or a GC pause can cost
	// leadership. Must exceed RenewDeadline + KillGrace so that the child is
	// dead before the store lets the lease go. Default 15 s.
	LeaseDuration time.Duration

	// RenewDeadline is how long the runner tolerates no acknowledged renewal,
	// counted from the send time of the last one, before it stops the child.
	// Too short stops healthy jobs on a brief store hiccup; too long leaves
	// too little of the lease for the kill grace. Default 10 s.
	RenewDeadline time.Duration

	// RetryPeriod is the interval between renewals, and between retries of a
	// failed one. Must be well under RenewDeadline (RenewDeadline > 1.2 ×
	// RetryPeriod) so that several attempts fit. Default 2 s.
	RetryPeriod time.Duration

	// KillGrace is the time between KillSignal and SIGKILL. Default 3 s.
	KillGrace time.Duration

	// KillSignal is the first signal sent to stop the child. Default SIGTERM.
	KillSignal syscall.Signal

	// Try returns ErrNotAcquired at once if the lock is held.
	Try bool

	// Wait gives up with ErrNotAcquired after this long. Zero waits forever.
	Wait time.Duration

	// MinHold keeps leadership at least this long after the child starts,
	// even if the child exits sooner, so that a late cron run on another
	// host finds the lock held. Zero: release as soon as the child exits.
	MinHold time.Duration

	// Path is the child's resolved executable and Args its argv, Args[0]
	// included.
	Path string
	Args []string

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

	// Supervisor, if set, was prepared for Path and Args by the caller as
	// early as it could (see signals.Prepare: it starts the command's
	// watchdog); Run starts the command with it or aborts it. Nil: Run
	// prepares one when it starts to campaign.
	Supervisor *signals.Supervisor
}

// ConfigError is a configuration that cannot be run safely.
type ConfigError struct{ msg string }

func (e *ConfigError) Error() string { return e.msg }

func configErrorf(format string, args ...any) error {
	return &ConfigError{msg: fmt.Sprintf(format, args...)}
}

func (c *Config) setDefaults() {
	if c.LeaseDuration == 0 {
		c.LeaseDuration = DefaultLeaseDuration
	}
	if c.RenewDeadline == 0 {
		c.RenewDeadline = DefaultRenewDeadline
	}
	if c.RetryPeriod == 0 {
		c.RetryPeriod = DefaultRetryPeriod
	}
	if c.KillGrace == 0 {
		c.KillGrace = DefaultKillGrace
	}
	if c.KillSignal == 0 {
		c.KillSignal = syscall.SIGTERM
	}
	if c.Env == nil {
		c.Env = os.Environ()
	}
	if c.Log == nil {
		c.Log = slog.Default()
	}
	if c.Observer == nil {
		c.Observer = nopObserver{}
	}
}

// MaxDuration bounds every lease-related duration (--lease-duration,
// --renew-deadline, --retry-period, --kill-grace): a day is longer than
// any store's lease needs to be, and with every term bounded the sums below
// cannot overflow.
const MaxDuration = 24 * time.Hour

// ValidateTimings checks how the timings relate, as client-go's elector
// does. The names are those of the flags, since that is what a user fixes.
func ValidateTimings(lease, deadline, retry, grace time.Duration) error {
	for _, d := range []struct {
		name string
		v    time.Duration
	}{{"--lease-duration", lease}, {"--renew-deadline", deadline}, {"--retry-period", retry}, {"--kill-grace", grace}} {
		if d.v <= 0 {
			return configErrorf("%s must be greater than 0, got %v", d.name, d.v)
		}
		if d.v > MaxDuration {
			return configErrorf("%s %v is longer than the %v this tool accepts", d.name, d.v, MaxDuration)
		}
	}
	// Each term is at most a day, so these sums and products are far from
	// overflowing an int64 of nanoseconds.
	if lease <= deadline+grace {
		return configErrorf("--lease-duration (%v) must be greater than --renew-deadline (%v) + --kill-grace (%v), "+
			"or the child could outlive the lease", lease, deadline, grace)
	}
	if 5*deadline <= 6*retry {
		return configErrorf("--renew-deadline (%v) must be greater than 1.2 × --retry-period (%v)", deadline, retry)
	}
	return nil
}

// Validate checks, as Run does first, everything Run depends on: the
// timings, and the lease duration against what the store accepts. A caller
// that starts things before Run (cmd) calls it first, so that a bad
// configuration stops before anything started.
func (c Config) Validate() error {
	c.setDefaults()
	return c.validate()
}

func (c *Config) validate() error {
	if err := ValidateTimings(c.LeaseDuration, c.RenewDeadline, c.RetryPeriod, c.KillGrace); err != nil {
		return err
	}
	if chk, ok := c.Backend.(backends.LeaseDurationChecker); ok {
		if err := chk.CheckLeaseDuration(c.LeaseDuration); err != nil {
			return configErrorf("--lease-duration %v: %v", c.LeaseDuration, err)
		}
	}
	if c.OnceKey != "" && c.OnceKeep <= 0 {
		return configErrorf("a once-key needs a marker lifetime")
	}
	return nil
}

// ValidateGrantedTTL checks the TTL the store actually granted for the
// lease duration asked, which may differ from it (etcd rounds to whole
// seconds; ZooKeeper's TTL leaves out how much earlier than its session
// timeout an ensemble may expire a session). Zero means the lease never
// expires by itself. The message says which lease duration would do, on
// the assumption that the store grants what is asked less the same
// amount, as it does unless it caps the TTL.
func ValidateGrantedTTL(ttl, asked, deadline, grace time.Duration) error {
	if ttl > 0 && ttl <= deadline+grace {
		return configErrorf("the store granted a lease of %v for --lease-duration %v, not more than --renew-deadline (%v) + --kill-grace (%v): "+
			"raise --lease-duration above %v, or lower --renew-deadline or --kill-grace", ttl, asked, deadline, grace, asked+deadline+grace-ttl)
	}
	return nil
}

// Errors that end a run without the child's own status.
var (
	// ErrNotAcquired: --try found the lock held, or --wait ran out.
	ErrNotAcquired = errors.New("runner: leadership not acquired")
	// ErrLeadershipLost: the lease was lost while the child ran and the
	// child was stopped. LostError carries the detail.
	ErrLeadershipLost = errors.New("runner: leadership lost")
)

// NotAcquiredError says why leadership was not acquired; it unwraps to
// ErrNotAcquired.
type NotAcquiredError struct{ Reason string }

func (e *NotAcquiredError) Error() string { return e.Reason }
func (e *NotAcquiredError) Unwrap() error { return ErrNotAcquired }

// LostError says why leadership was lost while the child ran.
type LostError struct {
	Reason error
}

func (e *LostError) Error() string   { return fmt.Sprintf("leadership lost: %v", e.Reason) }
func (e *LostError) Unwrap() []error { return []error{ErrLeadershipLost, e.Reason} }

// DoneError: the run for the once-key had already completed; nothing ran.
type DoneError struct{ Marker backends.Marker }

func (e *DoneError) Error() string {
	return fmt.Sprintf("the run for %q was completed by %s (token %d) at %s", e.Marker.Key, e.Marker.Identity,
		e.Marker.Token, e.Marker.At.UTC().Format(time.RFC3339))
}

// InterruptedError: a signal withdrew the candidacy before leadership was won.
type InterruptedError struct{ Signal syscall.Signal }

func (e *InterruptedError) Error() string {
	return fmt.Sprintf("interrupted by %s while waiting for leadership", signals.Name(e.Signal))
}
