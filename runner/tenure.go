package runner

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"time"

	"github.com/leaderrun/leaderrun/backends"
	"github.com/leaderrun/leaderrun/signals"
)

// tenure is one held lease, from the grant to the release: it decides
// whether the grant is fresh enough to start the child, checks the
// once-key, starts the child, runs the leadership's events until the
// child's tree is gone, records the once-key's completion, and releases
// the lease with the term's record.
type tenure struct {
	r        *Runner
	cfg      *Config
	lease    Lease
	slot     int
	token    uint64
	acquired time.Time
	log      *slog.Logger
}

// lead runs the command under lease with its prepared watchdog sup.
func (r *Runner) lead(ctx context.Context, lease Lease, sup *signals.Supervisor) (signals.Status, error) {
	slot := lease.Slot()
	t := &tenure{r: r, cfg: &r.cfg, lease: lease, slot: slot, token: lease.Token(), acquired: time.Now()}
	t.log = r.log.With("token", t.token)
	if r.cfg.Holders > 1 {
		// A slot is a lock of its own (docs/safety.md, "Pools"): from
		// here on, everything is as for one holder, told its slot.
		t.log = t.log.With("slot", slot)
		r.log = r.log.With("slot", slot)
		r.cfg.Observer = slotted{Observer: r.cfg.Observer, slot: slot}
	}
	lastAck, err := t.admit(ctx)
	if err != nil {
		sup.Abort()
		t.release(t.notStarted(err))
		return signals.Status{}, err
	}
	c, err := t.start(sup, lastAck)
	if err != nil {
		t.release(t.notStarted(err))
		return signals.Status{}, err
	}
	// The watchdog is reaped while the lease is released, and waited for
	// after: the release is what the next leader waits for.
	defer c.Wait()
	l := newLeadership(t.cfg, t.log.With("pid", c.Pid()), t.token, c, lastAck, time.Now())
	l.run(ctx, lease)
	// Every way out of l.run passes through the child's exit, so the lease
	// is released only once the child's tree is gone (S8).
	return t.finish(l)
}

// admit decides whether the command may start under the grant, and returns
// the send time from which its first renew deadline counts. Its errors
// are a granted TTL too short for the timings (*ConfigError), a lease
// already gone or a deadline already passed (*LostError), the once-key's
// run already done (*DoneError), or its marker unreadable.
func (t *tenure) admit(ctx context.Context) (time.Time, error) {
	cfg := t.cfg
	if err := cfg.Timings.CheckGranted(t.lease.TTL()); err != nil {
		return time.Time{}, &ConfigError{msg: err.Error()}
	}
	lastAck, err := t.r.fresh(ctx, t.lease)
	if err != nil {
		return time.Time{}, &LostError{Reason: err}
	}
	deadline := lastAck.Add(cfg.Timings.RenewDeadline)
	t.log.Info("leadership acquired", "ttl", t.lease.TTL())
	cfg.Observer.Observe(Event{Kind: Acquired, Token: t.token, Deadline: deadline})
	if cfg.OnceKey != "" {
		m, err := t.completed(ctx)
		if err != nil {
			return time.Time{}, err
		}
		if m != nil {
			return time.Time{}, &DoneError{Marker: *m}
		}
	}
	return lastAck, nil
}

// start has the watchdog start the command, holding the deadline from
// the first instant (S10); the deliberately unsafe build gives it none
// (unsafe_on.go).
func (t *tenure) start(sup *signals.Supervisor, lastAck time.Time) (*signals.Child, error) {
	cfg := t.cfg
	deadline := lastAck.Add(cfg.Timings.RenewDeadline)
	firstDeadline := deadline
	if unsafeLateKill {
		firstDeadline = time.Time{}
	}
	c, err := sup.Start(childEnv(cfg.Env, *cfg, t.token, t.slot), firstDeadline, t.lease.LockFile())
	if err != nil {
		return nil, err
	}
	t.log.Info("child started", "pid", c.Pid(), "command", cfg.Child.Args, "guard", c.Guard())
	cfg.Observer.Observe(Event{Kind: ChildStarted, Token: t.token, Pid: c.Pid(), Deadline: deadline})
	return c, nil
}

