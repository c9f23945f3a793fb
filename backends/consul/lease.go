package consul

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"sync"
	"sync/atomic"
	"time"

	"github.com/leaderrun/leaderrun/backends"
	api "github.com/leaderrun/leaderrun/internal/consulapi"
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
	b        *Backend
	session  string
	token    uint64
	ttl      time.Duration
	acquired time.Time
	rec      record // as written at the grant; renewals add the token and their count

	*backends.Loss // Lost and Err
	stopWatch      context.CancelFunc
	watchDone      chan struct{}

	// renewals counts Renew calls, so that every renewal writes a record
	// of its own; written is the key's ModifyIndex after the last write
	// Consul acknowledged.
	renewals atomic.Uint64
	written  atomic.Uint64

	mu       sync.Mutex
	released bool
}

// newLease starts watching the key from token, the ModifyIndex the
// acquisition gave it.
func newLease(b *Backend, session string, rec record, token uint64, ttl time.Duration, acquired time.Time) *lease {
	ctx, cancel := context.WithCancel(context.Background())
	rec.Token = token
	l := &lease{
		b:         b,
		session:   session,
		token:     token,
		ttl:       ttl,
		acquired:  acquired,
		rec:       rec,
		Loss:      backends.NewLoss(),
		stopWatch: cancel,
		watchDone: make(chan struct{}),
	}
	l.written.Store(token)
	go l.watch(ctx, token)
	return l
}

func (l *lease) Token() uint64       { return l.token }
func (l *lease) TTL() time.Duration  { return l.ttl }
func (l *lease) Acquired() time.Time { return l.acquired }

// Session is the ID of the Consul session that holds the lock.
func (l *lease) Session() string { return l.session }

// Renew implements backends.Lease. It renews the session (PUT
// /v1/session/renew) and, at the same time, rewrites the key's record in a
// transaction that first checks that the key is still held by the session:
// that write moves the key's ModifyIndex, which is how the follower first
// in line tells that this holder is alive. Renew returns nil only if both
// were acknowledged, so that the runner's deadline counts from the send
// time of a renewal that the follower saw, or will see, and that Consul
// applied to the session (docs/safety.md). A session Consul no longer
// has, or a key held by another session or deleted, is a loss.
func (l *lease) Renew(ctx context.Context) error {
	if err := l.Err(); err != nil {
		return err
	}
	rec := l.rec
	rec.Renewal = l.renewals.Add(1)
	var sessionErr error
	var wg sync.WaitGroup
	wg.Add(1)
	go func() {
		defer wg.Done()
		sessionErr = l.renewSession(ctx)
	}()
	writeErr := l.write(ctx, rec)
	wg.Wait()
	for _, err := range []error{sessionErr, writeErr} {
		if errors.Is(err, backends.ErrLeaseLost) {
			l.Set(err)
			return err
		}
	}
	return errors.Join(sessionErr, writeErr)
}

// renewSession renews the session once. Consul answers 404 for a session it
// no longer has: the lease is lost.
func (l *lease) renewSession(ctx context.Context) error {
	entry, _, err := l.b.client.Session().Renew(l.session, (&api.WriteOptions{}).WithContext(ctx))
	switch {
	case err != nil:
		return fmt.Errorf("consul at %s: renew session %s holding %s: %w", l.b.addr, l.session, l.b.key, err)
	case entry == nil:
		return fmt.Errorf("consul: session %s holding %s is gone (expired or destroyed): %w", l.session, l.b.key, backends.ErrLeaseLost)
	}
	return nil
}

// write rewrites the record, fenced by a check of the key's session, and
// makes sure that the write moved the key's ModifyIndex: a write that
// changed nothing would tell the followers nothing.
func (l *lease) write(ctx context.Context, rec record) error {
	ops := api.TxnOps{
		{KV: &api.KVTxnOp{Verb: api.KVCheckSession, Key: l.b.key, Session: l.session}},
		{KV: &api.KVTxnOp{Verb: api.KVSet, Key: l.b.key, Value: rec.encode(), Flags: recordFlags}},
	}
	ok, resp, _, err := l.b.client.Txn().Txn(ops, (&api.QueryOptions{}).WithContext(ctx))
	switch {
	case err != nil:
		return fmt.Errorf("consul at %s: write the record of %s: %w", l.b.addr, l.b.key, err)
	case !ok && isPermissionDenied(txnError(resp)):
		return fmt.Errorf("consul at %s: write the record of %s: %w: %s", l.b.addr, l.b.key, errPermissionDenied, txnError(resp))
	case !ok:
		return fmt.Errorf("consul: %s is no longer held by session %s (%s): %w", l.b.key, l.session, txnError(resp), backends.ErrLeaseLost)
	case len(resp.Results) < 2 || resp.Results[1].KV == nil:
		return fmt.Errorf("consul at %s: write the record of %s: the answer does not show the key", l.b.addr, l.b.key)
	}
	got := resp.Results[1].KV.ModifyIndex
	for {
		prev := l.written.Load()
		if got <= prev {
			// Out of order with a later renewal, or not written at all:
			// either way this one proves nothing new.
			return fmt.Errorf("consul: the record of %s was written at index %d, not after %d", l.b.key, got, prev)
		}
		if l.written.CompareAndSwap(prev, got) {
			return nil
		}
	}
}

// watch holds a blocking query on the key until the key is no longer held
// by this session, or ctx ends. Failed queries are retried: whether the
// store can still be reached is for renewals and the runner's deadline to
// judge; the watch reports only what Consul says about the key.
func (l *lease) watch(ctx context.Context, index uint64) {
	defer close(l.watchDone)
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
// session. If the release fails but the destroy succeeds, the key is freed
// anyway, after the lock-delay. After a loss the term is written on its own.
// The error says whether the session may outlive Release (it then expires
// within 2×TTL) or the term was not recorded.
func (l *lease) Release(ctx context.Context, term *backends.Term) error {
	l.mu.Lock()
	if l.released {
		l.mu.Unlock()
		return nil
	}
	l.released = true
	lost := l.Err() != nil
	l.mu.Unlock()

	// The watch is told to stop and waited for at the end: the release
	// is what the next holder waits for.
	l.stopWatch()
	defer func() { <-l.watchDone }()
	wo := (&api.WriteOptions{}).WithContext(ctx)
	var ops api.TxnOps
	if !lost {
		rec := l.rec
		rec.Renewal = l.renewals.Add(1)
		ops = append(ops, &api.TxnOp{KV: &api.KVTxnOp{Verb: api.KVUnlock, Key: l.b.key, Value: rec.encode(), Flags: recordFlags, Session: l.session}})
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
	<-pruned
	if err != nil {
		return errors.Join(fmt.Errorf("consul at %s: destroy session %s holding %s: %w", l.b.addr, l.session, l.b.key, err), termErr)
	}
	return termErr
}

// Completed implements backends.Lease.
func (l *lease) Completed(ctx context.Context, key string) (*backends.Marker, error) {
	pair, _, err := l.b.client.KV().Get(l.b.markerKey(key), (&api.QueryOptions{RequireConsistent: true}).WithContext(ctx))
	if err != nil {
		return nil, fmt.Errorf("consul at %s: read %s: %w", l.b.addr, l.b.markerKey(key), err)
	}
	if pair == nil {
		return nil, nil
	}
	var m backends.Marker
	if err := json.Unmarshal(pair.Value, &m); err != nil {
		return nil, fmt.Errorf("consul: marker %s is corrupt: %v", l.b.markerKey(key), err)
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
	ok, resp, _, err := l.b.client.Txn().Txn(ops, (&api.QueryOptions{}).WithContext(ctx))
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
