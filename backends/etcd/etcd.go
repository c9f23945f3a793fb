// Package etcd is the etcd backend, on etcd's own Go client
// (go.etcd.io/etcd/client/v3). Candidates campaign as etcd's concurrency
// package does (etcdctl elect and etcdctl lock use it): one lease per
// candidacy and an election on <prefix><lock>, whose candidates are the keys
// <prefix><lock>/<lease ID in hex> with the identity as value (and, in a
// pool of N > 1 holders, a second line "holders=N": see candidateValue). The
// candidate whose key has the lowest create revision leads; each of the
// others waits for the deletion of the key created just before its own, so
// that a change wakes one waiter. The lock is therefore the one `etcdctl
// elect <prefix><lock>` observes.
//
// The fencing token is the create revision of the leader's key. etcd's
// revision grows with every write to the store, and a candidate leads only
// once every key created before its own is gone, so each new leader's token is
// greater than that of every leader before it.
//
// Leadership is lost when the lease ends (revoked, or expired because nobody
// renewed it within its TTL) or when the key is deleted. A watch on the
// leader's own key reports both within a round trip (S3): etcd deletes a
// lease's keys when the lease ends. A renewal that etcd answers with "lease
// not found" is a loss too.
//
// Who renews (backends.Backend): a waiting candidate keeps its own lease
// alive; that stops before Campaign returns, and from then on the runner's
// Lease.Renew, one keep-alive request per call, is the only renewal.
//
// The slots of a pool (--holders) are elections of their own, on
// <prefix><lock>.slot<i>/ (Backend.Slot), on the one client: a candidate
// for several slots holds one connection, and an etcd lease per candidacy.
package etcd

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"strings"
	"time"

	"go.etcd.io/etcd/api/v3/v3rpc/rpctypes"
	clientv3 "go.etcd.io/etcd/client/v3"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/connectivity"

	"github.com/leaderrun/leaderrun/backends"
)

const (
	// withdrawTimeout bounds the clean-up of a candidacy that did not win
	// (cancelled, --try, or its lease ended): revoking its lease. If etcd
	// does not answer in time, the lease expires on its own after its TTL.
	withdrawTimeout = 2 * time.Second

	// defaultTTL is asked when a campaign names no lease duration.
	defaultTTL = 15 * time.Second
)

// Backend campaigns for one lock in one etcd cluster.
type Backend struct {
	cli         *clientv3.Client
	endpoints   string // for messages
	nEndpoints  int
	cfgPrefix   string // Config.Prefix
	lock        string
	pfx         string // the election's prefix, <prefix><lock>
	dialTimeout time.Duration
	log         *slog.Logger
	logBase     *slog.Logger // log, without the lock
	// root is the backend this one is a slot of (see Slot), nil for one
	// that New made: the client is root's.
	root *Backend
}

var _ backends.Backend = (*Backend)(nil)

// New returns a backend for cfg.Lock. It does not wait for a connection
// unless cfg.Username is set (authentication is a round trip, bounded by
// the dial timeout); a store that cannot be reached shows in the first
// Campaign or Status, as an error wrapping backends.ErrUnavailable.
func New(cfg Config) (*Backend, error) {
	if len(cfg.Endpoints) == 0 {
		return nil, errors.New("etcd: no endpoints")
	}
	if err := backends.ValidateLockName(cfg.Lock); err != nil {
		return nil, fmt.Errorf("etcd: %w", err)
	}
	if cfg.DialTimeout <= 0 {
		cfg.DialTimeout = DefaultDialTimeout
	}
	if cfg.Log == nil {
		cfg.Log = slog.New(slog.DiscardHandler)
	}
	b := &Backend{
		endpoints:   backends.Redact(strings.Join(cfg.Endpoints, ",")),
		nEndpoints:  len(cfg.Endpoints),
		cfgPrefix:   cfg.Prefix,
		lock:        cfg.Lock,
		pfx:         cfg.Prefix + cfg.Lock,
		dialTimeout: cfg.DialTimeout,
		logBase:     cfg.Log.With("backend", "etcd"),
	}
	b.log = b.logBase.With("lock", cfg.Lock)
	ccfg, err := clientConfig(cfg, b.log)
	if err != nil {
		return nil, err
	}
	cli, err := clientv3.New(ccfg)
	switch {
	case err == nil:
	case errors.Is(err, context.DeadlineExceeded):
		return nil, b.unavailable("authenticate as "+cfg.Username,
			fmt.Errorf("no answer within the dial timeout (%v)", cfg.DialTimeout))
	default:
		return nil, b.unavailable("connect", err)
	}
	b.cli = cli
	// The client connects on its first request; start now, so that the
	// handshake overlaps with what the caller does before campaigning.
	cli.ActiveConnection().Connect()
	return b, nil
}

