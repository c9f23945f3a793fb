package etcd

import (
	"context"
	"errors"
	"fmt"
	"io"
	"time"

	"go.etcd.io/etcd/api/v3/v3rpc/rpctypes"
	clientv3 "go.etcd.io/etcd/client/v3"
	"go.etcd.io/etcd/client/v3/concurrency"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"github.com/leaderrun/leaderrun/backends"
)

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

// Join implements backends.QueueLock: a session (an etcd lease of the
// claim's lease duration, rounded up to whole seconds, kept alive by the
// session while the candidate waits) and the election it campaigns in.
// With try it reads the election first, and leaves no trace at all if the
// lock is held.
func (l *lock) Join(ctx context.Context, c backends.Claim, try bool) (backends.Ticket, error) {
	if try {
		var resp *clientv3.GetResponse
		err := l.s.reach(ctx, "read "+l.prefix(), func(ctx context.Context) (err error) {
			resp, err = l.s.cli.Get(ctx, l.prefix(), clientv3.WithFirstCreate()...)
			return err
		})
		if err != nil {
			return nil, err
		}
		if len(resp.Kvs) > 0 {
			kv := resp.Kvs[0]
			return nil, fmt.Errorf("etcd: %s is held by %q (token %d): %w", l.pfx, identityOf(kv.Value), kv.CreateRevision, backends.ErrLocked)
		}
	}
	var (
		grant *clientv3.LeaseGrantResponse
		sent  time.Time
	)
	err := l.s.reach(ctx, "grant a lease for "+l.prefix(), func(ctx context.Context) (err error) {
		sent = time.Now()
		grant, err = l.s.cli.Grant(ctx, ttlSeconds(c.Timings.LeaseDuration))
		if err == nil && grant.ID == 0 {
			err = fmt.Errorf("%w: etcd granted no lease", errBadAnswer)
		}
		return err
	})
	if err != nil {
		return nil, err
	}
	session, err := concurrency.NewSession(l.s.cli, concurrency.WithLease(grant.ID))
	if err != nil {
		rctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), requestTimeout)
		defer cancel()
		_, _ = l.s.cli.Revoke(rctx, grant.ID)
		return nil, l.s.unavailable("keep lease alive", err)
	}
	return &ticket{l: l, session: session, election: concurrency.NewElection(session, l.pfx),
		value: backends.IdentityValue(c), try: try, granted: sent, ttl: time.Duration(grant.TTL) * time.Second}, nil
}

// ttlSeconds is the TTL to ask of etcd for d: etcd grants whole seconds,
// so d is rounded up (and etcd raises what is below its minimum, 1.5 × its
// election timeout); Grant.TTL reports what was granted.
func ttlSeconds(d time.Duration) int64 {
	return int64((d + time.Second - 1) / time.Second)
}

// ticket is one candidacy: its session and its place in the election.
type ticket struct {
	l        *lock
	session  *concurrency.Session
	election *concurrency.Election
	value    string
	try      bool
	granted  time.Time     // send time of the lease's grant
	ttl      time.Duration // as granted
	won      bool
}

// Lead implements backends.Ticket. A try takes the key as etcd's
// Mutex.TryLock does (the same keys as the election's, ordered the same
// way) and gives up at once if another key came first. Otherwise the
// election's Campaign waits for every older key to go; it runs on a
// context that also ends when the session does (its lease expired while
// etcd was out of reach, or was revoked), so that the wait ends with
// ErrEnded rather than with a lead whose key is gone.
func (t *ticket) Lead(ctx context.Context) (backends.Grant, error) {
	if t.try {
		return t.tryLock(ctx)
	}
	cctx, cancel := context.WithCancel(clientv3.WithRequireLeader(ctx))
	defer cancel()
	stop := context.AfterFunc(t.session.Ctx(), cancel)
	defer stop()
	done := make(chan error, 1)
	t.l.s.campaigns.Add(1)
	go func() {
		defer t.l.s.campaigns.Done()
		done <- t.election.Campaign(cctx, t.value)
	}()
	var err error
	select {
	case err = <-done:
	case <-cctx.Done():
		// Campaign resigns on the client's own context; its goroutine
		// is the store's to wait for.
	}
	switch {
	case ctx.Err() != nil:
		return nil, ctx.Err()
	case t.session.Ctx().Err() != nil:
		return nil, fmt.Errorf("etcd: the keep-alive of lease %x stopped while it waited: %w", int64(t.session.Lease()), backends.ErrEnded)
	case err != nil:
		return nil, t.l.s.failed("campaign on "+t.l.prefix(), err)
	}
	return t.confirm(ctx, t.election.Key(), t.election.Rev())
}

