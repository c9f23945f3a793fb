package etcd

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"sync"
	"time"

	"go.etcd.io/etcd/api/v3/mvccpb"
	clientv3 "go.etcd.io/etcd/client/v3"

	"github.com/leaderrun/leaderrun/backends"
)

// lease is won leadership: the candidacy whose key leads the election.
//
// Nothing renews it but Renew, the runner's: the candidacy's keep-alive
// stopped when it won. A goroutine watches the key for its loss: etcd
// deletes it when the lease is revoked or expires, or someone deletes or
// overwrites it, and the watch reports that within a round trip. A lease
// that etcd no longer knows is also reported by the next Renew. A store
// that cannot be asked is the runner's business: its renew deadline
// expires first.
type lease struct {
	c        *candidacy
	key      string
	token    uint64
	acquired time.Time

	*backends.Loss                    // Lost and Err
	stop           context.CancelFunc // ends the watcher
	wg             sync.WaitGroup
}

var _ backends.Lease = (*lease)(nil)

// newLease stops the candidacy's keep-alive, and starts watching for the
// loss of key from revision verified+1: the key was seen held at verified,
// so any later deletion is replayed.
func newLease(c *candidacy, key string, rev int64, acquired time.Time, verified int64) *lease {
	c.stop()
	ctx, stop := context.WithCancel(context.Background())
	l := &lease{
		c:        c,
		key:      key,
		token:    uint64(rev),
		acquired: acquired,
		Loss:     backends.NewLoss(),
		stop:     stop,
	}
	l.wg.Add(1)
	go func() {
		defer l.wg.Done()
		l.watchKey(ctx, verified+1)
	}()
	return l
}

func (l *lease) Token() uint64       { return l.token }
func (l *lease) TTL() time.Duration  { return l.c.ttl }
func (l *lease) Acquired() time.Time { return l.acquired }

// Key is the leader's key in etcd.
func (l *lease) Key() string { return l.key }

// ID is the etcd lease that the key is attached to.
func (l *lease) ID() int64 { return int64(l.c.id) }

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
	err := l.c.b.keepAliveOnce(ctx, l.c.id)
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
// cannot be part of a transaction), and the watcher is waited for after.
func (l *lease) Release(ctx context.Context, term *backends.Term) error {
	if !l.BeginRelease() {
		return nil
	}
	l.stop()
	b := l.c.b
	recorded := make(chan error, 1)
	if term != nil {
		go func() { recorded <- b.record(ctx, *term) }()
	} else {
		recorded <- nil
	}
	var resigned error
	if l.Err() != nil {
		// A key overwritten without our lease would outlive it and
		// block the election: delete it if it is still the one we
		// created (as Election.Resign: compare the create revision).
		_, resigned = b.cli.Txn(ctx).If(clientv3.Compare(clientv3.CreateRevision(l.key), "=", int64(l.token))).
			Then(clientv3.OpDelete(l.key)).
			Commit()
		if resigned != nil {
			resigned = fmt.Errorf("etcd %s: delete %s: %w", b.endpoints, l.key, resigned)
		}
	}
	err := l.c.close(ctx)
	l.wg.Wait()
	return errors.Join(err, resigned, <-recorded)
}

// Completed implements backends.Backend.
func (b *Backend) Completed(ctx context.Context, key string) (*backends.Marker, error) {
	resp, err := b.cli.Get(ctx, b.markerKey(key))
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
	grant, err := b.cli.Grant(ctx, ttlSeconds(time.Until(m.Expires)))
	if err != nil {
		return fmt.Errorf("etcd %s: grant a lease for marker %s: %w", b.endpoints, b.markerKey(m.Key), err)
	}
	resp, err := b.cli.Txn(ctx).If(clientv3.Compare(clientv3.CreateRevision(l.key), "=", int64(l.token))).
		Then(clientv3.OpPut(b.markerKey(m.Key), string(data), clientv3.WithLease(grant.ID))).
		Commit()
	if err == nil && resp.Succeeded {
		return nil
	}
	rctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), withdrawTimeout)
	defer cancel()
	_, _ = b.cli.Revoke(rctx, grant.ID)
	if err != nil {
		return fmt.Errorf("etcd %s: write marker %s: %w", b.endpoints, b.markerKey(m.Key), err)
	}
	return l.lostErr("key %s is no longer this lease's (token %d): marker %s not written", l.key, l.token, b.markerKey(m.Key))
}

// watchKey closes Lost when the key is deleted, or overwritten without our
// lease. A watch that ends without either (its history was compacted, the
// member lost its leader, etcd cancelled it) is replaced after a look at
// the key; the client itself resumes a watch whose connection broke.
func (l *lease) watchKey(ctx context.Context, from int64) {
	cli := l.c.b.cli
	retry := backends.Backoff{Min: 50 * time.Millisecond, Max: time.Second}
	for {
		lost, heard := l.watchOnce(ctx, &from)
		if lost || ctx.Err() != nil {
			return
		}
		if !heard && retry.Sleep(ctx) != nil {
			return
		}
		resp, err := cli.Get(ctx, l.key)
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
		if heard {
			retry.Reset()
		}
		from = resp.Header.GetRevision() + 1
	}
}

// watchOnce watches the key from *from until it is lost (true) or the
// watch ends; heard says whether any answer came, and *from moves past
// every revision the watch reported.
func (l *lease) watchOnce(ctx context.Context, from *int64) (lost, heard bool) {
	wctx, cancel := context.WithCancel(clientv3.WithRequireLeader(ctx))
	defer cancel()
	for wr := range l.c.b.cli.Watch(wctx, l.key, clientv3.WithRev(*from)) {
		if wr.Err() != nil {
			return false, heard
		}
		heard = true
		for _, ev := range wr.Events {
			if l.lostBy(ev) {
				return true, heard
			}
		}
		if wr.Header.Revision >= *from {
			*from = wr.Header.Revision + 1
		}
	}
	return false, heard
}

// lostBy closes Lost if ev deletes the key or detaches it from our lease.
func (l *lease) lostBy(ev *clientv3.Event) bool {
	switch {
	case ev.Type == mvccpb.DELETE:
		l.Set(l.lostErr("key %s was deleted at revision %d (lease %x revoked or expired, or the key removed)",
			l.key, ev.Kv.GetModRevision(), l.ID()))
		return true
	case ev.Kv.GetLease() != l.ID():
		// Overwritten without our lease: the key no longer ends with
		// it, so it no longer proves anything about us.
		l.Set(l.lostErr("key %s was overwritten at revision %d and detached from lease %x",
			l.key, ev.Kv.GetModRevision(), l.ID()))
		return true
	}
	return false
}