// finish records the once-key's completion if the command succeeded while
// the lease held, and releases the lease with the term's record. A
// completion that cannot be recorded makes the term lost, with the reason:
// another candidate will run the command again for the key.
func (t *tenure) finish(l *leadership) (signals.Status, error) {
	term := l.term(t.cfg.Identity, t.acquired, time.Now(), t.cfg.OnceKey)
	status, err := l.result()
	if err == nil && l.holdLost == nil && t.cfg.OnceKey != "" && status.ExitCode() == 0 && l.stopSignal == 0 {
		if cerr := t.complete(); cerr != nil {
			term.End, term.Reason = backends.EndLost, cerr.Error()
			err = &LostError{Reason: cerr}
		}
	}
	t.release(term)
	return status, err
}

// notStarted is the term of a leadership that ran nothing: the once-key
// was done already (err a *DoneError), or the command could not or must
// not start (err says why).
func (t *tenure) notStarted(err error) *backends.Term {
	term := &backends.Term{Identity: t.cfg.Identity, Token: t.token, Acquired: t.acquired, Ended: time.Now(),
		End: backends.EndNotStarted, Reason: err.Error(), ExitCode: -1, OnceKey: t.cfg.OnceKey}
	if errors.As(err, new(*DoneError)) {
		term.End, term.Reason = backends.EndSkipped, ""
	}
	return term
}

// completed reads the marker of the once-key, under the lock: of the
// whole pool, or of the own slot alone with --once-per-slot.
func (t *tenure) completed(ctx context.Context) (*backends.Marker, error) {
	cfg := t.cfg
	rctx, cancel := context.WithTimeout(ctx, markerTimeout)
	defer cancel()
	m, err := t.lease.Completed(rctx, cfg.OnceKey, cfg.OncePerSlot)
	if err != nil {
		return nil, fmt.Errorf("read the completion marker of %q for lock %q: %w", cfg.OnceKey, cfg.Lock, err)
	}
	if m != nil {
		t.log.Info("already completed; not running the command", "once_key", m.Key, "completed_by", m.Identity,
			"completed_token", m.Token, "completed_at", m.At.UTC().Format(time.RFC3339))
		cfg.Observer.Observe(Event{Kind: Skipped, Token: t.token})
	}
	return m, nil
}

// complete writes the marker of the once-key after the child exited 0
// while the lease held: fenced, so a lease lost meanwhile writes nothing.
func (t *tenure) complete() error {
	cfg := t.cfg
	now := time.Now()
	m := backends.Marker{Key: cfg.OnceKey, Identity: cfg.Identity, Token: t.token, At: now, Expires: now.Add(cfg.OnceKeep)}
	ctx, cancel := context.WithTimeout(context.Background(), markerTimeout)
	defer cancel()
	if err := t.lease.Complete(ctx, m); err != nil {
		t.log.Error("the run succeeded but its completion marker was not written; another candidate may run it again",
			"once_key", m.Key, "error", err)
		return fmt.Errorf("write the completion marker of %q: %w", m.Key, err)
	}
	t.log.Info("completion recorded", "once_key", m.Key, "expires", m.Expires.UTC().Format(time.RFC3339))
	return nil
}

// markerTimeout bounds a read or write of a completion marker.
const markerTimeout = 5 * time.Second

func (t *tenure) release(term *backends.Term) { t.r.release(t.lease, term) }

// releaseTimeout bounds the release of the lease after the child is gone; a
// store that does not answer in time lets the lease expire instead.
const releaseTimeout = 5 * time.Second

// release gives the lease back on its own bounded context: it must happen
// even when the run was cancelled (S8: only ever after the child is gone).
func (r *Runner) release(lease Lease, term *backends.Term) {
	ctx, cancel := context.WithTimeout(context.Background(), releaseTimeout)
	defer cancel()
	if err := lease.Release(ctx, term); err != nil {
		r.log.Warn("release failed; the lease will expire in the store", "token", lease.Token(), "error", err)
	} else {
		r.log.Info("leadership released", "token", lease.Token())
	}
	r.cfg.Observer.Observe(Event{Kind: Released, Token: lease.Token()})
}

// slotted tells its observer which slot the run holds, on every event.
type slotted struct {
	Observer
	slot int
}

func (s slotted) Observe(e Event) {
	e.Slot = s.slot
	s.Observer.Observe(e)
}
