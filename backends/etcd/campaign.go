package etcd

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"time"

	"github.com/leaderrun/leaderrun/backends"
)

// errCandidacyEnded says that a waiting candidacy ended before it won: its
// lease's keep-alive stopped (the lease expired or was revoked, or etcd
// did not answer for a whole TTL), its key vanished, or its first write
// failed. A waiting candidate then campaigns again with a new lease.
var errCandidacyEnded = errors.New("etcd: candidacy ended while waiting")

// Campaign implements backends.Backend.
//
// A waiting candidate holds a key in the election's queue. If its candidacy
// ends while it waits (its lease expired while etcd was out of reach, or
// was revoked), it notices and campaigns again with a new lease; only the
// first contact with etcd failing is ErrUnavailable. Cancelling ctx revokes
// the candidacy's lease, which deletes its key, on a context of its own
// bounded by a couple of seconds.
//
// With opts.Try it reads the election first, and leaves no trace at all if
// the lock is held. Otherwise it takes a key as etcd's Mutex.TryLock does
// (the same keys as the election's, ordered the same way), and withdraws
// at once if another key came first.
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

// candidateKey is the key of the candidacy with lease id: the election's
// prefix and the lease ID in hex, as etcd's concurrency package names it.
func (b *Backend) candidateKey(id int64) string { return fmt.Sprintf("%s%x", b.prefix(), id) }

// campaign is one candidacy: it waits in the election's queue until it
// leads, its lease's keep-alive stops or ctx ends.
func (b *Backend) campaign(ctx context.Context, identity string, ttl int64) (*lease, error) {
	c, err := b.newCandidacy(ctx, ttl)
	if err != nil {
		return nil, err
	}
	// Cancelling ctx ends the candidacy's context: the wait returns at
	// once, leaving withdraw to revoke the lease on a bounded context.
	stop := context.AfterFunc(ctx, c.end)
	key, rev, verified, err := c.elect(identity)
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
			return nil, fmt.Errorf("%w: the keep-alive of lease %x stopped", errCandidacyEnded, c.id)
		}
		return nil, fmt.Errorf("%w: %v", errCandidacyEnded, err)
	}
	if verified > 0 {
		// Led at once: the transaction that created the key saw no
		// older one.
		return newLease(c, key, rev, c.granted, verified), nil
	}
	return c.confirm(ctx, key, rev)
}

// elect puts the candidacy's key in the election's queue, with the
// identity as its value, and waits until every key created before it is
// gone. rev is the key's create revision. verified is the revision at
// which the key was seen leading if the transaction that created it
// already saw no older key; 0 if the candidacy waited (confirm must then
// look at the key again).
func (c *candidacy) elect(identity string) (key string, rev, verified int64, err error) {
	b := c.b
	key = b.candidateKey(c.id)
	// Ours is the newest key under the prefix once the put is done: the
	// two newest are ours and the one we must wait for, if any.
	newest := &rangeRequest{Key: []byte(b.prefix()), RangeEnd: prefixEnd(b.prefix()), Limit: 2, SortOrder: sortDescend, SortTarget: sortByCreate}
	resp, err := b.cli.txn(c.ctx, txnRequest{
		Compare: []compare{createdIs(key, 0)},
		Success: []requestOp{{Put: &putRequest{Key: []byte(key), Value: []byte(identity), Lease: c.id}}, {Range: newest}},
		Failure: []requestOp{{Range: &rangeRequest{Key: []byte(key)}}, {Range: newest}},
	})
	if err != nil {
		return key, 0, 0, err
	}
	rev = resp.Header.Revision
	if !resp.Succeeded {
		// The key exists already (this lease campaigned before): keep
		// its place, and make its value ours.
		kvs := resp.rangeAt(0).Kvs
		if len(kvs) == 0 {
			return key, 0, 0, fmt.Errorf("%s vanished while campaigning", key)
		}
		rev = kvs[0].CreateRevision
		if string(kvs[0].Value) != identity {
			if err := c.proclaim(c.ctx, key, rev, identity); err != nil {
				return key, rev, 0, err
			}
		}
	}
	var ahead *keyValue
	for _, kv := range resp.rangeAt(1).Kvs {
		if kv.CreateRevision < rev {
			ahead = &kv
			break
		}
	}
	if ahead == nil && resp.Succeeded {
		return key, rev, resp.Header.Revision, nil
	}
	return key, rev, 0, c.waitDeletes(rev, ahead, resp.Header.Revision)
}

