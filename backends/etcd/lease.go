package etcd

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"sync"
	"time"

	"github.com/leaderrun/leaderrun/backends"
)

// lease is won leadership: the candidacy whose key leads the election.
//
// Two goroutines watch for its loss. One watches the key: etcd deletes it
// when the lease is revoked or expires, or someone deletes or overwrites
// it, and the watch reports that within a round trip. The other waits for the
// candidacy's keep-alive to stop; that happens when etcd says the lease is
// gone, but also when etcd did not answer for a whole TTL, so it asks etcd
// before it calls the lease lost. A store that cannot be asked is the
// runner's business: its renew deadline expires first.
type lease struct {
	c        *candidacy
	key      string
	token    uint64
	acquired time.Time

	*backends.Loss                    // Lost and Err
	stop           context.CancelFunc // ends the watchers
	wg             sync.WaitGroup
}

var _ backends.Lease = (*lease)(nil)

// newLease starts watching for the loss of key from revision verified+1:
// the key was seen held at verified, so any later deletion is replayed.
func newLease(c *candidacy, key string, rev int64, acquired time.Time, verified int64) *lease {
	ctx, stop := context.WithCancel(context.Background())
	l := &lease{
		c:        c,
		key:      key,
		token:    uint64(rev),
		acquired: acquired,
		Loss:     backends.NewLoss(),
		stop:     stop,
	}
	l.wg.Add(2)
	go func() {
		defer l.wg.Done()
		l.watchKey(ctx, verified+1)
	}()
	go func() {
		defer l.wg.Done()
		l.watchSession(ctx)
	}()
	return l
}

func (l *lease) Token() uint64       { return l.token }
func (l *lease) TTL() time.Duration  { return l.c.ttl }
func (l *lease) Acquired() time.Time { return l.acquired }

// Key is the leader's key in etcd.
func (l *lease) Key() string { return l.key }

// ID is the etcd lease that the key is attached to.
func (l *lease) ID() int64 { return l.c.id }

func (l *lease) String() string { return fmt.Sprintf("%s (lease %x)", l.key, l.ID()) }

func (l *lease) lostErr(format string, args ...any) error {
	return fmt.Errorf("etcd: "+format+": %w", append(args, backends.ErrLeaseLost)...)
}

// Renew implements backends.Lease with one keep-alive request. A lease that
// is already known to be lost is not renewed: its key may be gone while the
// lease itself lives on.
func (l *lease) Renew(ctx context.Context) error {
	if err := l.Err(); err != nil {
		return err
	}
	_, err := l.c.b.cli.keepAlive(ctx, l.ID())
	switch {
	case leaseNotFound(err):
		l.Set(l.lostErr("lease %x of %s expired or was revoked", l.ID(), l.key))
		return l.Err()
	case err != nil:
		return fmt.Errorf("etcd %s: renew lease %x of %s: %w", l.c.b.endpoints, l.ID(), l.key, err)
	}
	return l.Err()
}

// Release implements backends.Lease: revoking the lease deletes the key in
// the same step, so the next candidate wakes after a single round trip.
// That revoke is what the next leader waits for, so it goes first; the term
// goes to the history at the same time, in a request of its own (a revoke
// cannot be part of a transaction), and the watchers are waited for after.
func (l *lease) Release(ctx context.Context, term *backends.Term) error {
	if !l.BeginRelease() {
		return nil
	}
	l.stop()
	recorded := make(chan error, 1)
	if term != nil {
		go func() { recorded <- l.c.b.record(ctx, *term) }()
	} else {
		recorded <- nil
	}
	var resigned error
	if l.Err() != nil {
		// A key overwritten without our lease would outlive it and
		// block the election: delete it if it is still the one we
		// created (as Election.Resign: compare the create revision).
		_, resigned = l.c.b.cli.txn(ctx, txnRequest{
			Compare: []compare{createdIs(l.key, int64(l.token))},
			Success: []requestOp{{Delete: &deleteRequest{Key: []byte(l.key)}}},
		})
		if resigned != nil {
			resigned = fmt.Errorf("etcd %s: delete %s: %w", l.c.b.endpoints, l.key, resigned)
		}
	}
	err := l.c.close(ctx)
	l.wg.Wait()
	return errors.Join(err, resigned, <-recorded)
}

