package runner

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"os"
	"slices"
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
// *LostError, *DoneError, *ConfigError, an error from signals.Start
// (ErrNotFound, ErrNotExecutable) or a backend error
// (backends.ErrUnavailable).
//
// Run validates cfg's timings first and refuses those it cannot keep: the
// promises of docs/safety.md rest on them, whoever the caller is.
//
// Cancelling ctx acts like SIGTERM: the candidacy is withdrawn, or the child
// is stopped and the lease released. Run returns only once the child is
// reaped and every goroutine it started has ended.
func Run(ctx context.Context, cfg Config) (signals.Status, error) {
	cfg.setDefaults()
	sup := cfg.Supervisor
	if err := cfg.validate(); err != nil {
		if sup != nil {
			sup.Abort()
		}
		return signals.Status{}, err
	}
	r := &run{cfg: cfg, log: cfg.Log.With("lock", cfg.Lock, "identity", cfg.Identity, "backend", cfg.Backend.Name())}
	// The command's watchdog starts while we campaign: winning the lock
	// is then followed by nothing but a fork and exec of the command.
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
		l, err := r.cfg.Backend.Campaign(waitCtx, backends.CampaignOptions{
			Identity: r.cfg.Identity, Try: r.cfg.Try, LeaseDuration: r.cfg.LeaseDuration,
		})
		done <- result{l, err}
	}()

	var interrupted syscall.Signal
	for {
		select {
		case res := <-done:
			switch {
			case interrupted != 0:
				if res.lease != nil {
					r.release(res.lease, nil)
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

// lead runs the child under the lease: it decides whether the grant is
// fresh enough to start the child, checks the once-key, starts the child,
// and runs the leadership's events until the child's tree is gone; then it
// releases the lease, recording the term.
func (r *run) lead(ctx context.Context, lease backends.Lease, sup *signals.Supervisor) (signals.Status, error) {
	cfg := &r.cfg
	token := lease.Token()
	acquired := time.Now()
	log := r.log.With("token", token)
	// notStarted is the term of a leadership that ran nothing: the command
	// could not start (err), or its once-key was done already (err nil).
	notStarted := func(err error) *backends.Term {
		t := &backends.Term{Identity: cfg.Identity, Token: token, Acquired: acquired, Ended: time.Now(),
			End: backends.EndSkipped, ExitCode: -1, OnceKey: cfg.OnceKey}
		if err != nil {
			t.End, t.Reason = backends.EndNotStarted, err.Error()
		}
		return t
	}
	if err := ValidateGrantedTTL(lease.TTL(), cfg.LeaseDuration, cfg.RenewDeadline, cfg.KillGrace); err != nil {
		sup.Abort()
		r.release(lease, notStarted(err))
		return signals.Status{}, err
	}
	lastAck, err := r.fresh(ctx, lease)
	if err != nil {
		sup.Abort()
		r.release(lease, notStarted(err))
		return signals.Status{}, &LostError{Reason: err}
	}
	deadline := lastAck.Add(cfg.RenewDeadline)
	log.Info("leadership acquired", "ttl", lease.TTL())
	cfg.Observer.Observe(Event{Kind: Acquired, Token: token, Deadline: deadline})

	if cfg.OnceKey != "" {
		if m, err := r.completed(ctx, lease); err != nil || m != nil {
			sup.Abort()
			r.release(lease, notStarted(err))
			if err != nil {
				return signals.Status{}, err
			}
			return signals.Status{}, &DoneError{Marker: *m}
		}
	}

	// The watchdog holds the deadline from the first instant (S10); the
	// deliberately unsafe build gives it none (unsafe_on.go).
	firstDeadline := deadline
	if unsafeLateKill {
		firstDeadline = time.Time{}
	}
	c, err := sup.Start(childEnv(cfg.Env, *cfg, token), firstDeadline, heldFile(lease))
	if err != nil {
		r.release(lease, notStarted(err))
		return signals.Status{}, err
	}
	// The watchdog is reaped while the lease is released, and waited for
	// after: the release is what the next leader waits for.
	defer c.Wait()
	started := time.Now()
	log = log.With("pid", c.Pid())
	log.Info("child started", "command", cfg.Args, "guard", c.Guard())
	cfg.Observer.Observe(Event{Kind: ChildStarted, Token: token, Pid: c.Pid(), Deadline: deadline})

	l := newLeadership(cfg, log, token, c, lastAck, started)
	l.run(ctx, lease)
	term := l.term(cfg.Identity, acquired, time.Now(), cfg.OnceKey)
	if l.lost == nil && l.holdLost == nil && cfg.OnceKey != "" && l.status.ExitCode() == 0 && l.stopSignal == 0 {
		if err := r.complete(lease, token); err != nil {
			// The run is not recorded: another candidate will run it
			// again for this key. Say so loudly, and exit as a loss.
			r.release(lease, term)
			return l.status, &LostError{Reason: err}
		}
	}
	// Every way out of l.run passes through the child's exit, so the lease
	// is released only once the child's tree is gone (S8).
	r.release(lease, term)
	return l.result()
}

// lockHolder is a lease whose lock is an open file (the local backend's
// flock): the command's watchdog holds it too, so that the kernel cannot
// hand the lock on while any of the command's tree runs, even after
// leaderrun died (docs/safety.md, S10).
type lockHolder interface {
	LockFile() *os.File
}

func heldFile(lease backends.Lease) *os.File {
	if h, ok := lease.(lockHolder); ok {
		return h.LockFile()
	}
	return nil
}

// fresh returns the send time from which the first renew deadline counts.
// A grant whose proof of life is old (a candidate that waited in the
// queue, a slow store) is renewed once, so that the child starts with a
// whole deadline; if that renewal fails, the old proof stands, unless the
// deadline has passed or the store says the lease is gone.
func (r *run) fresh(ctx context.Context, lease backends.Lease) (time.Time, error) {
	cfg := &r.cfg
	lastAck := lease.Acquired()
	if time.Since(lastAck) > cfg.RetryPeriod {
		sent := time.Now()
		rctx, cancel := context.WithTimeout(ctx, renewAttemptTimeout(*cfg))
		err := lease.Renew(rctx)
		cancel()
		switch {
		case err == nil:
			lastAck = sent
		case errors.Is(err, backends.ErrLeaseLost):
			return lastAck, err
		default:
			r.log.Warn("renewal before starting the child failed", "token", lease.Token(), "error", err)
		}
	}
	if !time.Now().Before(lastAck.Add(cfg.RenewDeadline)) {
		return lastAck, errors.New("renew deadline passed before the child could start")
	}
	return lastAck, nil
}

// run drives the leadership from real events until it is done: renewals
// from a goroutine of its own, the deadline and hold timers, the store's
// loss report, the child's end, signals and ctx.
func (l *leadership) run(ctx context.Context, lease backends.Lease) {
	cfg := l.cfg
	renewals := make(chan renewal)
	rctx, stopRenewing := context.WithCancel(context.Background())
	var wg sync.WaitGroup
	wg.Add(1)
	go func() {
		defer wg.Done()
		renewLoop(rctx, lease, cfg.RetryPeriod, renewAttemptTimeout(*cfg), renewals)
	}()
	defer func() {
		stopRenewing()
		wg.Wait()
	}()

	deadline := time.NewTimer(time.Until(l.deadline))
	defer deadline.Stop()
	var (
		lost      = lease.Lost()
		childDone = l.child.Done()
		ctxDone   = ctx.Done()
		hold      <-chan time.Time
		late      <-chan time.Time
	)
	for l.phase != done {
		select {
		case rn := <-renewals:
			l.renewed(time.Now(), rn)
		case <-deadline.C:
			l.deadlinePassed(time.Now())
		case <-lost:
			lost = nil
			l.leaseLost(time.Now(), lease.Err())
		case <-childDone:
			childDone = nil
			l.childExited(time.Now(), l.child.Status())
		case <-hold:
			l.holdOver(time.Now())
		case <-late:
			l.lateStopDue(time.Now())
		case s := <-cfg.Signals:
			sig, _ := s.(syscall.Signal)
			l.signalled(time.Now(), sig)
		case <-ctxDone:
			ctxDone = nil
			l.cancelled(time.Now())
		}
		// Re-arm the timers from the state the event left.
		if l.lost == nil && l.phase != done {
			deadline.Reset(time.Until(l.deadline))
		}
		if l.phase == holding && hold == nil {
			hold = time.After(time.Until(l.holdUntil))
		}
		if !l.lateStop.IsZero() && late == nil {
			late = time.After(time.Until(l.lateStop))
		}
		if l.phase == done && childDone != nil {
			// A hold ended by a loss or a signal after the child had
			// exited: nothing left to wait for.
			childDone = nil
		}
	}
}

// completed reads the marker of the once-key, under the lock.
func (r *run) completed(ctx context.Context, lease backends.Lease) (*backends.Marker, error) {
	rctx, cancel := context.WithTimeout(ctx, markerTimeout)
	defer cancel()
	m, err := r.cfg.Backend.Completed(rctx, r.cfg.OnceKey)
	if err != nil {
		return nil, fmt.Errorf("read the completion marker of %q for lock %q: %w", r.cfg.OnceKey, r.cfg.Lock, err)
	}
	if m != nil {
		r.log.Info("already completed; not running the command", "once_key", m.Key, "completed_by", m.Identity,
			"completed_token", m.Token, "completed_at", m.At.UTC().Format(time.RFC3339))
		r.cfg.Observer.Observe(Event{Kind: Skipped, Token: lease.Token()})
	}
	return m, nil
}

// complete writes the marker of the once-key after the child exited 0
// while the lease held: fenced, so a lease lost meanwhile writes nothing.
func (r *run) complete(lease backends.Lease, token uint64) error {
	now := time.Now()
	m := backends.Marker{Key: r.cfg.OnceKey, Identity: r.cfg.Identity, Token: token, At: now, Expires: now.Add(r.cfg.OnceKeep)}
	ctx, cancel := context.WithTimeout(context.Background(), markerTimeout)
	defer cancel()
	if err := lease.Complete(ctx, m); err != nil {
		r.log.Error("the run succeeded but its completion marker was not written; another candidate may run it again",
			"token", token, "once_key", m.Key, "error", err)
		return fmt.Errorf("write the completion marker of %q: %w", m.Key, err)
	}
	r.log.Info("completion recorded", "token", token, "once_key", m.Key, "expires", m.Expires.UTC().Format(time.RFC3339))
	return nil
}

// markerTimeout bounds a read or write of a completion marker.
const markerTimeout = 5 * time.Second

// release gives the lease back on its own bounded context: it must happen
// even when the run was cancelled (S8: only ever after the child is gone).
func (r *run) release(lease backends.Lease, term *backends.Term) {
	ctx, cancel := context.WithTimeout(context.Background(), releaseTimeout)
	defer cancel()
	if err := lease.Release(ctx, term); err != nil {
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
// NOTIFY_SOCKET, WATCHDOG_USEC and WATCHDOG_PID are leaderrun's own
// (systemd) and must not reach the child, or the child could report
// readiness or liveness for it.
var ownVars = []string{"FENCE_TOKEN", "LEADERRUN_LOCK", "LEADERRUN_IDENTITY", "LEADERRUN_BACKEND", "LEADERRUN_SOCKET",
	"NOTIFY_SOCKET", "WATCHDOG_USEC", "WATCHDOG_PID"}

func childEnv(base []string, cfg Config, token uint64) []string {
	env := make([]string, 0, len(base)+5)
	for _, kv := range base {
		name, _, _ := strings.Cut(kv, "=")
		if !slices.Contains(ownVars, name) && !slices.Contains(cfg.Unset, name) {
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
