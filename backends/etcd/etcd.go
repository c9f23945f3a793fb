// Package etcd is the etcd store, on etcd's own Go client
// (go.etcd.io/etcd/client/v3) and its concurrency package, as etcdctl
// elect and etcdctl lock use them. It is a backends.QueueLock: each
// candidacy is a concurrency.Session (one etcd lease) and campaigns in the
// concurrency.Election on <prefix><lock>, whose candidates are the keys
// <prefix><lock>/<lease ID in hex> with the identity as value (and, in a
// pool of N > 1 holders, a second line "holders=N": backends.IdentityValue).
// The candidate whose key has the lowest create revision leads; each of
// the others waits for the deletion of the key created just before its
// own, so that a change wakes one waiter. The lock is the one
// `etcdctl elect <prefix><lock>` observes.
//
// The fencing token is the create revision of the leader's key
// (Election.Rev). etcd's revision grows with every write to the store, and
// a candidate leads only once every key created before its own is gone, so
// each new leader's token is greater than that of every leader before it.
//
// Who renews: the session keeps its lease alive while the candidate waits;
// at the win it is orphaned (Session.Orphan stops that refresh), and from
// then on the runner's renewals, one keep-alive request each, are the only
// ones. Leadership is lost when the lease ends (revoked, or expired because
// nobody renewed it within its TTL) or when the key is deleted or
// overwritten: a watch on the leader's own key reports either within a
// round trip (S3). A renewal that etcd answers with "lease not found" is a
// loss too.
//
// A lock's documents are the keys <prefix><lock>:history and
// <prefix><lock>:markers, written in transactions conditional on their mod
// revision, and for a marker on the leader's key still being the grant's.
// Lock names cannot hold ':' (backends.ValidateLockName), so these never
// fall under another lock's election prefix.
package etcd

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"strings"
	"sync"
	"time"

	"go.etcd.io/etcd/api/v3/v3rpc/rpctypes"
	clientv3 "go.etcd.io/etcd/client/v3"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/connectivity"

	"github.com/leaderrun/leaderrun/backends"
)

// Store is one etcd cluster, reached by one client.
type Store struct {
	cli         *clientv3.Client
	endpoints   string // for messages
	nEndpoints  int
	prefix      string
	dialTimeout time.Duration

	// campaigns are the election campaigns under way: one that is
	// cancelled resigns on the client's own context, and ends only once
	// etcd answers or the client is closed.
	campaigns sync.WaitGroup
}

var _ backends.Store = (*Store)(nil)

// Open returns the store of cfg. It does not wait for a connection unless
// cfg.Username is set (authentication is a round trip, bounded by the dial
// timeout); a store that cannot be reached shows in the first campaign or
// status, as an error wrapping backends.ErrUnavailable.
func Open(cfg Config) (*Store, error) {
	if len(cfg.Endpoints) == 0 {
		return nil, errors.New("etcd: no endpoints")
	}
	if cfg.DialTimeout <= 0 {
		cfg.DialTimeout = DefaultDialTimeout
	}
	if cfg.Log == nil {
		cfg.Log = slog.New(slog.DiscardHandler)
	}
	s := &Store{
		endpoints:   backends.Redact(strings.Join(cfg.Endpoints, ",")),
		nEndpoints:  len(cfg.Endpoints),
		prefix:      cfg.Prefix,
		dialTimeout: cfg.DialTimeout,
	}
	ccfg, err := clientConfig(cfg, cfg.Log.With("backend", "etcd"))
	if err != nil {
		return nil, err
	}
	cli, err := clientv3.New(ccfg)
	switch {
	case err == nil:
	case errors.Is(err, context.DeadlineExceeded):
		return nil, s.unavailable("authenticate as "+cfg.Username,
			fmt.Errorf("no answer within the dial timeout (%v)", cfg.DialTimeout))
	default:
		return nil, s.unavailable("connect", err)
	}
	s.cli = cli
	// The client connects on its first request; start now, so that the
	// handshake overlaps with what the caller does before campaigning.
	cli.ActiveConnection().Connect()
	return s, nil
}

// Name implements backends.Store.
func (s *Store) Name() string { return "etcd" }

// Lock implements backends.Store: the election on <prefix><name>.
func (s *Store) Lock(name string) backends.Lock {
	return &lock{s: s, pfx: s.prefix + name}
}

// Close implements backends.Store: it closes the client, which ends the
// resignations of cancelled campaigns that etcd did not answer.
func (s *Store) Close() error {
	err := s.cli.Close()
	s.campaigns.Wait()
	if err != nil && !errors.Is(err, context.Canceled) {
		return err
	}
	return nil
}

// lock is one election.
type lock struct {
	s   *Store
	pfx string // <prefix><lock>
}

// Key implements backends.Lock: what every candidate's key starts with.
func (l *lock) Key() string { return l.prefix() }

// prefix is what every candidate's key starts with.
func (l *lock) prefix() string { return l.pfx + "/" }

