package etcd

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"time"

	"go.etcd.io/etcd/api/v3/mvccpb"
	"go.etcd.io/etcd/api/v3/v3rpc/rpctypes"
	clientv3 "go.etcd.io/etcd/client/v3"
	"k8s.io/apimachinery/pkg/util/wait"

	"github.com/leaderrun/leaderrun/backends"
)

// grant is won leadership: the candidacy whose key leads the election.
// Nothing renews it but Renew, the runner's (the session was orphaned
// when it won); a goroutine watches the key for its loss.
type grant struct {
	t     *ticket
	key   string
	token uint64

	*backends.Loss
	stop context.CancelFunc // ends the watcher
	wg   sync.WaitGroup
}

// newGrant starts watching for the loss of key from revision verified+1:
// the key was seen held at verified, so any later deletion is replayed.
func newGrant(t *ticket, key string, rev, verified int64) *grant {
	ctx, stop := context.WithCancel(context.Background())
	g := &grant{t: t, key: key, token: uint64(rev), Loss: backends.NewLoss(), stop: stop}
	g.wg.Go(func() { g.watchKey(ctx, verified+1) })
	return g
}

func (g *grant) Token() uint64       { return g.token }
func (g *grant) TTL() time.Duration  { return g.t.ttl }
func (g *grant) Acquired() time.Time { return g.t.granted }

// Key is the leader's key in etcd, and ID its lease, for tests.
func (g *grant) Key() string          { return g.key }
func (g *grant) ID() clientv3.LeaseID { return g.t.session.Lease() }
func (g *grant) store() *Store        { return g.t.l.s }
func (g *grant) lostf(f string, a ...any) error {
	return fmt.Errorf("etcd: "+f+": %w", append(a, backends.ErrLeaseLost)...)
}

// Renew sends one keep-alive request. A lease known to be lost is not
// renewed: its key may be gone while the lease itself lives on.
func (g *grant) Renew(ctx context.Context) error {
	if err := g.Err(); err != nil {
		return err
	}
	err := g.store().keepAliveOnce(ctx, g.ID())
	switch {
	case errors.Is(err, rpctypes.ErrLeaseNotFound):
		g.Set(g.lostf("lease %x of %s expired or was revoked", int64(g.ID()), g.key))
	case err != nil:
		return fmt.Errorf("etcd %s: renew lease %x of %s: %w", g.store().endpoints, int64(g.ID()), g.key, err)
	}
	return g.Err()
}

// Release revokes the lease, which deletes the key in the same step, so
// the next candidate wakes after a single round trip.
func (g *grant) Release(ctx context.Context) error {
	if !g.BeginRelease() {
		return nil
	}
	g.stop()
	s := g.store()
	var resigned error
	if g.Err() != nil {
		// A key overwritten without our lease would outlive it and
		// block the election: delete it if it is still the one we
		// created (as Election.Resign: compare the create revision).
		_, resigned = s.cli.Txn(ctx).If(clientv3.Compare(clientv3.CreateRevision(g.key), "=", int64(g.token))).
			Then(clientv3.OpDelete(g.key)).
			Commit()
		if resigned != nil {
			resigned = fmt.Errorf("etcd %s: delete %s: %w", s.endpoints, g.key, resigned)
		}
	}
	err := s.revoke(ctx, g.ID())
	g.wg.Wait()
	return errors.Join(err, resigned)
}

// watchKey closes Lost when the key is deleted, or overwritten without our
// lease. A watch that ends without either (compacted, its member lost its
// leader, cancelled) is replaced after a look at the key; the client
// itself resumes a watch whose connection broke.
func (g *grant) watchKey(ctx context.Context, from int64) {
	cli := g.store().cli
	retry := wait.Backoff{Duration: 50 * time.Millisecond, Factor: 2, Jitter: 0.5, Steps: 64, Cap: time.Second}
	pause := func() bool {
		select {
		case <-ctx.Done():
			return false
		case <-time.After(retry.Step()):
			return true
		}
	}
	for {
		lost, heard := g.watchOnce(ctx, &from)
		if lost || ctx.Err() != nil || !heard && !pause() {
			return
		}
		resp, err := cli.Get(ctx, g.key)
		switch {
		case ctx.Err() != nil:
			return
		case err != nil:
			// Look again in a moment; meanwhile renewals and the
			// runner's deadline stand guard.
			if !pause() {
				return
			}
			continue
		case len(resp.Kvs) == 0 || resp.Kvs[0].CreateRevision != int64(g.token):
			g.Set(g.lostf("key %s is gone", g.key))
			return
		}
		from = resp.Header.GetRevision() + 1
	}
}

