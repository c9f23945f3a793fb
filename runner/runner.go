package runner

import (
	"context"
	"errors"
	"log/slog"

	"github.com/leaderrun/leaderrun/signals"
)

// Runner is one run of a command under a lock: New validates it and
// readies the command's watchdog, Run campaigns and runs the command while
// leading.
type Runner struct {
	cfg Config
	log *slog.Logger
	// sup is the command's watchdog, readied by New and handed to the
	// command's start by Run; nil once Run or Close took it.
	sup *signals.Supervisor
}

// New sets cfg's defaults, validates it (the timings and how they relate,
// the lease duration against what the store accepts, the waits, the kill
// signal), and readies the command's watchdog (signals.Prepare: the one
// cmd launched once it decided on a run, ready by then or soon after, or
// a new one, which then starts while Run campaigns): winning the lock is then
// followed by nothing but the command's fork and exec. An invalid cfg is a
// *ConfigError, whose message names the flags involved, and nothing is
// started. Call Run, or Close, once.
func New(cfg Config) (*Runner, error) {
	cfg.setDefaults()
	if err := cfg.validate(); err != nil {
		return nil, err
	}
	sup, err := signals.Prepare(cfg.Child)
	if err != nil {
		return nil, err
	}
	log := cfg.Log.With("lock", cfg.Lock, "identity", cfg.Identity, "backend", cfg.Store.Name())
	return &Runner{cfg: cfg, log: log, sup: sup}, nil
}

// Run campaigns for the lock, runs the child while leading, and returns how
// the child ended. The error is nil when the child exited by itself, or was
// stopped because leaderrun received SIGTERM or SIGINT (S6); the status is
// then the child's. Otherwise it is ErrNotAcquired, *InterruptedError,
// *LostError, *StalledError (no progress for ProgressTimeout; the child
// was stopped), *DoneError, *ConfigError (the store granted a lease too
// short for the timings), an error from starting the command
// (command.ErrNotFound, command.ErrNotExecutable) or a store's error
// (backends.ErrUnavailable).
//
// Every error Run returns has been logged, once, by the time it returns;
// ErrNotAcquired, the normal outcome for all but one host of a cron job, at
// info level.
//
// Cancelling ctx acts like SIGTERM: the candidacy is withdrawn, or the child
// is stopped and the lease released. Run returns only once the child is
// reaped and every goroutine it started has ended. It may be called once.
func (r *Runner) Run(ctx context.Context) (signals.Status, error) {
	sup := r.sup
	if sup == nil {
		return signals.Status{}, errors.New("runner: Run called after Run or Close")
	}
	r.sup = nil
	lease, err := r.campaign(ctx)
	if err != nil {
		sup.Abort()
		r.logEnd(err)
		return signals.Status{}, err
	}
	status, err := r.lead(ctx, lease, sup)
	r.logEnd(err)
	return status, err
}

// logEnd logs how a run ended, unless that was logged where it happened.
func (r *Runner) logEnd(err error) {
	switch {
	case err == nil:
	case errors.Is(err, ErrNotAcquired):
		r.log.Info("not acquired; not running the command", "reason", err)
	case errors.As(err, new(*DoneError)), errors.As(err, new(*InterruptedError)), errors.Is(err, ErrLeadershipLost),
		errors.Is(err, ErrStalled):
		// Logged where it happened: who completed the run, the
		// withdrawal, the loss and its reason, the stall.
	default:
		r.log.Error("leaderrun failed", "error", err)
	}
}

// Close dismisses the command's watchdog if Run was not called; after Run
// it does nothing.
func (r *Runner) Close() {
	if r.sup != nil {
		r.sup.Abort()
		r.sup = nil
	}
}
