package runner

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"time"

	"github.com/leaderrun/leaderrun/backends"
	"github.com/leaderrun/leaderrun/signals"
)

// releaseTimeout bounds the release of the lease after the child is gone; a
// store that does not answer in time lets the lease expire instead.
const releaseTimeout = 5 * time.Second

// Run campaigns for the lock, runs the child while leading, and returns how
// the child ended. The error is nil when the child exited by itself, or was
// stopped because leaderrun received SIGTERM or SIGINT (S6); the status is
// then the child's. Otherwise it is ErrNotAcquired, *InterruptedError,
// *LostError, *ConfigError, an error from signals.Start (ErrNotFound,
// ErrNotExecutable) or a backend error (backends.ErrUnavailable).
//
// Cancelling ctx acts like SIGTERM: the candidacy is withdrawn, or the child
// is stopped and the lease released. Run returns only once the child is
// reaped and every goroutine it started has ended.
func Run(ctx context.Context, cfg Config) (signals.Status, error) {
	cfg.setDefaults()
	r := &run{cfg: cfg, log: cfg.Log.With("lock", cfg.Lock, "identity", cfg.Identity, "backend", cfg.Backend.Name())}
	// The command's watchdog starts while we campaign: winning the lock
	// is then followed by nothing but a fork and exec of the command.
	sup := cfg.Supervisor
	if sup == nil {
		var err error
		if sup, err = signals.Prepare(SupervisorSpec(cfg)); err != nil {
			return signals.Status{}, err
		}
	}
	lease, err := r.campaign(ctx)
	if err != nil {
		sup.Abort()
		return signals.Status{}, err
	}
	return r.lead(ctx, lease, sup)
}

// SupervisorSpec is the supervisor that Run needs for cfg, for a caller
// that prepares it early.
func SupervisorSpec(cfg Config) signals.Spec {
	cfg.setDefaults()
	return signals.Spec{
		Path:       cfg.Path,
		Args:       cfg.Args,
		KillSignal: cfg.KillSignal,
		KillGrace:  cfg.KillGrace,
		Log:        cfg.Log.With("lock", cfg.Lock, "identity", cfg.Identity),
	}
}

type run struct {
	cfg Config
	log *slog.Logger
}

// campaign waits for leadership, withdrawing on a signal, on ctx, on --try
// or when --wait runs out.
func (r *run) campaign(ctx context.Context) (backends.Lease, error) {
	cctx, cancel := context.WithCancel(ctx)
	defer cancel()
	waitCtx := cctx
	if r.cfg.Wait > 0 {
		var c2 context.CancelFunc
		waitCtx, c2 = context.WithTimeout(cctx, r.cfg.Wait)
		defer c2()
	}
	type result struct {
		lease backends.Lease
		err   error
	}
	done := make(chan result, 1)
	r.log.Info("campaigning", "try", r.cfg.Try, "wait", r.cfg.Wait)
	r.cfg.Observer.Observe(Event{Kind: Campaigning})
	go func() {
		l, err := r.cfg.Backend.Campaign(waitCtx, backends.CampaignOptions{Identity: r.cfg.Identity, Try: r.cfg.Try})
		done <- result{l, err}
	}()

	var interrupted syscall.Signal
	for {
		select {
		case res := <-done:
			switch {
			case interrupted != 0:
				if res.lease != nil {
					r.release(res.lease)
				}
				r.log.Info("candidacy withdrawn", "signal", signals.Name(interrupted))
				return nil, &InterruptedError{Signal: interrupted}
			case res.err == nil:
				return res.lease, nil
			case errors.Is(res.err, backends.ErrLocked):
				return nil, &NotAcquiredError{Reason: fmt.Sprintf("lock %q is held by another candidate (--try)", r.cfg.Lock)}
			case r.cfg.Wait > 0 && errors.Is(waitCtx.Err(), context.DeadlineExceeded) && ctx.Err() == nil:
				// Only our own --wait timer counts as "not acquired"; a
				// backend error that merely wraps a deadline is not.
				return nil, &NotAcquiredError{Reason: fmt.Sprintf("lock %q still held by another candidate after --wait %v", r.cfg.Lock, r.cfg.Wait)}
			case ctx.Err() != nil:
				return nil, &InterruptedError{Signal: syscall.SIGTERM}
			default:
				return nil, fmt.Errorf("campaign for %q: %w", r.cfg.Lock, res.err)
			}
		case s := <-r.cfg.Signals:
			sig, _ := s.(syscall.Signal)
			switch sig {
			case syscall.SIGTERM, syscall.SIGINT, syscall.SIGHUP, syscall.SIGQUIT:
				if interrupted == 0 {
					interrupted = sig
					cancel()
				}
			default:
				r.log.Debug("signal ignored while waiting for leadership", "signal", signals.Name(sig))
			}
		}
	}
}

// renewal is the outcome of one Renew call.
type renewal struct {
	sent    time.Time
	latency time.Duration
	err     error
}