// proclaim sets the value of the candidacy's key, if it is still the one
// created at rev.
func (c *candidacy) proclaim(ctx context.Context, key string, rev int64, identity string) error {
	resp, err := c.b.cli.txn(ctx, txnRequest{
		Compare: []compare{createdIs(key, rev)},
		Success: []requestOp{{Put: &putRequest{Key: []byte(key), Value: []byte(identity), Lease: c.id}}},
	})
	if err != nil {
		return err
	}
	if !resp.Succeeded {
		return fmt.Errorf("%s is no longer the one created at revision %d", key, rev)
	}
	return nil
}

// waitDeletes waits until no key under the prefix was created before rev,
// as etcd's election does: it watches only the newest such key (ahead,
// seen at revision at), so that each deletion wakes one waiter, then looks
// for the next one. A watch that ends without the deletion (a broken
// connection, a compacted revision) is simply started again from a new
// look. It returns when the candidacy's context ends.
func (c *candidacy) waitDeletes(rev int64, ahead *keyValue, at int64) error {
	b := c.b
	retry := backends.Backoff{Min: 50 * time.Millisecond, Max: time.Second}
	for {
		if ahead == nil {
			resp, err := b.cli.rangeKeys(c.ctx, lastCreatedBefore(b.prefix(), rev))
			if err != nil {
				if refused(err) || c.ctx.Err() != nil {
					return err
				}
				if retry.Sleep(c.ctx) != nil {
					return c.ctx.Err()
				}
				continue
			}
			if len(resp.Kvs) == 0 {
				return nil
			}
			ahead, at = &resp.Kvs[0], resp.Header.Revision
		}
		deleted := false
		err := b.cli.watch(c.ctx, string(ahead.Key), at, func(evs []watchEvent, _ int64) bool {
			for _, ev := range evs {
				if ev.Type == eventDelete {
					deleted = true
					return false
				}
			}
			return true
		})
		if c.ctx.Err() != nil {
			return c.ctx.Err()
		}
		if deleted {
			retry.Reset()
		} else if err != nil && retry.Sleep(c.ctx) != nil {
			return c.ctx.Err()
		}
		ahead = nil
	}
}

