package etcd

import (
	"context"
	"errors"
	"fmt"
	"io"
	"sync"
	"time"

	"go.etcd.io/etcd/api/v3/mvccpb"
	"go.etcd.io/etcd/api/v3/v3rpc/rpctypes"
	clientv3 "go.etcd.io/etcd/client/v3"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"github.com/leaderrun/leaderrun/backends"
)

// errCandidacyEnded says that a waiting candidacy ended before it won: its
// lease's keep-alive stopped (the lease expired or was revoked, or etcd
// did not answer for a whole TTL), its key vanished, or its first write
// failed. A waiting candidate then campaigns again with a new lease.
var errCandidacyEnded = errors.New("etcd: candidacy ended while waiting")

// errFinal marks what asking again cannot fix: a refusal (permission
// denied, bad credentials) or an answer the client cannot use. Final,
// whatever the mode.
var errFinal = errors.New("etcd: final")

// Campaign implements backends.Backend.
//
// A waiting candidate holds a key in the election's queue, and keeps its
// lease alive itself, every third of its TTL, as etcd's client does for a
// session. That keep-alive stops before Campaign returns: from then on
// the runner's Renew is the only renewal (backends.Backend). If the
// candidacy ends while it waits (its lease expired while etcd was out of
// reach, or was revoked), it notices and campaigns again with a new lease;
// only the first contact with etcd failing is ErrUnavailable. Cancelling
// ctx revokes the candidacy's lease, which deletes its key, on a context
// of its own bounded by a couple of seconds.
//
// With opts.Try it reads the election first, and leaves no trace at all if
// the lock is held. Otherwise it takes a key as etcd's Mutex.TryLock does
// (the same keys as the election's, ordered the same way), and withdraws
// at once if another key came first.
func (b *Backend) Campaign(ctx context.Context, opts backends.CampaignOptions) (backends.Lease, error) {
	ttl := ttlSeconds(opts.LeaseDuration)
	value := candidateValue(opts)
	if opts.Try {
		return b.try(ctx, value, ttl)
	}
	var retry backends.Backoff
	for attempt := 0; ; attempt++ {
		l, err := b.campaign(ctx, value, ttl)
		switch {
		case err == nil:
			return l, nil
		case ctx.Err() != nil:
			return nil, ctx.Err()
		case errors.Is(err, errFinal), attempt == 0 && !errors.Is(err, errCandidacyEnded):
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

// errBadAnswer marks an answer that no etcd member gives.
var errBadAnswer = errors.New("etcd: malformed answer")

// final reports whether err is one that asking again cannot fix: a
// refusal, an answer larger than the receive limit (gRPC's own error, not
// etcd's "too many requests", which has the same code) or malformed, or a
// method the server does not know.
func final(err error) bool {
	if refused(err) || errors.Is(err, errBadAnswer) {
		return true
	}
	var ee rpctypes.EtcdError
	switch status.Code(err) {
	case codes.ResourceExhausted:
		return !errors.As(err, &ee)
	case codes.Unimplemented:
		return true
	}
	return false
}

// learnerRefused reports whether a learner member refused the request: it
// did nothing, and another member may serve it.
func learnerRefused(err error) bool {
	return err != nil && rpctypes.ErrorDesc(err) == rpctypes.ErrorDesc(rpctypes.ErrGRPCNotSupportedForLearner)
}

// candidateKey is the key of the candidacy with lease id: the election's
// prefix and the lease ID in hex, as etcd's concurrency package names it.
func (b *Backend) candidateKey(id clientv3.LeaseID) string {
	return fmt.Sprintf("%s%x", b.prefix(), int64(id))
}

// campaign is one candidacy, whose key holds value (see candidateValue):
// it waits in the election's queue until it leads, its lease's keep-alive
// stops or ctx ends.
func (b *Backend) campaign(ctx context.Context, value string, ttl int64) (*lease, error) {
	c, err := b.newCandidacy(ctx, ttl)
	if err != nil {
		return nil, err
	}
	// Cancelling ctx ends the candidacy's context: the wait returns at
	// once, leaving withdraw to revoke the lease on a bounded context.
	stop := context.AfterFunc(ctx, c.end)
	key, rev, verified, err := c.elect(value)
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
			return nil, fmt.Errorf("%w: %w", errFinal, b.refusal("put", b.prefix()+"…", err))
		case final(err):
			return nil, fmt.Errorf("%w: %w", errFinal, b.unavailable("campaign on "+b.prefix(), err))
		case ended:
			return nil, fmt.Errorf("%w: the keep-alive of lease %x stopped", errCandidacyEnded, int64(c.id))
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

// elect puts the candidacy's key in the election's queue, with value (see
// candidateValue), and waits until every key created before it is
// gone. rev is the key's create revision. verified is the revision at
// which the key was seen leading if the transaction that created it
// already saw no older key; 0 if the candidacy waited (confirm must then
// look at the key again).
func (c *candidacy) elect(value string) (key string, rev, verified int64, err error) {
	b := c.b
	key = b.candidateKey(c.id)
	// Ours is the newest key under the prefix once the put is done: the
	// two newest are ours and the one we must wait for, if any.
	newest := clientv3.OpGet(b.prefix(), clientv3.WithPrefix(),
		clientv3.WithSort(clientv3.SortByCreateRevision, clientv3.SortDescend), clientv3.WithLimit(2))
	resp, err := b.cli.Txn(c.ctx).If(clientv3.Compare(clientv3.CreateRevision(key), "=", 0)).
		Then(clientv3.OpPut(key, value, clientv3.WithLease(c.id)), newest).
		Else(clientv3.OpGet(key), newest).
		Commit()
	if err != nil {
		return key, 0, 0, err
	}
	rev = resp.Header.GetRevision()
	if rev <= 0 {
		return key, 0, 0, fmt.Errorf("%w: a transaction answered without a revision", errBadAnswer)
	}
	if !resp.Succeeded {
		// The key exists already (this lease campaigned before): keep
		// its place, and make its value ours.
		kvs := rangeAt(resp, 0).Kvs
		if len(kvs) == 0 {
			return key, 0, 0, fmt.Errorf("%s vanished while campaigning", key)
		}
		rev = kvs[0].CreateRevision
		if string(kvs[0].Value) != value {
			if err := c.proclaim(c.ctx, key, rev, value); err != nil {
				return key, rev, 0, err
			}
		}
	}
	var ahead *mvccpb.KeyValue
	for _, kv := range rangeAt(resp, 1).Kvs {
		if kv.CreateRevision < rev {
			ahead = kv
			break
		}
	}
	if ahead == nil && resp.Succeeded {
		return key, rev, resp.Header.GetRevision(), nil
	}
	return key, rev, 0, c.waitDeletes(rev, ahead, resp.Header.GetRevision())
}

// proclaim sets the value of the candidacy's key, if it is still the one
// created at rev.
func (c *candidacy) proclaim(ctx context.Context, key string, rev int64, value string) error {
	resp, err := c.b.cli.Txn(ctx).If(clientv3.Compare(clientv3.CreateRevision(key), "=", rev)).
		Then(clientv3.OpPut(key, value, clientv3.WithLease(c.id))).
		Commit()
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
// connection, a compacted revision, a member that lost its leader) is
// simply started again from a new look. It returns when the candidacy's
// context ends, or on an error that asking again cannot fix.
func (c *candidacy) waitDeletes(rev int64, ahead *mvccpb.KeyValue, at int64) error {
	b := c.b
	retry := backends.Backoff{Min: 50 * time.Millisecond, Max: time.Second}
	for {
		if ahead == nil {
			resp, err := b.cli.Get(c.ctx, b.prefix(), append(clientv3.WithLastCreate(), clientv3.WithMaxCreateRev(rev-1))...)
			if err != nil {
				if final(err) || c.ctx.Err() != nil {
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
			ahead, at = resp.Kvs[0], resp.Header.GetRevision()
		}
		deleted, err := c.waitDelete(string(ahead.Key), at)
		switch {
		case c.ctx.Err() != nil:
			return c.ctx.Err()
		case final(err):
			return err
		case deleted:
			retry.Reset()
		case retry.Sleep(c.ctx) != nil:
			return c.ctx.Err()
		}
		ahead = nil
	}
}

// waitDelete watches key from revision at until it is deleted (true), or
// the watch ends with why.
func (c *candidacy) waitDelete(key string, at int64) (bool, error) {
	// A member that loses its leader ends the watch instead of keeping
	// it quiet: the next look goes to one that has a leader.
	wctx, cancel := context.WithCancel(clientv3.WithRequireLeader(c.ctx))
	defer cancel()
	for wr := range c.b.cli.Watch(wctx, key, clientv3.WithRev(at)) {
		if err := wr.Err(); err != nil {
			return false, err
		}
		for _, ev := range wr.Events {
			if ev.Type == clientv3.EventTypeDelete {
				return true, nil
			}
		}
	}
	return false, errors.New("watch of " + key + " ended")
}

// try takes the lock only if nobody holds it and nobody is ahead in the
// queue, with a key that holds value (see candidateValue). Every request
// is bounded (see reach): a --try never waits.
func (b *Backend) try(ctx context.Context, value string, ttl int64) (backends.Lease, error) {
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
		return nil, fmt.Errorf("etcd: %s is held by %q (token %d): %w", b.pfx, parseValue(kv.Value).identity, kv.CreateRevision, backends.ErrLocked)
	}
	c, err := b.newCandidacy(ctx, ttl)
	if err != nil {
		return nil, err
	}
	key := b.candidateKey(c.id)
	var tr *clientv3.TxnResponse
	err = b.reach(ctx, "take "+b.prefix(), func(ctx context.Context) (err error) {
		// Mutex.TryLock's transaction, with our value: create the key
		// and read the oldest one in the same step.
		tr, err = b.cli.Txn(ctx).If(clientv3.Compare(clientv3.CreateRevision(key), "=", 0)).
			Then(clientv3.OpPut(key, value, clientv3.WithLease(c.id)), clientv3.OpGet(b.prefix(), clientv3.WithFirstCreate()...)).
			Commit()
		return err
	})
	if err != nil {
		c.withdraw()
		if refused(err) {
			return nil, b.refusal("put", b.prefix()+"…", err)
		}
		return nil, err
	}
	owner := rangeAt(tr, 1).Kvs
	if !tr.Succeeded || len(owner) == 0 || owner[0].CreateRevision != tr.Header.GetRevision() {
		c.withdraw()
		return nil, fmt.Errorf("etcd: %s was taken first by another candidate: %w", b.pfx, backends.ErrLocked)
	}
	rev := tr.Header.GetRevision()
	if rev <= 0 {
		c.withdraw()
		return nil, b.unavailable("take "+b.prefix(), fmt.Errorf("%w: a transaction answered without a revision", errBadAnswer))
	}
	return newLease(c, key, rev, c.granted, rev), nil
}

// candidacy is one bid for the lock: a lease, and the loop that keeps it
// alive while the candidacy waits (every third of its TTL, as etcd's
// client does for a session). The loop stops when the candidacy wins,
// before Campaign returns.
type candidacy struct {
	b       *Backend
	id      clientv3.LeaseID
	ctx     context.Context // ends on end, or when the keep-alive stops on its own
	end     context.CancelFunc
	granted time.Time     // send time of the Grant
	ttl     time.Duration // as granted

	stopKeepAlive context.CancelFunc
	stopOnce      sync.Once
	wg            sync.WaitGroup
}

// newCandidacy grants a lease and starts keeping it alive. A failure wraps
// backends.ErrUnavailable.
func (b *Backend) newCandidacy(ctx context.Context, ttl int64) (*candidacy, error) {
	var (
		resp *clientv3.LeaseGrantResponse
		sent time.Time
	)
	err := b.reach(ctx, "grant a lease for "+b.prefix(), func(ctx context.Context) (err error) {
		sent = time.Now()
		resp, err = b.cli.Grant(ctx, ttl)
		if err == nil && resp.ID == 0 {
			err = errors.New("etcd granted no lease")
		}
		return err
	})
	if err != nil {
		return nil, err
	}
	cctx, end := context.WithCancel(context.Background())
	kctx, stopKeepAlive := context.WithCancel(context.Background())
	c := &candidacy{
		b:             b,
		id:            resp.ID,
		ctx:           cctx,
		end:           end,
		granted:       sent,
		ttl:           time.Duration(resp.TTL) * time.Second,
		stopKeepAlive: stopKeepAlive,
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
		err := c.b.keepAliveOnce(rctx, c.id)
		cancel()
		switch {
		case ctx.Err() != nil:
			return
		case err == nil:
			deadline = time.Now().Add(c.ttl)
			next = c.ttl / 3
			continue
		case leaseNotFound(err), !time.Now().Before(deadline):
			c.end()
			return
		}
		next = 500 * time.Millisecond
	}
}

// keepAliveOnce renews lease id with one keep-alive request. A learner
// member refuses it without doing anything: with the refusal, or with a
// bare EOF if the refusal ended the stream before the request was sent
// (the client then returns the send's error). It is then sent again, and
// the client sends it to the next ready member (at most once per
// endpoint; a keep-alive is idempotent anyway).
func (b *Backend) keepAliveOnce(ctx context.Context, id clientv3.LeaseID) error {
	var err error
	for range b.nEndpoints {
		_, err = b.cli.KeepAliveOnce(ctx, id)
		if !learnerRefused(err) && !errors.Is(err, io.EOF) {
			return err
		}
	}
	return err
}

// leaseNotFound reports whether etcd said that a lease does not exist.
func leaseNotFound(err error) bool { return errors.Is(err, rpctypes.ErrLeaseNotFound) }

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
	rctx, cancel := context.WithTimeout(ctx, requestTimeout)
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
	return newLease(c, key, rev, c.granted, resp.Header.GetRevision()), nil
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
	if _, err := c.b.cli.Revoke(ctx, c.id); err != nil && !leaseNotFound(err) {
		return fmt.Errorf("etcd %s: revoke lease %x of %s: %w", c.b.endpoints, int64(c.id), c.b.prefix(), err)
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
