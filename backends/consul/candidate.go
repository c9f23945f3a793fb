package consul

import (
	"context"
	"crypto/rand"
	"errors"
	"fmt"
	"strings"
	"sync"
	"time"

	"github.com/hashicorp/consul/api"

	"github.com/leaderrun/leaderrun/backends"
)

// candidate is one candidacy from Join to Release: a TTL check, the
// sessions bound to it, a place in the queue and, once it leads, the
// grant (Lead returns the candidate itself). First in line, or before it
// queues, it is ready: a lock session, and a check of the lease's TTL.
// Further back it is parked (see parkedTTL).
type candidate struct {
	l     *lock
	claim backends.Claim
	delay time.Duration // its lock session's lock-delay
	check string        // the ID of its TTL check

	// mu is held by each renewal and by setReady, and guards what the
	// keep-alive reads; Lead's goroutine, the only writer, reads freely.
	mu       sync.Mutex
	session  string    // the lock session; "" while parked
	qsession string    // holds the queue entry, named by it; "" until it queues
	lastAck  time.Time // send time of the last acknowledged renewal or check registration

	// alive ends (end) with the reason the keep-alive gave up; done is
	// closed once the keep-alive returned (nil if none ran).
	alive context.Context
	end   context.CancelCauseFunc
	done  chan struct{}

	first bool // no live entry is ahead: entries only join at the end
	// What the last read of the lock key showed (first in line only).
	index       uint64        // for the next blocking query; 0: read it anew
	holder      string        // the holder's session, "" if the key is free
	holderDelay time.Duration // the lock-delay of the last holder seen, 0 if unknown
	freed       time.Time     // when the key was seen free, zero while held
	retry       time.Time     // when to try again after refusals on a free key
	refused     int           // acquisitions refused since it was seen free

	won, handed bool // the grant: won by attempt, handed out by Lead
	acquired    time.Time
	rec         record // as written at the grant, with its token
	*backends.Loss
	stopWatch context.CancelFunc
	watchDone chan struct{}
}

// Join registers the candidate's check and creates its lock session (even
// if ctx ends meanwhile, so that a withdrawal can remove them), and tries
// to acquire the key; if it is held, it queues (unless try), kept alive
// meanwhile by keepAlive.
func (l *lock) Join(ctx context.Context, c backends.Claim, try bool) (backends.Ticket, error) {
	t := &candidate{l: l, claim: c, delay: l.s.LockDelay(c.Timings), check: checkPrefix + rand.Text(), alive: context.Background(),
		lastAck: time.Now(), Loss: backends.NewLoss()}
	l.s.dropDeadChecks(context.WithoutCancel(ctx))
	err := t.registerCheck(context.WithoutCancel(ctx), c.Timings.LeaseDuration)
	if err == nil {
		t.session, err = t.createSession(context.WithoutCancel(ctx), true)
	}
	if err == nil {
		err = t.attempt(ctx)
	}
	switch {
	case err == nil && !t.won && try:
		err = fmt.Errorf("consul: %s is held by another session, or in its lock-delay: %w", l.key, backends.ErrLocked)
	case err == nil && !t.won:
		// The entry, named by the queue session and held by it, comes
		// last: CreateIndex is a Raft index. Nobody else can hold it, so
		// an answer other than "true" (cut short, not Consul's) is an error.
		if t.qsession, err = t.createSession(ctx, false); err == nil {
			var kctx context.Context
			kctx, t.end = context.WithCancelCause(context.Background())
			t.alive, t.done = kctx, make(chan struct{})
			go t.keepAlive(kctx)
			p := &api.KVPair{Key: l.queuePrefix() + t.qsession, Value: []byte(c.Identity), Session: t.qsession}
			var ok bool
			if ok, _, err = l.s.client.KV().Acquire(p, (&api.WriteOptions{}).WithContext(ctx)); err == nil && !ok {
				err = errors.New("the agent did not acknowledge the entry " + p.Key)
			}
			if err != nil {
				err = l.s.failed("join the queue of", l.key, err)
			}
		}
	}
	if err != nil {
		cctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), max(c.Timings.AttemptTimeout(), time.Second))
		defer cancel()
		_ = t.Leave(cctx)
		return nil, err
	}
	return t, nil
}

// Lead stops the keep-alive before it returns the grant: from then on the
// runner's renewals are the only ones.
func (t *candidate) Lead(ctx context.Context) (backends.Grant, error) {
	lctx, cancel := context.WithCancel(ctx)
	defer cancel()
	defer context.AfterFunc(t.alive, cancel)()
	for !t.won {
		err := t.waitTurn(lctx)
		if err == nil {
			err = t.attempt(lctx)
		}
		switch {
		case err != nil && ctx.Err() != nil:
			return nil, ctx.Err()
		case err != nil && t.alive.Err() != nil:
			return nil, context.Cause(t.alive)
		case err != nil:
			return nil, err
		case t.won:
		case t.holder == "":
			t.refusedFree()
		default: // the key looked like ours and was not: read it again
			t.index = 0
		}
	}
	t.stopKeepAlive()
	t.handed = true
	return t, nil
}