// Name implements backends.Backend.
func (b *Backend) Name() string { return "etcd" }

// Slot implements backends.Backend: slot i is the election of the lock
// backends.SlotLock(lock, i), on b's client. Each candidacy has an etcd
// lease of its own whatever the slot; the connection is shared.
func (b *Backend) Slot(i int) backends.Backend {
	r := b
	if b.root != nil {
		r = b.root
	}
	if i == 0 {
		return r
	}
	lock := backends.SlotLock(r.lock, i)
	s := *r
	s.lock, s.pfx, s.root = lock, r.cfgPrefix+lock, r
	s.log = r.logBase.With("lock", lock)
	return &s
}

// Close implements backends.Backend: it closes the client, unless b is a
// slot backend, which has nothing of its own to close.
func (b *Backend) Close() error {
	if b.root != nil {
		return nil
	}
	if err := b.cli.Close(); err != nil && !errors.Is(err, context.Canceled) {
		return err
	}
	return nil
}

// prefix is what every candidate's key starts with.
func (b *Backend) prefix() string { return b.pfx + "/" }

// Status implements backends.Backend. It reads the candidates' keys in one
// snapshot, then asks for the time left on the leader's lease.
func (b *Backend) Status(ctx context.Context) (backends.Status, error) {
	st := backends.Status{Lock: b.lock, Backend: b.Name(), Key: b.prefix(), Remaining: -1, Waiting: -1}
	var resp *clientv3.TxnResponse
	err := b.reach(ctx, "read "+b.prefix(), func(ctx context.Context) (err error) {
		resp, err = b.cli.Txn(ctx).Then(
			clientv3.OpGet(b.prefix(), clientv3.WithFirstCreate()...),
			clientv3.OpGet(b.prefix(), clientv3.WithPrefix(), clientv3.WithCountOnly()),
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
	st.Held = true
	st.Key = string(kv.Key)
	v := parseValue(kv.Value)
	st.Identity, st.Holders = v.identity, v.holders
	st.Token = uint64(kv.CreateRevision)
	st.Waiting = int(rangeAt(resp, 1).Count) - 1
	if kv.Lease == 0 {
		return st, nil
	}
	// The lease is the leader's business; if it cannot be read, the rest
	// of the answer still stands and the time left stays unknown.
	var ttl *clientv3.LeaseTimeToLiveResponse
	if b.reach(ctx, "read lease", func(ctx context.Context) (err error) {
		ttl, err = b.cli.TimeToLive(ctx, clientv3.LeaseID(kv.Lease))
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
// The error wraps backends.ErrUnavailable, or is ctx's own if ctx ended.
func (b *Backend) reach(ctx context.Context, op string, f func(context.Context) error) error {
	limit := b.dialTimeout
	if b.cli.ActiveConnection().GetState() == connectivity.Ready {
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
		// The caller's own deadline (status --timeout, --wait): still
		// the caller's error, but one that names the store.
		return fmt.Errorf("etcd %s: %s: no answer before the deadline%s: %w: %w",
			b.endpoints, op, last.detail(), backends.ErrUnavailable, ctx.Err())
	case ctx.Err() != nil:
		return ctx.Err()
	case rctx.Err() != nil:
		// Not wrapped: a deadline error would read as the caller's own.
		err = fmt.Errorf("no answer within %v%s", limit, last.detail())
	}
	return b.unavailable(op, err)
}

func (b *Backend) unavailable(op string, err error) error {
	return fmt.Errorf("etcd %s: %s: %w: %w", b.endpoints, op, backends.ErrUnavailable, err)
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

// refusal is the error for a request that etcd refused: final, naming what
// was asked on which key, and wrapping backends.ErrUnavailable.
func (b *Backend) refusal(op, key string, err error) error {
	return fmt.Errorf("etcd %s: %s %s refused (%v): the user needs readwrite permission on the prefix %s: %w",
		b.endpoints, op, key, err, b.pfx, backends.ErrUnavailable)
}

// Keys of the lock's completion markers and history. Lock names cannot
// hold ':' (backends.ValidateLockName), so these never fall under another
// lock's election prefix, <prefix><lock>/.
func (b *Backend) markerKey(key string) string { return b.pfx + ":done/" + key }
func (b *Backend) historyPrefix() string       { return b.pfx + ":history/" }
func (b *Backend) historyKey(token uint64) string {
	return fmt.Sprintf("%s%020d", b.historyPrefix(), token)
}

// History implements backends.Backend: the terms are keys under
// <prefix><lock>:history/, named by their token, read newest first in
// pages of historyPage, so that every answer stays well within the
// receive limit (see recvLimit).
func (b *Backend) History(ctx context.Context, limit int) ([]backends.Term, error) {
	if limit <= 0 || limit > backends.HistoryLimit {
		limit = backends.HistoryLimit
	}
	pfx := b.historyPrefix()
	end := clientv3.GetPrefixRangeEnd(pfx)
	terms := make([]backends.Term, 0, limit)
	for n := 0; n < limit; {
		var resp *clientv3.GetResponse
		err := b.reach(ctx, "read "+pfx, func(ctx context.Context) (err error) {
			resp, err = b.cli.Get(ctx, pfx, clientv3.WithRange(end), clientv3.WithLimit(int64(min(historyPage, limit-n))),
				clientv3.WithSort(clientv3.SortByKey, clientv3.SortDescend))
			return err
		})
		if err != nil {
			return nil, err
		}
		for _, kv := range resp.Kvs {
			var t backends.Term
			if err := json.Unmarshal(kv.Value, &t); err == nil {
				terms = append(terms, t)
			}
		}
		n += len(resp.Kvs)
		if !resp.More || len(resp.Kvs) == 0 {
			break
		}
		// The next page: the keys before the oldest one read.
		end = string(resp.Kvs[len(resp.Kvs)-1].Key)
	}
	return backends.NewestFirst(terms, limit), nil
}

// record appends a term to the history, and trims it to the newest
// HistoryLimit terms once it has grown by a tenth beyond that.
func (b *Backend) record(ctx context.Context, t backends.Term) error {
	data, err := encodeTerm(t)
	if err != nil {
		return err
	}
	pfx := b.historyPrefix()
	resp, err := b.cli.Txn(ctx).Then(
		clientv3.OpPut(b.historyKey(t.Token), string(data)),
		clientv3.OpGet(pfx, clientv3.WithPrefix(), clientv3.WithCountOnly()),
	).Commit()
	if err != nil {
		return fmt.Errorf("etcd %s: record term %d in %s: %w", b.endpoints, t.Token, pfx, err)
	}
	n := rangeAt(resp, 1).Count
	if n <= backends.HistoryLimit+backends.HistoryLimit/10 {
		return nil
	}
	// The oldest n - HistoryLimit keys sort first; delete them as a range.
	old, err := b.cli.Get(ctx, pfx, clientv3.WithPrefix(), clientv3.WithKeysOnly(),
		clientv3.WithSort(clientv3.SortByKey, clientv3.SortAscend), clientv3.WithLimit(n-backends.HistoryLimit))
	if err != nil || len(old.Kvs) == 0 {
		return err
	}
	last := string(old.Kvs[len(old.Kvs)-1].Key)
	_, err = b.cli.Delete(ctx, pfx, clientv3.WithRange(last+"\x00"))
	return err
}

// encodeTerm is t as JSON, at most maxTermBytes long: a longer reason is
// cut (it is an error message, and the only field without a bound of its
// own), so that a page of the history always fits in one answer.
func encodeTerm(t backends.Term) ([]byte, error) {
	data, err := json.Marshal(t)
	for err == nil && len(data) > maxTermBytes && t.Reason != "" {
		if len(t.Reason) > 64 {
			t.Reason = cut(t.Reason, len(t.Reason)/2) + "…"
		} else {
			t.Reason = ""
		}
		data, err = json.Marshal(t)
	}
	return data, err
}

// cut returns the longest prefix of s of at most n bytes that ends on a
// character boundary.
func cut(s string, n int) string {
	for n > 0 && n < len(s) && s[n]&0xC0 == 0x80 {
		n--
	}
	return s[:n]
}