// watchOnce watches the key from *from until it is lost (true) or the
// watch ends; heard says whether any answer came, and *from moves past
// every revision the watch reported. A member that loses its leader ends
// the watch instead of keeping it quiet.
func (g *grant) watchOnce(ctx context.Context, from *int64) (lost, heard bool) {
	wctx, cancel := context.WithCancel(clientv3.WithRequireLeader(ctx))
	defer cancel()
	for wr := range g.store().cli.Watch(wctx, g.key, clientv3.WithRev(*from)) {
		if wr.Err() != nil {
			return false, heard
		}
		heard = true
		for _, ev := range wr.Events {
			if err := g.lostBy(ev); err != nil {
				g.Set(err)
				return true, heard
			}
		}
		if wr.Header.Revision >= *from {
			*from = wr.Header.Revision + 1
		}
	}
	return false, heard
}

// lostBy says why ev loses the lease; nil if it does not.
func (g *grant) lostBy(ev *clientv3.Event) error {
	switch {
	case ev.Type == mvccpb.DELETE:
		return g.lostf("key %s was deleted at revision %d (lease %x revoked or expired, or the key removed)",
			g.key, ev.Kv.GetModRevision(), int64(g.ID()))
	case ev.Kv.GetLease() != int64(g.ID()):
		// The key no longer ends with our lease, so proves nothing.
		return g.lostf("key %s was overwritten at revision %d and detached from lease %x",
			g.key, ev.Kv.GetModRevision(), int64(g.ID()))
	}
	return nil
}

// WriteDoc writes d only if the leader's key still has the create
// revision that is this grant's token.
func (g *grant) WriteDoc(ctx context.Context, d backends.Doc) error {
	err := g.t.l.writeDoc(ctx, d, clientv3.Compare(clientv3.CreateRevision(g.key), "=", int64(g.token)))
	if errors.Is(err, backends.ErrLeaseLost) {
		g.Set(err)
	}
	return err
}

// docKey is where document name of the lock lives.
func (l *lock) docKey(name string) string { return l.pfx + ":" + name }

// ReadDoc: the version is the key's mod revision.
func (l *lock) ReadDoc(ctx context.Context, name string) (backends.Doc, error) {
	d := backends.Doc{Name: name}
	resp, err := reach(ctx, l.s, "read "+l.docKey(name), func(ctx context.Context) (*clientv3.GetResponse, error) {
		return l.s.cli.Get(ctx, l.docKey(name))
	})
	if err != nil || len(resp.Kvs) == 0 {
		return d, err
	}
	d.Data, d.Version = resp.Kvs[0].Value, resp.Kvs[0].ModRevision
	return d, nil
}

func (l *lock) WriteDoc(ctx context.Context, d backends.Doc) error { return l.writeDoc(ctx, d) }

// writeDoc puts d in a transaction conditional on the document's mod
// revision and on fence; a fence that fails is a lost lease.
func (l *lock) writeDoc(ctx context.Context, d backends.Doc, fence ...clientv3.Cmp) error {
	key := l.docKey(d.Name)
	rev, _ := d.Version.(int64)
	cmp := clientv3.Compare(clientv3.ModRevision(key), "=", rev)
	resp, err := reach(ctx, l.s, "write "+key, func(ctx context.Context) (*clientv3.TxnResponse, error) {
		return l.s.cli.Txn(ctx).If(append(fence, cmp)...).Then(clientv3.OpPut(key, string(d.Data))).
			Else(clientv3.OpGet(key, clientv3.WithKeysOnly())).Commit()
	})
	switch {
	case err != nil:
		return err
	case resp.Succeeded:
		return nil
	}
	// Which compare failed: the document's own, or the fence.
	if kvs := rangeAt(resp, 0).Kvs; len(fence) == 0 || (len(kvs) > 0 && kvs[0].ModRevision != rev) || (len(kvs) == 0 && rev != 0) {
		return fmt.Errorf("etcd: %s: %w", key, backends.ErrConflict)
	}
	return fmt.Errorf("etcd: the leader's key is no longer this grant's: %s not written: %w", key, backends.ErrLeaseLost)
}