// attempt acquires the key (t.won) and leaves the queue in one
// transaction, so that the waiter behind wakes once the key is ours; no
// win and no error: the key is held, or a lock-delay runs. The answer has
// the key's new ModifyIndex, the token. The lease counts from the last
// renewal acknowledged before: neither session nor check expires sooner.
func (t *candidate) attempt(ctx context.Context) error {
	acked, _ := t.acked()
	t.rec = record{Identity: t.claim.Identity, TTL: t.claim.Timings.LeaseDuration.String(), LockDelay: t.delay.String(), Holders: t.claim.Holders}
	ops := api.TxnOps{{KV: &api.KVTxnOp{Verb: api.KVLock, Key: t.l.key, Value: t.rec.encode(), Flags: recordFlags, Session: t.session}}}
	if t.qsession != "" {
		ops = append(ops, &api.TxnOp{KV: &api.KVTxnOp{Verb: api.KVDelete, Key: t.l.queuePrefix() + t.qsession}})
	}
	ok, resp, why, _, err := t.l.s.txn(ctx, ops)
	switch {
	case err != nil:
		return t.l.s.failed("acquire", t.l.key, err)
	case !ok && strings.Contains(why, "invalid session"):
		return errSessionGone
	case !ok:
		return nil
	case len(resp.Results) == 0 || resp.Results[0].KV == nil:
		return t.l.s.failed("acquire", t.l.key, errors.New("transaction answer without the key"))
	}
	t.won, t.rec.Token, t.acquired = true, resp.Results[0].KV.ModifyIndex, acked
	wctx, cancel := context.WithCancel(context.Background())
	t.stopWatch, t.watchDone = cancel, make(chan struct{})
	go t.watch(wctx, t.rec.Token)
	return nil
}

// Leave withdraws the candidacy, or releases a grant that Lead never
// handed out.
func (t *candidate) Leave(ctx context.Context) error {
	switch {
	case t.handed:
		return nil
	case t.won:
		return t.Release(ctx)
	}
	t.stopKeepAlive()
	return t.close(ctx)
}

func (t *candidate) stopKeepAlive() {
	if t.done != nil {
		t.end(nil)
		<-t.done
	}
}

// close gives up what the candidacy holds: the key, with its record (a
// lost answer may have granted it; a release, unlike an invalidation,
// imposes no lock-delay), the queue session, so that the waiter behind
// moves up, the lock session, and last the check, whose removal ends the
// sessions. Errors but the lock session's are ignored: the check, no
// longer passed, ends the sessions a TTL later.
func (t *candidate) close(ctx context.Context) error {
	s, wo := t.l.s, (&api.WriteOptions{}).WithContext(ctx)
	if t.session != "" && t.Err() == nil {
		_, _, _ = s.client.KV().Release(&api.KVPair{Key: t.l.key, Value: t.rec.encode(), Flags: recordFlags, Session: t.session}, wo)
	}
	if t.qsession != "" {
		_, _ = s.client.Session().Destroy(t.qsession, wo)
	}
	var err error
	if t.session != "" {
		_, err = s.client.Session().Destroy(t.session, wo)
	}
	_ = s.client.Agent().CheckDeregisterOpts(t.check, (&api.QueryOptions{}).WithContext(ctx))
	if err != nil {
		return fmt.Errorf("consul at %s: destroy session %s holding %s: %w", s.addr, t.session, t.l.key, err)
	}
	return nil
}

// The candidate is its own grant once Lead returned it.
func (t *candidate) Token() uint64       { return t.rec.Token }
func (t *candidate) TTL() time.Duration  { return t.claim.Timings.LeaseDuration }
func (t *candidate) Acquired() time.Time { return t.acquired }

// Renew renews the session (the servers' TTL timer) and passes its check
// (the agent's), and returns nil only if both were acknowledged, so that
// the runner's deadline counts from a renewal that restarted both timers
// (docs/safety.md). Neither writes anything a waiter watches. A session or
// check that is gone is a loss.
func (t *candidate) Renew(ctx context.Context) error {
	if err := t.Err(); err != nil {
		return err
	}
	err := t.l.s.renew(ctx, t.check, t.session)
	switch {
	case errors.Is(err, errSessionGone):
		err = fmt.Errorf("consul: lost %s: %v: %w", t.l.key, err, backends.ErrLeaseLost)
		t.Set(err)
		return err
	case err != nil:
		return fmt.Errorf("consul at %s: holding %s: %w", t.l.s.addr, t.l.key, err)
	}
	return nil
}

// watch reports the loss once the key is no longer held by this session,
// in blocking queries of a minute at most, so that a silently broken
// connection is noticed. A failed query is retried: whether the store can
// be reached is for renewals and the runner's deadline to judge.
func (t *candidate) watch(ctx context.Context, index uint64) {
	defer close(t.watchDone)
	for {
		pair, meta, err := t.l.s.get(ctx, t.l.key, index, time.Minute)
		switch {
		case ctx.Err() != nil:
			return
		case err != nil:
			if sleep(ctx, time.Second) != nil {
				return
			}
			continue
		case pair == nil:
			err = fmt.Errorf("consul: lock key %s was deleted: %w", t.l.key, backends.ErrLeaseLost)
		case pair.Session == "":
			err = fmt.Errorf("consul: session %s no longer holds %s (destroyed, expired or released): %w", t.session, t.l.key, backends.ErrLeaseLost)
		case pair.Session != t.session:
			err = fmt.Errorf("consul: %s was taken by session %s (%q): %w", t.l.key, pair.Session, pair.Value, backends.ErrLeaseLost)
		}
		if err != nil {
			t.Set(err)
			return
		}
		index = nextIndex(index, meta.LastIndex)
	}
}

// Release gives up the key and the sessions (see close). The watch is
// waited for last: the release is what the next holder waits for.
func (t *candidate) Release(ctx context.Context) error {
	if !t.BeginRelease() {
		return nil
	}
	t.stopWatch()
	defer func() { <-t.watchDone }()
	return t.close(ctx)
}

func (t *candidate) WriteDoc(ctx context.Context, d backends.Doc) error {
	return t.l.writeDoc(ctx, d, t.session)
}
