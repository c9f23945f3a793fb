// Package etcd is the etcd store, on etcd's own Go client and its
// concurrency package, as etcdctl elect and etcdctl lock use them: a
// backends.QueueLock whose candidacy is a concurrency.Session in the
// concurrency.Election on <prefix><lock>. The fencing token is the create
// revision of the leader's key. At the win the session is orphaned, so
// that the runner's renewals are the only ones. docs/backends/etcd.md
// argues why the token only grows, where the documents live, and how a
// loss is seen.
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
// timeout).
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

func (s *Store) Name() string { return "etcd" }

func (s *Store) Lock(name string) backends.Lock {
	return &lock{s: s, pfx: s.prefix + name}
}

// Close closes the client, which ends the resignations of cancelled
// campaigns that etcd did not answer.
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

// Key is what every candidate's key starts with.
func (l *lock) Key() string { return l.pfx + "/" }

// Status reads the candidates' keys in one snapshot, then asks for the
// time left on the leader's lease.
func (l *lock) Status(ctx context.Context) (backends.Status, error) {
	st := backends.Status{Remaining: -1, Waiting: -1}
	resp, err := reach(ctx, l.s, "read "+l.Key(), func(ctx context.Context) (*clientv3.TxnResponse, error) {
		return l.s.cli.Txn(ctx).Then(
			clientv3.OpGet(l.Key(), clientv3.WithFirstCreate()...),
			clientv3.OpGet(l.Key(), clientv3.WithPrefix(), clientv3.WithCountOnly()),
		).Commit()
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
	// The leader's own key, named after its lease: what an operator
	// deletes, or whose lease they revoke, to take the lock.
	st.Held, st.Token, st.Key = true, uint64(kv.CreateRevision), string(kv.Key)
	st.Waiting = int(rangeAt(resp, 1).Count) - 1
	if kv.Lease == 0 {
		return st, nil
	}
	// The lease is the leader's business; if it cannot be read, the rest
	// of the answer still stands and the time left stays unknown.
	if ttl, err := reach(ctx, l.s, "read lease", func(ctx context.Context) (*clientv3.LeaseTimeToLiveResponse, error) {
		return l.s.cli.TimeToLive(ctx, clientv3.LeaseID(kv.Lease))
	}); err == nil && ttl.TTL >= 0 {
		st.TTL = time.Duration(ttl.GrantedTTL) * time.Second
		st.Remaining = time.Duration(ttl.TTL) * time.Second
	}
	return st, nil
}

// rangeAt is the i-th answer of a transaction as a Range's; empty if
// there is none.
func rangeAt(resp *clientv3.TxnResponse, i int) *clientv3.GetResponse {
	if i < len(resp.Responses) {
		if r := resp.Responses[i].GetResponseRange(); r != nil {
			return (*clientv3.GetResponse)(r)
		}
	}
	return &clientv3.GetResponse{}
}

// reach runs one request whose failure means that etcd cannot be reached
// or refuses us: the error wraps backends.ErrUnavailable (and ErrRefused
// for a refusal), or is ctx's own. The client waits for a connection as
// long as a request's context allows, so without a bound a campaign with
// no deadline would wait for ever on a store that is down: a request gets
// the dial timeout while no connection is ready, else requestTimeout.
func reach[T any](ctx context.Context, s *Store, op string, f func(context.Context) (T, error)) (T, error) {
	limit := s.dialTimeout
	if s.cli.ActiveConnection().GetState() == connectivity.Ready {
		limit = max(limit, requestTimeout)
	}
	rctx, cancel := context.WithTimeout(ctx, limit)
	defer cancel()
	var last lastError
	v, err := f(context.WithValue(rctx, lastErrorKey{}, &last))
	switch {
	case err == nil:
		return v, nil
	case errors.Is(ctx.Err(), context.DeadlineExceeded):
		// The caller's own deadline (status --timeout): still the
		// caller's error, but one that names the store.
		return v, fmt.Errorf("etcd %s: %s: no answer before the deadline%s: %w: %w",
			s.endpoints, op, last.detail(), backends.ErrUnavailable, ctx.Err())
	case ctx.Err() != nil:
		return v, ctx.Err()
	case rctx.Err() != nil:
		// Not wrapped: a deadline error would read as the caller's own.
		err = fmt.Errorf("no answer within %v%s", limit, last.detail())
	}
	return v, s.failed(op, err)
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

// refused reports whether etcd refused the credentials or permissions.
func refused(err error) bool {
	var ee rpctypes.EtcdError
	return errors.As(err, &ee) && (ee.Code() == codes.PermissionDenied ||
		errors.Is(err, rpctypes.ErrAuthFailed) || errors.Is(err, rpctypes.ErrUserEmpty))
}