// confirm turns a won campaign into a grant. The election's wait returns
// once every older key is gone without checking that its own survived: a
// lease that expired meanwhile would let a newer candidate lead as well.
// So the key is read, and the loss watch starts after the revision of that
// read, replaying any later deletion.
func (t *ticket) confirm(ctx context.Context, key string, rev int64) (backends.Grant, error) {
	var resp *clientv3.GetResponse
	err := t.l.s.reach(ctx, "read "+key, func(ctx context.Context) (err error) {
		resp, err = t.l.s.cli.Get(ctx, key)
		return err
	})
	switch {
	case err != nil:
		return nil, err
	case len(resp.Kvs) == 0 || resp.Kvs[0].CreateRevision != rev:
		return nil, fmt.Errorf("etcd: %s was deleted before its campaign returned: %w", key, backends.ErrEnded)
	}
	return t.lead(key, rev, resp.Header.GetRevision()), nil
}

// tryLock is Mutex.TryLock's transaction, with the candidate's value:
// create the key and read the oldest one in the same step.
func (t *ticket) tryLock(ctx context.Context) (backends.Grant, error) {
	key := fmt.Sprintf("%s%x", t.l.prefix(), int64(t.session.Lease()))
	var tr *clientv3.TxnResponse
	err := t.l.s.reach(ctx, "take "+t.l.prefix(), func(ctx context.Context) (err error) {
		tr, err = t.l.s.cli.Txn(ctx).If(clientv3.Compare(clientv3.CreateRevision(key), "=", 0)).
			Then(clientv3.OpPut(key, t.value, clientv3.WithLease(t.session.Lease())),
				clientv3.OpGet(t.l.prefix(), clientv3.WithFirstCreate()...)).
			Commit()
		return err
	})
	if err != nil {
		return nil, err
	}
	rev := tr.Header.GetRevision()
	owner := rangeAt(tr, 1).Kvs
	switch {
	case rev <= 0:
		return nil, t.l.s.failed("take "+t.l.prefix(), fmt.Errorf("%w: a transaction answered without a revision", errBadAnswer))
	case !tr.Succeeded || len(owner) == 0 || owner[0].CreateRevision != rev:
		return nil, fmt.Errorf("etcd: %s was taken first by another candidate: %w", t.l.pfx, backends.ErrLocked)
	}
	return t.lead(key, rev, rev), nil
}

// lead hands the lease over to the runner: the session's refresh stops
// (Session.Orphan), and the grant watches its key from after verified, the
// revision at which it was seen leading.
func (t *ticket) lead(key string, rev, verified int64) *grant {
	t.won = true
	t.session.Orphan()
	return newGrant(t, key, rev, verified)
}

// Leave implements backends.Ticket: revoking the session's lease deletes
// its key in the same step.
func (t *ticket) Leave(ctx context.Context) error {
	if t.won {
		return nil
	}
	t.session.Orphan()
	return t.l.s.revoke(ctx, t.session.Lease())
}

// revoke revokes lease id; one that is already gone is no error.
func (s *Store) revoke(ctx context.Context, id clientv3.LeaseID) error {
	if _, err := s.cli.Revoke(ctx, id); err != nil && !errors.Is(err, rpctypes.ErrLeaseNotFound) {
		return fmt.Errorf("etcd %s: revoke lease %x: %w", s.endpoints, int64(id), err)
	}
	return nil
}

// keepAliveOnce renews lease id with one keep-alive request. A learner
// member refuses it without doing anything: with the refusal, or with a
// bare EOF if the refusal ended the stream before the request was sent
// (the client then returns the send's error). It is then sent again, and
// the client sends it to the next ready member (at most once per
// endpoint; a keep-alive is idempotent anyway).
func (s *Store) keepAliveOnce(ctx context.Context, id clientv3.LeaseID) error {
	var err error
	for range s.nEndpoints {
		_, err = s.cli.KeepAliveOnce(ctx, id)
		if !learnerRefused(err) && !errors.Is(err, io.EOF) {
			return err
		}
	}
	return err
}

// learnerRefused reports whether a learner member refused the request: it
// did nothing, and another member may serve it.
func learnerRefused(err error) bool {
	return err != nil && rpctypes.ErrorDesc(err) == rpctypes.ErrorDesc(rpctypes.ErrGRPCNotSupportedForLearner)
}

// identityOf is the identity in a candidate's value.
func identityOf(v []byte) string {
	id, _ := backends.ParseIdentityValue(string(v))
	return id
}
