package etcd

import (
	"context"
	"errors"
	"fmt"
	"time"

	"go.etcd.io/etcd/api/v3/v3rpc/rpctypes"
	clientv3 "go.etcd.io/etcd/client/v3"
	"go.etcd.io/etcd/client/v3/concurrency"
	"go.uber.org/zap"

	"github.com/leaderrun/leaderrun/backends"
)

// errCandidacyEnded says that a waiting candidacy ended before it won: its
// session's keep-alive stopped (the lease expired or was revoked, or etcd
// did not answer for a whole TTL), its key vanished, or its wait failed. A
// waiting candidate then campaigns again with a new session.
var errCandidacyEnded = errors.New("etcd: candidacy ended while waiting")

// Campaign implements backends.Backend.
//
// A waiting candidate holds a key in the election's queue. If its candidacy
// ends while it waits (its lease expired while etcd was out of reach, or
// was revoked), it notices and campaigns again with a new session; only the
// first contact with etcd failing is ErrUnavailable. Cancelling ctx revokes
// the candidacy's lease, which deletes its key, on a context of its own
// bounded by a couple of seconds.
//
// With opts.Try it reads the election first, and leaves no trace at all if
// the lock is held. Otherwise it takes a key with the concurrency package's
// Mutex.TryLock (the same keys as the Election's, ordered the same way), and
// withdraws at once if another key came first.
func (b *Backend) Campaign(ctx context.Context, opts backends.CampaignOptions) (backends.Lease, error) {
	ttl := ttlSeconds(opts.LeaseDuration)
	if opts.Try {
		return b.try(ctx, opts.Identity, ttl)
	}
	var retry backends.Backoff
	for attempt := 0; ; attempt++ {
		l, err := b.campaign(ctx, opts.Identity, ttl)
		switch {
		case err == nil:
			return l, nil
		case ctx.Err() != nil:
			return nil, ctx.Err()
		case errors.Is(err, errRefused), attempt == 0 && !errors.Is(err, errCandidacyEnded):
			return nil, err
		}
		pause := retry.Next()
		b.log.Warn("campaigning again", "identity", opts.Identity, "reason", err, "in", pause)
		t := time.NewTimer(pause)
		select {
		case <-ctx.Done():
			t.Stop()
			return nil, ctx.Err()
		case <-t.C:
		}
	}
}

// ttlSeconds is the TTL to ask of etcd for d: etcd grants whole seconds,
// so d is rounded up (and etcd raises what is below its minimum, 1.5 × its
// election timeout); Lease.TTL reports what was granted.
func ttlSeconds(d time.Duration) int64 {
	if d <= 0 {
		d = defaultTTL
	}
	return int64((d + time.Second - 1) / time.Second)
}

// errRefused marks a refusal (permission denied, bad credentials): final,
// whatever the mode.
var errRefused = errors.New("etcd: refused")

// campaign is one candidacy: it waits in the election's queue until it
// leads, its session ends or ctx ends.
func (b *Backend) campaign(ctx context.Context, identity string, ttl int64) (*lease, error) {
	c, err := b.newCandidacy(ctx, ttl)
	if err != nil {
		return nil, err
	}
	e := concurrency.NewElection(c.session, b.pfx)
	// Cancelling ctx ends the candidacy's context: Election.Campaign stops
	// waiting and its own clean-up, which runs on that context, returns at
	// once, leaving withdraw to do it on a bounded one.
	stop := context.AfterFunc(ctx, c.end)
	err = e.Campaign(c.ctx, identity)
	if !stop() || ctx.Err() != nil {
		c.withdraw()
		return nil, ctx.Err()
	}
	if err != nil {
		// Before withdraw, which ends the candidacy's context: a refusal
		// must not read as a keep-alive that stopped.
		ended := c.ctx.Err() != nil
		c.withdraw()
		switch {
		case refused(err):
			return nil, fmt.Errorf("%w: %w", errRefused, b.refusal("put", b.prefix()+"…", err))
		case ended:
			return nil, fmt.Errorf("%w: the keep-alive of lease %x stopped", errCandidacyEnded, c.id())
		}
		return nil, fmt.Errorf("%w: %v", errCandidacyEnded, err)
	}
	return c.confirm(ctx, e.Key(), e.Rev())
}

// try takes the lock only if nobody holds it and nobody is ahead in the
// queue. Every request is bounded by the dial timeout: a --try never waits.
func (b *Backend) try(ctx context.Context, identity string, ttl int64) (backends.Lease, error) {
	var resp *clientv3.GetResponse
	err := b.reach(ctx, "read "+b.prefix(), func(ctx context.Context) (err error) {
		resp, err = b.cli.Get(ctx, b.prefix(), clientv3.WithFirstCreate()...)
		return err
	})
	if err != nil {
		return nil, err
	}
	if len(resp.Kvs) > 0 {
		kv := resp.Kvs[0]
		return nil, fmt.Errorf("etcd: %s is held by %q (token %d): %w", b.pfx, kv.Value, kv.CreateRevision, backends.ErrLocked)
	}
	c, err := b.newCandidacy(ctx, ttl)
	if err != nil {
		return nil, err
	}
	m := concurrency.NewMutex(c.session, b.pfx)
	var e *concurrency.Election
	err = b.reach(ctx, "take "+b.prefix(), func(ctx context.Context) error {
		if err := m.TryLock(ctx); err != nil {
			return err
		}
		// The Mutex stores no value: record the identity as the
		// Election does, checking that the key is still ours at the
		// revision TryLock created it.
		e = concurrency.ResumeElection(c.session, b.prefix(), m.Key(), m.Header().Revision)
		return e.Proclaim(ctx, identity)
	})
	if err != nil {
		c.withdraw()
		if errors.Is(err, concurrency.ErrLocked) || errors.Is(err, concurrency.ErrElectionNotLeader) {
			return nil, fmt.Errorf("etcd: %s was taken first by another candidate: %w", b.pfx, backends.ErrLocked)
		}
		if refused(err) {
			return nil, b.refusal("put", b.prefix()+"…", err)
		}
		return nil, err
	}
	return newLease(c, e.Key(), e.Rev(), c.granted, e.Header().Revision), nil
}