// try takes the lock only if nobody holds it and nobody is ahead in the
// queue. Every request is bounded by the dial timeout: a --try never waits.
func (b *Backend) try(ctx context.Context, identity string, ttl int64) (backends.Lease, error) {
	var resp *rangeResponse
	err := b.reach(ctx, "read "+b.prefix(), func(ctx context.Context) (err error) {
		resp, err = b.cli.rangeKeys(ctx, firstCreated(b.prefix()))
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
	key := b.candidateKey(c.id)
	var tr *txnResponse
	err = b.reach(ctx, "take "+b.prefix(), func(ctx context.Context) (err error) {
		// Mutex.TryLock's transaction, with the identity as the value:
		// create the key and read the oldest one in the same step.
		tr, err = b.cli.txn(ctx, txnRequest{
			Compare: []compare{createdIs(key, 0)},
			Success: []requestOp{{Put: &putRequest{Key: []byte(key), Value: []byte(identity), Lease: c.id}}, {Range: firstCreated(b.prefix())}},
		})
		return err
	})
	if err != nil {
		c.withdraw()
		if refused(err) {
			return nil, b.refusal("put", b.prefix()+"…", err)
		}
		return nil, err
	}
	owner := tr.rangeAt(1).Kvs
	if !tr.Succeeded || len(owner) == 0 || owner[0].CreateRevision != tr.Header.Revision {
		c.withdraw()
		return nil, fmt.Errorf("etcd: %s was taken first by another candidate: %w", b.pfx, backends.ErrLocked)
	}
	rev := tr.Header.Revision
	return newLease(c, key, rev, c.granted, rev), nil
}

// candidacy is one bid for the lock: a lease, and the loop that keeps it
// alive while the candidacy lasts (every third of its TTL, as etcd's
// client does for a session), whoever else renews it.
type candidacy struct {
	b       *Backend
	id      int64
	ctx     context.Context // ends on end, or when the keep-alive stops
	end     context.CancelFunc
	granted time.Time     // send time of the Grant
	ttl     time.Duration // as granted

	stopKeepAlive context.CancelFunc
	// ended is closed when the keep-alive stopped on its own: etcd said
	// the lease is gone, or did not answer for a whole TTL.
	ended    chan struct{}
	stopOnce sync.Once
	wg       sync.WaitGroup
}

// newCandidacy grants a lease and starts keeping it alive. A failure wraps
// backends.ErrUnavailable.
func (b *Backend) newCandidacy(ctx context.Context, ttl int64) (*candidacy, error) {
	var (
		id, granted int64
		sent        time.Time
	)
	err := b.reach(ctx, "grant a lease for "+b.prefix(), func(ctx context.Context) (err error) {
		sent = time.Now()
		id, granted, err = b.cli.grant(ctx, ttl)
		return err
	})
	if err != nil {
		return nil, err
	}
	cctx, end := context.WithCancel(context.Background())
	kctx, stopKeepAlive := context.WithCancel(context.Background())
	c := &candidacy{
		b:             b,
		id:            id,
		ctx:           cctx,
		end:           end,
		granted:       sent,
		ttl:           time.Duration(granted) * time.Second,
		stopKeepAlive: stopKeepAlive,
		ended:         make(chan struct{}),
	}
	c.wg.Add(1)
	go func() {
		defer c.wg.Done()
		c.keepAlive(kctx)
	}()
	return c, nil
}

// keepAlive renews the lease every third of its TTL until ctx ends. It
// stops on its own, ending the candidacy, when etcd says the lease is gone,
// or when no renewal was answered for a whole TTL.
func (c *candidacy) keepAlive(ctx context.Context) {
	deadline := time.Now().Add(c.ttl)
	next := c.ttl / 3
	for {
		t := time.NewTimer(next)
		select {
		case <-ctx.Done():
			t.Stop()
			return
		case <-t.C:
		}
		rctx, cancel := context.WithTimeout(ctx, max(time.Until(deadline), 500*time.Millisecond))
		_, err := c.b.cli.keepAlive(rctx, c.id)
		cancel()
		switch {
		case ctx.Err() != nil:
			return
		case err == nil:
			deadline = time.Now().Add(c.ttl)
			next = c.ttl / 3
			continue
		case leaseNotFound(err), !time.Now().Before(deadline):
			close(c.ended)
			c.end()
			return
		}
		next = 500 * time.Millisecond
	}
}

// confirm turns a candidacy that won after waiting into a lease. rev is
// the key's create revision.
//
// The wait returns once every older key is gone without checking that its
// own survived, and a lease that expired while it waited would let a newer
// candidate lead as well: confirm reads the key, and the loss watch starts
// after the revision of that read, replaying any later deletion. Acquired
// stays the Grant's send time; the runner renews a lease whose proof of
// life is old before it starts the child.
func (c *candidacy) confirm(ctx context.Context, key string, rev int64) (*lease, error) {
	// etcd answered a moment ago; if it does not now, campaign again
	// rather than wait on a connection for as long as ctx allows.
	rctx, cancel := context.WithTimeout(ctx, c.b.dialTimeout)
	defer cancel()
	resp, err := c.b.cli.rangeKeys(rctx, &rangeRequest{Key: []byte(key)})
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

// close stops the keep-alive and revokes the lease. A lease that is already
// gone is not an error.
func (c *candidacy) close(ctx context.Context) error {
	c.stop()
	if err := c.b.cli.revoke(ctx, c.id); err != nil {
		return fmt.Errorf("etcd %s: revoke lease %x of %s: %w", c.b.endpoints, c.id, c.b.prefix(), err)
	}
	return nil
}

// stop ends the candidacy's context and its keep-alive, and waits for the
// keep-alive's last request to end.
func (c *candidacy) stop() {
	c.stopOnce.Do(func() {
		c.end()
		c.stopKeepAlive()
		c.wg.Wait()
	})
}
