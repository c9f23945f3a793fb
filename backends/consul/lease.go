package consul

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"time"

	"github.com/hashicorp/consul/api"

	"github.com/leaderrun/leaderrun/backends"
)

// watchWait is how long one blocking query of the lease's watch lasts.
// Consul answers at once when the key changes; the wait only bounds how
// long a silently broken connection goes unnoticed by the watch (renewals
// notice it sooner).
const watchWait = time.Minute

// lease is a session that holds the key. A goroutine started by newLease
// watches the key and closes lost when the key stops being ours; Release
// stops it and waits for it.
type lease struct {
	b       *Backend
	session string
	checkID string // the ID of the session's TTL check on the agent
	// queueSession held the holder's entry in the queue ("" if it never
	// queued); the watch destroys it.
	queueSession string
	token        uint64
	ttl          time.Duration
	acquired     time.Time
	rec          record // as written at the grant

	*backends.Loss // Lost and Err
	stopWatch      context.CancelFunc
	watchDone      chan struct{}
}

// newLease starts watching the key from token, the ModifyIndex the
// acquisition gave it.
func newLease(b *Backend, session, check, queueSession string, rec record, token uint64, ttl time.Duration, acquired time.Time) *lease {
	ctx, cancel := context.WithCancel(context.Background())
	rec.Token = token
	l := &lease{
		b:            b,
		session:      session,
		checkID:      check,
		queueSession: queueSession,
		token:        token,
		ttl:          ttl,
		acquired:     acquired,
		rec:          rec,
		Loss:         backends.NewLoss(),
		stopWatch:    cancel,
		watchDone:    make(chan struct{}),
	}
	go l.watch(ctx, token)
	return l
}

func (l *lease) Token() uint64       { return l.token }
func (l *lease) TTL() time.Duration  { return l.ttl }
func (l *lease) Acquired() time.Time { return l.acquired }

// Session is the ID of the Consul session that holds the lock.
func (l *lease) Session() string { return l.session }

// Renew implements backends.Lease. It renews the session (PUT
// /v1/session/renew, which the servers' TTL timer counts from) and passes
// its TTL check (PUT /v1/agent/check/pass, which the agent's timer counts
// from) at the same time, and returns nil only if both were acknowledged:
// the runner's deadline then counts from the send time of a renewal that
// restarted both timers, neither of which can end the session sooner than
// a TTL later (docs/safety.md). Neither request writes anything the
// followers watch. A session Consul no longer has, or a check the agent
// no longer has, is a loss.
func (l *lease) Renew(ctx context.Context) error {
	if err := l.Err(); err != nil {
		return err
	}
	err := l.b.renew(ctx, l.checkID, l.session)
	switch {
	case errors.Is(err, errSessionGone):
		err = fmt.Errorf("consul: lost %s: %v: %w", l.b.key, err, backends.ErrLeaseLost)
		l.Set(err)
		return err
	case err != nil:
		return fmt.Errorf("consul at %s: holding %s: %w", l.b.addr, l.b.key, err)
	}
	return nil
}

// watch holds a blocking query on the key until the key is no longer held
// by this session, or ctx ends. Failed queries are retried: whether the
// store can still be reached is for renewals and the runner's deadline to
// judge; the watch reports only what Consul says about the key.
func (l *lease) watch(ctx context.Context, index uint64) {
	defer close(l.watchDone)
	if l.queueSession != "" {
		// Its entry went with the acquisition; the session itself would
		// last until Release deregisters the check. Not before the
		// command starts: one round trip more for nothing.
		dctx, cancel := context.WithTimeout(ctx, requestTimeout)
		_, _ = l.b.client.Session().Destroy(l.queueSession, (&api.WriteOptions{}).WithContext(dctx))
		cancel()
	}
	var retry backends.Backoff
	for {
		pair, meta, err := l.b.get(ctx, l.b.key, index, watchWait, false)
		if ctx.Err() != nil {
			return
		}
		if err != nil {
			if retry.Sleep(ctx) != nil {
				return
			}
			continue
		}
		retry.Reset()
		if err := l.check(pair); err != nil {
			l.Set(err)
			return
		}
		index = nextIndex(index, meta.LastIndex)
	}
}

// check says why pair shows that the key is no longer ours, or nil.
func (l *lease) check(pair *api.KVPair) error {
	switch {
	case pair == nil:
		return fmt.Errorf("consul: lock key %s was deleted: %w", l.b.key, backends.ErrLeaseLost)
	case pair.Session == "":
		return fmt.Errorf("consul: session %s no longer holds %s (destroyed, expired or released): %w",
			l.session, l.b.key, backends.ErrLeaseLost)
	case pair.Session != l.session:
		return fmt.Errorf("consul: %s was taken by session %s (%q): %w", l.b.key, pair.Session, pair.Value, backends.ErrLeaseLost)
	}
	return nil
}