// lead runs the child under the lease.
func (r *run) lead(ctx context.Context, lease backends.Lease, sup *signals.Supervisor) (signals.Status, error) {
	cfg := r.cfg
	token := lease.Token()
	log := r.log.With("token", token)
	if err := ValidateGrantedTTL(lease.TTL(), cfg.RenewDeadline, cfg.KillGrace); err != nil {
		sup.Abort()
		r.release(lease)
		return signals.Status{}, err
	}
	lastAck := lease.Acquired()
	if time.Since(lastAck) > cfg.RenewDeadline/2 {
		// The grant's proof of life is old (a long wait, a slow store):
		// renew once so that the child starts with a fresh deadline.
		sent := time.Now()
		rctx, cancel := context.WithTimeout(ctx, renewAttemptTimeout(cfg))
		err := lease.Renew(rctx)
		cancel()
		if err == nil {
			lastAck = sent
		}
	}
	deadline := lastAck.Add(cfg.RenewDeadline)
	if !time.Now().Before(deadline) {
		sup.Abort()
		r.release(lease)
		return signals.Status{}, &LostError{Reason: errors.New("renew deadline passed before the child could start")}
	}
	log.Info("leadership acquired", "ttl", lease.TTL())
	cfg.Observer.Observe(Event{Kind: Acquired, Token: token, Deadline: deadline})

	child, err := sup.Start(childEnv(cfg.Env, cfg, token))
	if err != nil {
		r.release(lease)
		return signals.Status{}, err
	}
	started := time.Now()
	log = log.With("pid", child.Pid())
	log.Info("child started", "command", cfg.Args)
	cfg.Observer.Observe(Event{Kind: ChildStarted, Token: token, Pid: child.Pid(), Deadline: deadline})

	renewals := make(chan renewal)
	rctx, stopRenewing := context.WithCancel(context.Background())
	var wg sync.WaitGroup
	wg.Add(1)
	go func() {
		defer wg.Done()
		renewLoop(rctx, lease, cfg.RetryPeriod, renewAttemptTimeout(cfg), renewals)
	}()

	deadlineTimer := time.NewTimer(time.Until(deadline))
	defer deadlineTimer.Stop()
	var (
		lostCh    = lease.Lost()
		childDone = child.Done()
		ctxDone   = ctx.Done()
		killAt    <-chan time.Time
		holdUntil <-chan time.Time
		status    signals.Status
		lostErr   error
		exited    bool
		finished  bool
	)
	// stop sends sig to the child's group now and SIGKILL after the grace.
	stop := func(sig syscall.Signal) {
		if killAt == nil {
			killAt = time.After(cfg.KillGrace)
		}
		_ = child.Signal(sig)
	}
	lose := func(reason error) {
		if lostErr != nil {
			return
		}
		if exited {
			// Lost during --min-hold: the child had finished on its own,
			// so this is not a loss for the caller; stop holding.
			log.Warn("leadership lost while holding after the child exited", "reason", reason)
			finished = true
			return
		}
		lostErr = reason
		if unsafeLateKill {
			// The deliberately broken build of unsafe_on.go: let the child
			// run on well past the lease.
			killAt = time.After(cfg.LeaseDuration + cfg.KillGrace)
		} else {
			// Signal first, log after: a slow stderr must not delay S2/S3.
			stop(cfg.KillSignal)
		}
		log.Error("leadership lost; stopping child", "reason", reason, "signal", signals.Name(cfg.KillSignal))
		cfg.Observer.Observe(Event{Kind: Lost, Token: token, Err: reason})
	}
	for !finished {
		select {
		case rn := <-renewals:
			switch {
			case lostErr != nil:
			case rn.err == nil && rn.sent.After(deadline):
				// Sent after the deadline had passed (the process was
				// paused): the store may have let the lease go meanwhile.
				lose(fmt.Errorf("renew deadline passed (%v late) before the next renewal was sent", rn.sent.Sub(deadline)))
			case rn.err == nil:
				if rn.sent.After(lastAck) {
					lastAck = rn.sent
					deadline = lastAck.Add(cfg.RenewDeadline)
					deadlineTimer.Reset(time.Until(deadline))
				}
				log.Debug("lease renewed", "latency", rn.latency)
				cfg.Observer.Observe(Event{Kind: Renewed, Token: token, Latency: rn.latency, Deadline: deadline})
			case errors.Is(rn.err, backends.ErrLeaseLost):
				lose(rn.err)
			default:
				log.Warn("lease renewal failed", "error", rn.err, "deadline_in", time.Until(deadline).Round(time.Millisecond))
				cfg.Observer.Observe(Event{Kind: RenewFailed, Token: token, Err: rn.err, Deadline: deadline})
			}
		case <-deadlineTimer.C:
			if lostErr == nil {
				if now := time.Now(); now.Before(deadline) {
					deadlineTimer.Reset(deadline.Sub(now))
				} else {
					lose(fmt.Errorf("no renewal acknowledged for --renew-deadline %v (last sent %v ago)",
						cfg.RenewDeadline, now.Sub(lastAck).Round(time.Millisecond)))
				}
			}
		case <-lostCh:
			lostCh = nil
			lose(lease.Err())
		case <-killAt:
			_ = child.Signal(syscall.SIGKILL)
			log.Warn("child still running after --kill-grace; sent SIGKILL", "grace", cfg.KillGrace)
		case <-childDone:
			childDone = nil
			exited = true
			status = child.Wait()
			log.Info("child exited", "status", status.String(), "exit_code", status.ExitCode(), "ran", time.Since(started).Round(time.Millisecond))
			cfg.Observer.Observe(Event{Kind: ChildExited, Token: token, Pid: child.Pid(), Status: status})
			if hold := cfg.MinHold - time.Since(started); lostErr == nil && killAt == nil && hold > 0 {
				log.Info("holding leadership for --min-hold", "hold", hold.Round(time.Millisecond))
				holdUntil = time.After(hold)
			} else {
				finished = true
			}
		case <-holdUntil:
			finished = true
		case s := <-cfg.Signals:
			sig, _ := s.(syscall.Signal)
			switch {
			case exited:
				if sig == syscall.SIGTERM || sig == syscall.SIGINT {
					finished = true
				}
			case sig == syscall.SIGTERM || sig == syscall.SIGINT:
				stop(sig)
				log.Info("stopping child on signal", "signal", signals.Name(sig))
				cfg.Observer.Observe(Event{Kind: Stopping, Token: token})
			default:
				_ = child.Signal(sig)
				log.Info("forwarded signal to child", "signal", signals.Name(sig))
			}
		case <-ctxDone:
			ctxDone = nil
			if exited {
				finished = true
			} else {
				cfg.Observer.Observe(Event{Kind: Stopping, Token: token})
				stop(cfg.KillSignal)
			}
		}
	}
	// Every way out of the loop above passes through the child's exit, so
	// the lease is released only once the child is gone (S8).
	stopRenewing()
	wg.Wait()
	r.release(lease)
	if lostErr != nil {
		return status, &LostError{Reason: lostErr}
	}
	return status, nil
}