// Completed implements backends.Lease.
func (l *lease) Completed(ctx context.Context, key string) (*backends.Marker, error) {
	b := l.c.b
	resp, err := b.cli.rangeKeys(ctx, &rangeRequest{Key: []byte(b.markerKey(key))})
	if err != nil {
		return nil, fmt.Errorf("etcd %s: read %s: %w", b.endpoints, b.markerKey(key), err)
	}
	if len(resp.Kvs) == 0 {
		return nil, nil
	}
	var m backends.Marker
	if err := json.Unmarshal(resp.Kvs[0].Value, &m); err != nil {
		return nil, fmt.Errorf("etcd: marker %s is corrupt: %v", b.markerKey(key), err)
	}
	if !time.Now().Before(m.Expires) {
		return nil, nil
	}
	return &m, nil
}

// Complete implements backends.Lease: one transaction puts the marker if
// and only if the leader's key still has the create revision that is this
// lease's token. The marker is attached to an etcd lease of its own whose
// TTL is its lifetime, so that etcd deletes it when it expires.
func (l *lease) Complete(ctx context.Context, m backends.Marker) error {
	b := l.c.b
	data, err := json.Marshal(m)
	if err != nil {
		return err
	}
	keep := ttlSeconds(time.Until(m.Expires))
	grant, _, err := b.cli.grant(ctx, keep)
	if err != nil {
		return fmt.Errorf("etcd %s: grant a lease for marker %s: %w", b.endpoints, b.markerKey(m.Key), err)
	}
	resp, err := b.cli.txn(ctx, txnRequest{
		Compare: []compare{createdIs(l.key, int64(l.token))},
		Success: []requestOp{{Put: &putRequest{Key: []byte(b.markerKey(m.Key)), Value: data, Lease: grant}}},
	})
	if err == nil && resp.Succeeded {
		return nil
	}
	rctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), withdrawTimeout)
	defer cancel()
	_ = b.cli.revoke(rctx, grant)
	if err != nil {
		return fmt.Errorf("etcd %s: write marker %s: %w", b.endpoints, b.markerKey(m.Key), err)
	}
	return l.lostErr("key %s is no longer this lease's (token %d): marker %s not written", l.key, l.token, b.markerKey(m.Key))
}

// watchKey closes Lost when the key is deleted, or overwritten without our
// lease. A watch that ends without either (a broken connection, its
// history was compacted, etcd cancelled it) is replaced after a look at
// the key.
func (l *lease) watchKey(ctx context.Context, from int64) {
	cli := l.c.b.cli
	retry := backends.Backoff{Min: 50 * time.Millisecond, Max: time.Second}
	for {
		lost := false
		_ = cli.watch(ctx, l.key, from, func(evs []watchEvent, at int64) bool {
			for _, ev := range evs {
				switch {
				case ev.Type == eventDelete:
					l.Set(l.lostErr("key %s was deleted at revision %d (lease %x revoked or expired, or the key removed)",
						l.key, ev.Kv.ModRevision, l.ID()))
					lost = true
					return false
				case ev.Kv.Lease != l.ID():
					// Overwritten without our lease: the key no
					// longer ends with it, so it no longer proves
					// anything about us.
					l.Set(l.lostErr("key %s was overwritten at revision %d and detached from lease %x",
						l.key, ev.Kv.ModRevision, l.ID()))
					lost = true
					return false
				}
			}
			if at >= from {
				from = at + 1
			}
			return true
		})
		if lost || ctx.Err() != nil {
			return
		}
		resp, err := cli.rangeKeys(ctx, &rangeRequest{Key: []byte(l.key)})
		switch {
		case ctx.Err() != nil:
			return
		case err != nil:
			// Look again in a moment; meanwhile renewals and the
			// runner's deadline stand guard.
			if retry.Sleep(ctx) != nil {
				return
			}
			continue
		case len(resp.Kvs) == 0 || resp.Kvs[0].CreateRevision != int64(l.token):
			l.Set(l.lostErr("key %s is gone", l.key))
			return
		}
		retry.Reset()
		from = resp.Header.Revision + 1
	}
}

// watchSession asks etcd about the lease once the candidacy's keep-alive
// has stopped on its own, and closes Lost if etcd says that the lease is
// gone.
func (l *lease) watchSession(ctx context.Context) {
	select {
	case <-ctx.Done():
		return
	case <-l.c.ended:
	}
	retry := backends.Backoff{Min: 50 * time.Millisecond, Max: time.Second}
	for {
		ttl, _, err := l.c.b.cli.timeToLive(ctx, l.ID())
		switch {
		case err == nil && ttl >= 0:
			// Alive: the keep-alive stopped on a silence. Renew keeps
			// the lease from here on, or its deadline stops the child.
			return
		case err == nil, leaseNotFound(err):
			// TTL -1: etcd no longer knows the lease.
			l.Set(l.lostErr("lease %x of %s expired or was revoked", l.ID(), l.key))
			return
		}
		if ctx.Err() != nil || retry.Sleep(ctx) != nil {
			return
		}
	}
}