// Release implements backends.Lease: it stops the watch, releases the key
// (a release, unlike an invalidation, imposes no lock-delay on the next
// holder) and records the term in one transaction, then destroys the
// session and deregisters its check. If the release fails but the destroy
// succeeds, the key is freed anyway, after the lock-delay. After a loss the
// term is written on its own. The error says whether the session may
// outlive Release (its check then turns critical within a TTL, which ends
// it) or the term was not recorded.
func (l *lease) Release(ctx context.Context, term *backends.Term) error {
	if !l.BeginRelease() {
		return nil
	}
	lost := l.Err() != nil

	// The watch is told to stop and waited for at the end: the release
	// is what the next holder waits for.
	l.stopWatch()
	defer func() { <-l.watchDone }()
	wo := (&api.WriteOptions{}).WithContext(ctx)
	var ops api.TxnOps
	if !lost {
		ops = append(ops, &api.TxnOp{KV: &api.KVTxnOp{Verb: api.KVUnlock, Key: l.b.key, Value: l.rec.encode(), Flags: recordFlags, Session: l.session}})
	}
	var termErr error
	if term != nil {
		data, err := json.Marshal(term)
		if err != nil {
			return err
		}
		ops = append(ops, &api.TxnOp{KV: &api.KVTxnOp{Verb: api.KVSet, Key: l.b.historyKey(term.Token), Value: data}})
	}
	if len(ops) > 0 {
		ok, _, _, err := l.b.client.Txn().Txn(ops, (&api.QueryOptions{}).WithContext(ctx))
		if (err != nil || !ok) && term != nil && !lost {
			// The key was not ours to unlock after all: record the term
			// on its own.
			ok, _, _, err = l.b.client.Txn().Txn(ops[1:], (&api.QueryOptions{}).WithContext(ctx))
		}
		if term != nil && (err != nil || !ok) {
			termErr = fmt.Errorf("consul at %s: record term %d in %s: %v", l.b.addr, term.Token, l.b.historyPrefix(), err)
		}
	}
	pruned := make(chan struct{})
	go func() {
		defer close(pruned)
		if term != nil {
			l.b.prune(ctx, l.b.historyPrefix(), backends.HistoryLimit)
		}
	}()
	_, err := l.b.client.Session().Destroy(l.session, wo)
	// Deregistering the check would invalidate the session: only once it
	// is destroyed. If the destroy failed, this ends the session anyway.
	_ = l.b.client.Agent().CheckDeregisterOpts(l.checkID, (&api.QueryOptions{}).WithContext(ctx))
	<-pruned
	if err != nil {
		return errors.Join(fmt.Errorf("consul at %s: destroy session %s holding %s: %w", l.b.addr, l.session, l.b.key, err), termErr)
	}
	return termErr
}

// Completed implements backends.Backend.
func (b *Backend) Completed(ctx context.Context, key string) (*backends.Marker, error) {
	ctx, cancel := context.WithTimeout(ctx, requestTimeout)
	defer cancel()
	pair, _, err := b.client.KV().Get(b.markerKey(key), (&api.QueryOptions{RequireConsistent: true}).WithContext(ctx))
	if err != nil {
		return nil, fmt.Errorf("consul at %s: read %s: %w", b.addr, b.markerKey(key), err)
	}
	if pair == nil {
		return nil, nil
	}
	var m backends.Marker
	if err := json.Unmarshal(pair.Value, &m); err != nil {
		return nil, fmt.Errorf("consul: marker %s is corrupt: %v", b.markerKey(key), err)
	}
	if !time.Now().Before(m.Expires) {
		return nil, nil
	}
	return &m, nil
}

// Complete implements backends.Lease: one transaction checks that the lock
// key is still held by this session and writes the marker. Consul keys do
// not expire: a marker carries its expiry, readers ignore it after that,
// and every Complete deletes the lock's expired markers.
func (l *lease) Complete(ctx context.Context, m backends.Marker) error {
	data, err := json.Marshal(m)
	if err != nil {
		return err
	}
	ops := api.TxnOps{
		{KV: &api.KVTxnOp{Verb: api.KVCheckSession, Key: l.b.key, Session: l.session}},
		{KV: &api.KVTxnOp{Verb: api.KVSet, Key: l.b.markerKey(m.Key), Value: data}},
	}
	tctx, cancel := context.WithTimeout(ctx, requestTimeout)
	ok, resp, _, err := l.b.client.Txn().Txn(ops, (&api.QueryOptions{}).WithContext(tctx))
	cancel()
	switch {
	case err != nil:
		return fmt.Errorf("consul at %s: write marker %s: %w", l.b.addr, l.b.markerKey(m.Key), err)
	case !ok:
		var why string
		if resp != nil && len(resp.Errors) > 0 {
			why = ": " + resp.Errors[0].What
		}
		return fmt.Errorf("consul: %s is no longer held by session %s%s; marker %s not written: %w",
			l.b.key, l.session, why, l.b.markerKey(m.Key), backends.ErrLeaseLost)
	}
	l.b.dropExpiredMarkers(ctx)
	return nil
}

// dropExpiredMarkers deletes the lock's markers that have expired.
func (b *Backend) dropExpiredMarkers(ctx context.Context) {
	pairs, _, err := b.client.KV().List(b.markerPrefix(), (&api.QueryOptions{}).WithContext(ctx))
	if err != nil {
		return
	}
	now := time.Now()
	for _, p := range pairs {
		var m backends.Marker
		if json.Unmarshal(p.Value, &m) == nil && !now.Before(m.Expires) {
			_, _, _ = b.client.KV().DeleteCAS(p, (&api.WriteOptions{}).WithContext(ctx))
		}
	}
}