// release gives the lease back on its own bounded context: it must happen
// even when the run was cancelled (S8: only ever after the child is gone).
func (r *run) release(lease backends.Lease) {
	ctx, cancel := context.WithTimeout(context.Background(), releaseTimeout)
	defer cancel()
	if err := lease.Release(ctx); err != nil {
		r.log.Warn("release failed; the lease will expire in the store", "token", lease.Token(), "error", err)
	} else {
		r.log.Info("leadership released", "token", lease.Token())
	}
	r.cfg.Observer.Observe(Event{Kind: Released, Token: lease.Token()})
}

// renewAttemptTimeout bounds one renewal. A request stuck on a dead
// connection or a store that is electing a new leader must not use up the
// whole deadline: a retry over a fresh connection, or to another member,
// may well succeed.
func renewAttemptTimeout(cfg Config) time.Duration {
	return max(cfg.RetryPeriod, cfg.RenewDeadline/3)
}

// renewLoop renews every period until ctx ends or the lease is lost for
// good, reporting each attempt with its send time.
func renewLoop(ctx context.Context, lease backends.Lease, period, timeout time.Duration, out chan<- renewal) {
	t := time.NewTimer(period)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		}
		sent := time.Now()
		rctx, cancel := context.WithTimeout(ctx, timeout)
		err := lease.Renew(rctx)
		cancel()
		select {
		case out <- renewal{sent: sent, latency: time.Since(sent), err: err}:
		case <-ctx.Done():
			return
		}
		if errors.Is(err, backends.ErrLeaseLost) {
			return
		}
		// Every period from the send time, so that a slow or timed-out
		// attempt does not push the next one back.
		t.Reset(max(period-time.Since(sent), 0))
	}
}

// Variables leaderrun sets for the child; inherited values are replaced.
// NOTIFY_SOCKET is leaderrun's own (systemd) and must not reach the child,
// or the child could report readiness for it.
var ownVars = []string{"FENCE_TOKEN", "LEADERRUN_LOCK", "LEADERRUN_IDENTITY", "LEADERRUN_BACKEND", "LEADERRUN_SOCKET", "NOTIFY_SOCKET"}

func childEnv(base []string, cfg Config, token uint64) []string {
	env := make([]string, 0, len(base)+5)
	for _, kv := range base {
		name, _, _ := strings.Cut(kv, "=")
		own := false
		for _, v := range ownVars {
			own = own || name == v
		}
		if !own {
			env = append(env, kv)
		}
	}
	env = append(env,
		"FENCE_TOKEN="+strconv.FormatUint(token, 10),
		"LEADERRUN_LOCK="+cfg.Lock,
		"LEADERRUN_IDENTITY="+cfg.Identity,
		"LEADERRUN_BACKEND="+cfg.Backend.Name(),
	)
	if cfg.Socket != "" {
		env = append(env, "LEADERRUN_SOCKET="+cfg.Socket)
	}
	return env
}
