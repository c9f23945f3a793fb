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

// final reports whether asking again cannot fix err: a refusal, an answer
// larger than the receive limit (gRPC's own error, not etcd's "too many
// requests", which has the same code) or malformed, or a method the
// server does not know.
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

// Join grants a lease of the claim's lease duration, kept alive by a
// session while the candidate waits. With try it reads the election
// first, and leaves no trace if the lock is held.
func (l *lock) Join(ctx context.Context, c backends.Claim, try bool) (backends.Ticket, error) {
	if try {
		resp, err := reach(ctx, l.s, "read "+l.Key(), func(ctx context.Context) (*clientv3.GetResponse, error) {
			return l.s.cli.Get(ctx, l.Key(), clientv3.WithFirstCreate()...)
		})
		if err != nil {
			return nil, err
		}
		if len(resp.Kvs) > 0 {
			kv := resp.Kvs[0]
			id, _ := backends.ParseIdentityValue(string(kv.Value))
			return nil, fmt.Errorf("etcd: %s is held by %q (token %d): %w", l.pfx, id, kv.CreateRevision, backends.ErrLocked)
		}
	}
	var sent time.Time
	grant, err := reach(ctx, l.s, "grant a lease for "+l.Key(), func(ctx context.Context) (*clientv3.LeaseGrantResponse, error) {
		sent = time.Now()
		// Rounded up to whole seconds; etcd raises what is below its
		// minimum, and Grant.TTL reports what was granted.
		g, err := l.s.cli.Grant(ctx, int64((c.Timings.LeaseDuration+time.Second-1)/time.Second))
		if err == nil && g.ID == 0 {
			err = fmt.Errorf("%w: etcd granted no lease", errBadAnswer)
		}
		return g, err
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
	queued   bool // its key was created (by the first Lead's transaction)
}

// Lead: a candidate takes the key as etcd's Mutex.TryLock does (the
// election's keys, in its order), and a try gives up at once if another
// key came first. Otherwise the election's Campaign waits for every older
// key to go (keeping the key and its place), on a
// context that also ends when the session does (its lease expired or was
// revoked), so that the wait ends with ErrEnded rather than with a lead
// whose key is gone.
func (t *ticket) Lead(ctx context.Context) (backends.Grant, error) {
	if t.try || !t.queued {
		// A free lock is led in one transaction, as --try takes it; a
		// candidate that finds another key first has queued its own.
		t.queued = true
		g, err := t.tryLock(ctx)
		if t.try || err == nil || !errors.Is(err, backends.ErrLocked) {
			return g, err
		}
	}
	cctx, cancel := context.WithCancel(clientv3.WithRequireLeader(ctx))
	defer cancel()
	stop := context.AfterFunc(t.session.Ctx(), cancel)
	defer stop()
	done := make(chan error, 1)
	t.l.s.campaigns.Go(func() { done <- campaign(cctx, t.election, t.value) })
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
		return nil, t.l.s.failed("campaign on "+t.l.Key(), err)
	}
	// The election's wait does not check that its own key survived (a
	// lease that expired meanwhile would let a newer candidate lead as
	// well), so the key is read, and the loss watch starts after the
	// revision of that read.
	key, rev := t.election.Key(), t.election.Rev()
	resp, err := reach(ctx, t.l.s, "read "+key, func(ctx context.Context) (*clientv3.GetResponse, error) {
		return t.l.s.cli.Get(ctx, key)
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
	key := fmt.Sprintf("%s%x", t.l.Key(), int64(t.session.Lease()))
	tr, err := reach(ctx, t.l.s, "take "+t.l.Key(), func(ctx context.Context) (*clientv3.TxnResponse, error) {
		return t.l.s.cli.Txn(ctx).If(clientv3.Compare(clientv3.CreateRevision(key), "=", 0)).
			Then(clientv3.OpPut(key, t.value, clientv3.WithLease(t.session.Lease())),
				clientv3.OpGet(t.l.Key(), clientv3.WithFirstCreate()...)).
			Commit()
	})
	if err != nil {
		return nil, err
	}
	rev := tr.Header.GetRevision()
	owner := rangeAt(tr, 1).Kvs
	switch {
	case rev <= 0:
		return nil, t.l.s.failed("take "+t.l.Key(), fmt.Errorf("%w: a transaction answered without a revision", errBadAnswer))
	case !tr.Succeeded || len(owner) == 0 || owner[0].CreateRevision != rev:
		return nil, fmt.Errorf("etcd: %s was taken first by another candidate: %w", t.l.pfx, backends.ErrLocked)
	}
	return t.lead(key, rev, rev), nil
}

// lead hands the lease over to the runner (Session.Orphan stops the
// session's refresh); the grant watches its key from after verified, the
// revision at which it was seen leading.
func (t *ticket) lead(key string, rev, verified int64) *grant {
	t.won = true
	t.session.Orphan()
	return newGrant(t, key, rev, verified)
}

// Leave revokes the session's lease, which deletes its key.
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
// member refuses it without doing anything, with the refusal or with a
// bare EOF (the refusal ended the stream before the request was sent); it
// is then sent again, to the next ready member (at most once per
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

func learnerRefused(err error) bool {
	return err != nil && rpctypes.ErrorDesc(err) == rpctypes.ErrorDesc(rpctypes.ErrGRPCNotSupportedForLearner)
}

// campaign is the election's Campaign, with a malformed answer an error:
// the concurrency package indexes what the server sent without checking
// it (a range answered without a header, an else branch without its
// key), so a hostile endpoint would otherwise crash leaderrun.
func campaign(ctx context.Context, e *concurrency.Election, value string) (err error) {
	defer func() {
		if r := recover(); r != nil {
			err = fmt.Errorf("%w: the election could not read it: %v", errBadAnswer, r)
		}
	}()
	return e.Campaign(ctx, value)
}