// candidacy is one bid for the lock: a lease, the session that keeps it
// alive, and a view of the client whose Ctx() ends with the candidacy.
//
// The view matters because the concurrency package cleans up on
// client.Ctx() (Election.Campaign resigns on it when its context ends), and
// the real client's context lasts until Close: with etcd out of reach that
// clean-up would block a cancelled campaign for ever. The view shares the
// real client's connection; it must never be closed, or it would close the
// real client's lease and watch streams.
type candidacy struct {
	b       *Backend
	ctx     context.Context // ends, the view's Ctx() with it, on end or when the keep-alive stops
	end     context.CancelFunc
	session *concurrency.Session
	granted time.Time     // send time of the Grant
	ttl     time.Duration // as granted
}

// newCandidacy grants a lease and starts its session. A failure wraps
// backends.ErrUnavailable.
func (b *Backend) newCandidacy(ctx context.Context, ttl int64) (*candidacy, error) {
	var (
		grant *clientv3.LeaseGrantResponse
		sent  time.Time
	)
	err := b.reach(ctx, "grant a lease for "+b.prefix(), func(ctx context.Context) (err error) {
		sent = time.Now()
		grant, err = b.cli.Grant(ctx, ttl)
		return err
	})
	if err != nil {
		return nil, err
	}
	cctx, end := context.WithCancel(context.Background())
	view := clientv3.NewCtxClient(cctx, clientv3.WithZapLogger(zap.NewNop()))
	view.KV, view.Lease, view.Watcher = b.cli.KV, b.cli.Lease, b.cli.Watcher
	s, err := concurrency.NewSession(view, concurrency.WithLease(grant.ID), concurrency.WithTTL(int(grant.TTL)))
	if err != nil {
		end()
		b.revoke(grant.ID)
		return nil, b.unavailable(fmt.Sprintf("keep lease %x alive", grant.ID), err)
	}
	// A session whose keep-alive stopped ends the candidacy's context too,
	// so that a waiting Election.Campaign returns and its clean-up on
	// client.Ctx() cannot block.
	context.AfterFunc(s.Ctx(), end)
	return &candidacy{
		b:       b,
		ctx:     cctx,
		end:     end,
		session: s,
		granted: sent,
		ttl:     time.Duration(grant.TTL) * time.Second,
	}, nil
}

func (c *candidacy) id() clientv3.LeaseID { return c.session.Lease() }

// confirm turns a won candidacy into a lease. rev is the key's create
// revision.
//
// Election.Campaign returns once every older key is gone without checking
// that its own survived, and a lease that expired while it waited would let
// a newer candidate lead as well: confirm reads the key, and the loss watch
// starts after the revision of that read, replaying any later deletion.
// Acquired stays the Grant's send time; the runner renews a lease whose
// proof of life is old before it starts the child.
func (c *candidacy) confirm(ctx context.Context, key string, rev int64) (*lease, error) {
	// etcd answered a moment ago; if it does not now, campaign again
	// rather than wait on a connection for as long as ctx allows.
	rctx, cancel := context.WithTimeout(ctx, c.b.dialTimeout)
	defer cancel()
	resp, err := c.b.cli.Get(rctx, key)
	if err != nil || len(resp.Kvs) == 0 || resp.Kvs[0].CreateRevision != rev {
		c.withdraw()
		switch {
		case ctx.Err() != nil:
			return nil, ctx.Err()
		case err != nil:
			return nil, fmt.Errorf("%w: read %s after winning: %v", errCandidacyEnded, key, err)
		}
		return nil, fmt.Errorf("%w: %s was deleted before its campaign returned", errCandidacyEnded, key)
	}
	return newLease(c, key, rev, c.granted, resp.Header.Revision), nil
}

// withdraw ends a candidacy that did not win: revoking its lease deletes its
// key in the same step. It runs on its own bounded context, whatever became
// of the caller's.
func (c *candidacy) withdraw() {
	ctx, cancel := context.WithTimeout(context.Background(), withdrawTimeout)
	defer cancel()
	_ = c.close(ctx)
}

// close stops the session's keep-alive and revokes the lease. A lease that
// is already gone is not an error.
func (c *candidacy) close(ctx context.Context) error {
	c.end()
	c.session.Orphan()
	_, err := c.b.cli.Revoke(ctx, c.id())
	if err != nil && !errors.Is(err, rpctypes.ErrLeaseNotFound) {
		return fmt.Errorf("etcd %s: revoke lease %x of %s: %w", c.b.endpoints, c.id(), c.b.prefix(), err)
	}
	return nil
}

// revoke gives back a lease that never got a session.
func (b *Backend) revoke(id clientv3.LeaseID) {
	ctx, cancel := context.WithTimeout(context.Background(), withdrawTimeout)
	defer cancel()
	_, _ = b.cli.Revoke(ctx, id)
}