// Status implements backends.QueueLock. It reads the candidates' keys in
// one snapshot, then asks for the time left on the leader's lease.
func (l *lock) Status(ctx context.Context) (backends.Status, error) {
	st := backends.Status{Remaining: -1, Waiting: -1}
	var resp *clientv3.TxnResponse
	err := l.s.reach(ctx, "read "+l.prefix(), func(ctx context.Context) (err error) {
		resp, err = l.s.cli.Txn(ctx).Then(
			clientv3.OpGet(l.prefix(), clientv3.WithFirstCreate()...),
			clientv3.OpGet(l.prefix(), clientv3.WithPrefix(), clientv3.WithCountOnly()),
		).Commit()
		return err
	})
	if err != nil {
		return st, err
	}
	leader := rangeAt(resp, 0).Kvs
	st.Waiting = 0
	if len(leader) == 0 {
		return st, nil
	}
	kv := leader[0]
	st.Identity, st.Holders = backends.ParseIdentityValue(string(kv.Value))
	st.Held, st.Token = true, uint64(kv.CreateRevision)
	st.Waiting = int(rangeAt(resp, 1).Count) - 1
	if kv.Lease == 0 {
		return st, nil
	}
	// The lease is the leader's business; if it cannot be read, the rest
	// of the answer still stands and the time left stays unknown.
	var ttl *clientv3.LeaseTimeToLiveResponse
	if l.s.reach(ctx, "read lease", func(ctx context.Context) (err error) {
		ttl, err = l.s.cli.TimeToLive(ctx, clientv3.LeaseID(kv.Lease))
		return err
	}) == nil && ttl.TTL >= 0 {
		st.TTL = time.Duration(ttl.GrantedTTL) * time.Second
		st.Remaining = time.Duration(ttl.TTL) * time.Second
	}
	return st, nil
}

// rangeAt is the i-th answer of a transaction as a Range's; empty if the
// answer lacks it.
func rangeAt(resp *clientv3.TxnResponse, i int) *clientv3.GetResponse {
	if i < len(resp.Responses) {
		if r := resp.Responses[i].GetResponseRange(); r != nil {
			return (*clientv3.GetResponse)(r)
		}
	}
	return &clientv3.GetResponse{}
}

// reach runs one request whose failure means that etcd cannot be reached or
// refuses us. The client waits for a connection for as long as a request's
// context allows, so without a bound a campaign with no deadline would
// wait for ever on a store that is down: a request that starts without a
// ready connection gets the dial timeout, for connecting and answering;
// one that starts with one gets requestTimeout (etcdctl's command timeout).
// The error wraps backends.ErrUnavailable (and ErrRefused for a refusal),
// or is ctx's own if ctx ended.
func (s *Store) reach(ctx context.Context, op string, f func(context.Context) error) error {
	limit := s.dialTimeout
	if s.cli.ActiveConnection().GetState() == connectivity.Ready {
		limit = max(limit, requestTimeout)
	}
	rctx, cancel := context.WithTimeout(ctx, limit)
	defer cancel()
	var last lastError
	err := f(withLastError(rctx, &last))
	switch {
	case err == nil:
		return nil
	case errors.Is(ctx.Err(), context.DeadlineExceeded):
		// The caller's own deadline (status --timeout): still the
		// caller's error, but one that names the store.
		return fmt.Errorf("etcd %s: %s: no answer before the deadline%s: %w: %w",
			s.endpoints, op, last.detail(), backends.ErrUnavailable, ctx.Err())
	case ctx.Err() != nil:
		return ctx.Err()
	case rctx.Err() != nil:
		// Not wrapped: a deadline error would read as the caller's own.
		err = fmt.Errorf("no answer within %v%s", limit, last.detail())
	}
	return s.failed(op, err)
}

// failed is the error of a request that etcd failed or refused.
func (s *Store) failed(op string, err error) error {
	switch {
	case refused(err):
		return fmt.Errorf("etcd %s: %s refused (%v): the user needs readwrite permission on the lock's keys: %w: %w",
			s.endpoints, op, err, backends.ErrUnavailable, backends.ErrRefused)
	case final(err):
		return fmt.Errorf("etcd %s: %s: %w: %w: %w", s.endpoints, op, backends.ErrUnavailable, backends.ErrRefused, err)
	}
	return s.unavailable(op, err)
}

func (s *Store) unavailable(op string, err error) error {
	return fmt.Errorf("etcd %s: %s: %w: %w", s.endpoints, op, backends.ErrUnavailable, err)
}

// refused reports whether etcd turned a request down for a reason that
// trying again cannot fix: bad credentials or missing permissions.
func refused(err error) bool {
	var ee rpctypes.EtcdError
	if !errors.As(err, &ee) {
		return false
	}
	return ee.Code() == codes.PermissionDenied ||
		errors.Is(err, rpctypes.ErrAuthFailed) || errors.Is(err, rpctypes.ErrUserEmpty)
}
