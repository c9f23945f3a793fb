// Package etcd is the etcd backend. Candidates campaign as etcd's
// concurrency package does (etcdctl elect and etcdctl lock use it): one
// lease per candidacy, kept alive while it lasts, and an election on
// <prefix><lock>, whose candidates are the keys <prefix><lock>/<lease ID in
// hex> with the identity as value. The candidate whose key has the lowest
// create revision leads; each of the others waits for the deletion of the
// key created just before its own, so that a change wakes one waiter. The
// lock is therefore the one `etcdctl elect <prefix><lock>` observes.
//
// It speaks to etcd through etcd's JSON gateway (client.go), not the gRPC
// client.
//
// The fencing token is the create revision of the leader's key. etcd's
// revision grows with every write to the store, and a candidate leads only
// once every key created before its own is gone, so each new leader's token is
// greater than that of every leader before it.
//
// Leadership is lost when the lease ends (revoked, or expired because nobody
// renewed it within its TTL) or when the key is deleted. A watch on the
// leader's own key reports both within a round trip (S3): etcd deletes a
// lease's keys when the lease ends.
package etcd

import (
	"context"
	"crypto/tls"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"strings"
	"time"

	"github.com/leaderrun/leaderrun/backends"
)

// DefaultDialTimeout is Config.DialTimeout's default.
const DefaultDialTimeout = 5 * time.Second

const (
	// keepaliveTime is the TCP keep-alive period of the connections to
	// etcd, and how long an idle one is kept (nine periods).
	keepaliveTime = 10 * time.Second

	// withdrawTimeout bounds the clean-up of a candidacy that did not win
	// (cancelled, --try, or its session ended): revoking its lease. If etcd
	// does not answer in time, the lease expires on its own after its TTL.
	withdrawTimeout = 2 * time.Second

	// defaultTTL is asked when a campaign names no lease duration.
	defaultTTL = 15 * time.Second
)

// Config describes one lock in one etcd cluster. The zero value of each
// field is noted.
type Config struct {
	// Endpoints are the client URLs of the cluster's members
	// (http://host:port, https://host:port or host:port). Required.
	Endpoints []string

	// TLS secures the connection; see LoadTLS. Nil: plain TCP.
	TLS *tls.Config

	// Username and Password authenticate against etcd's auth. Empty: none.
	Username, Password string

	// DialTimeout bounds every request made before leadership whose failure
	// means that etcd cannot be reached: without it, the client would wait
	// for a connection for as long as the campaign may wait. Zero: 5 s.
	DialTimeout time.Duration

	// Prefix and Lock name the election: <Prefix><Lock>. Lock is required;
	// see backends.ValidateLockName.
	Prefix, Lock string

	// Log receives a line when a waiting candidate has to campaign again.
	// Nil: nothing is logged.
	Log *slog.Logger
}

// Backend campaigns for one lock in one etcd cluster.
type Backend struct {
	cli         *client
	endpoints   string // for messages
	lock        string
	pfx         string // the election's prefix, <prefix><lock>
	dialTimeout time.Duration
	log         *slog.Logger
}

var _ backends.Backend = (*Backend)(nil)

// New returns a backend for cfg.Lock. It contacts no member (with a user
// name, it authenticates before its first request); a store that cannot be
// reached shows in the first Campaign or Status, as an error wrapping
// backends.ErrUnavailable.
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
		lock:        cfg.Lock,
		pfx:         cfg.Prefix + cfg.Lock,
		dialTimeout: cfg.DialTimeout,
		log:         cfg.Log.With("backend", "etcd", "lock", cfg.Lock),
	}
	cli, err := newClient(cfg.Endpoints, cfg.TLS, cfg.Username, cfg.Password, cfg.DialTimeout)
	if err != nil {
		return nil, err
	}
	b.cli = cli
	return b, nil
}

// Name implements backends.Backend.
func (b *Backend) Name() string { return "etcd" }

// Close implements backends.Backend.
func (b *Backend) Close() error {
	b.cli.close()
	return nil
}

// prefix is what every candidate's key starts with.
func (b *Backend) prefix() string { return b.pfx + "/" }

// Status implements backends.Backend. It reads the candidates' keys in one
// snapshot, then asks for the time left on the leader's lease.
func (b *Backend) Status(ctx context.Context) (backends.Status, error) {
	st := backends.Status{Lock: b.lock, Backend: b.Name(), Key: b.prefix(), Remaining: -1, Waiting: -1}
	var resp *txnResponse
	err := b.reach(ctx, "read "+b.prefix(), func(ctx context.Context) (err error) {
		resp, err = b.cli.txn(ctx, txnRequest{Success: []requestOp{{Range: firstCreated(b.prefix())}, {Range: countUnder(b.prefix())}}})
		return err
	})
	if err != nil {
		return st, err
	}
	leader := resp.rangeAt(0).Kvs
	st.Waiting = 0
	if len(leader) == 0 {
		return st, nil
	}
	kv := leader[0]
	st.Held = true
	st.Key = string(kv.Key)
	st.Identity = string(kv.Value)
	st.Token = uint64(kv.CreateRevision)
	st.Waiting = int(resp.rangeAt(1).Count) - 1
	if kv.Lease == 0 {
		return st, nil
	}
	// The lease is the leader's business; if it cannot be read, the rest
	// of the answer still stands and the time left stays unknown.
	var ttl, granted int64
	if b.reach(ctx, "read lease", func(ctx context.Context) (err error) {
		ttl, granted, err = b.cli.timeToLive(ctx, kv.Lease)
		return err
	}) == nil && ttl >= 0 {
		st.TTL = time.Duration(granted) * time.Second
		st.Remaining = time.Duration(ttl) * time.Second
	}
	return st, nil
}

// reach runs one request whose failure means that etcd cannot be reached or
// refuses us, bounded by the dial timeout: the client waits for a connection
// as long as a request's context allows, so without a bound a campaign with
// no deadline would wait for ever on a store that is down. The error wraps
// backends.ErrUnavailable, or is ctx's own if ctx ended.
func (b *Backend) reach(ctx context.Context, op string, f func(context.Context) error) error {
	rctx, cancel := context.WithTimeout(ctx, b.dialTimeout)
	defer cancel()
	err := f(rctx)
	switch {
	case err == nil:
		return nil
	case errors.Is(ctx.Err(), context.DeadlineExceeded):
		// The caller's own deadline (status --timeout, --wait): still
		// the caller's error, but one that names the store.
		return fmt.Errorf("etcd %s: %s: no answer before the deadline: %w: %w", b.endpoints, op, backends.ErrUnavailable, ctx.Err())
	case ctx.Err() != nil:
		return ctx.Err()
	case rctx.Err() != nil:
		// Not wrapped: a deadline error would read as the caller's own.
		err = fmt.Errorf("no answer within the dial timeout (%v)", b.dialTimeout)
	}
	return b.unavailable(op, err)
}

func (b *Backend) unavailable(op string, err error) error {
	return fmt.Errorf("etcd %s: %s: %w: %w", b.endpoints, op, backends.ErrUnavailable, err)
}

// refused reports whether etcd turned a request down for a reason that
// trying again cannot fix: bad credentials or missing permissions.
func refused(err error) bool {
	return isAPIError(err, codePermissionDenied, "") ||
		isAPIError(err, 0, msgAuthFailed) || isAPIError(err, 0, msgUserEmpty)
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
// <prefix><lock>:history/, named by their token, newest read first.
func (b *Backend) History(ctx context.Context, limit int) ([]backends.Term, error) {
	if limit <= 0 || limit > backends.HistoryLimit {
		limit = backends.HistoryLimit
	}
	var resp *rangeResponse
	err := b.reach(ctx, "read "+b.historyPrefix(), func(ctx context.Context) (err error) {
		resp, err = b.cli.rangeKeys(ctx, &rangeRequest{Key: []byte(b.historyPrefix()), RangeEnd: prefixEnd(b.historyPrefix()),
			SortOrder: sortDescend, SortTarget: sortByKey, Limit: int64(limit)})
		return err
	})
	if err != nil {
		return nil, err
	}
	terms := make([]backends.Term, 0, len(resp.Kvs))
	for _, kv := range resp.Kvs {
		var t backends.Term
		if err := json.Unmarshal(kv.Value, &t); err == nil {
			terms = append(terms, t)
		}
	}
	return backends.NewestFirst(terms, limit), nil
}

// record appends a term to the history, and trims it to the newest
// HistoryLimit terms once it has grown by a tenth beyond that.
func (b *Backend) record(ctx context.Context, t backends.Term) error {
	data, err := json.Marshal(t)
	if err != nil {
		return err
	}
	resp, err := b.cli.txn(ctx, txnRequest{Success: []requestOp{
		{Put: &putRequest{Key: []byte(b.historyKey(t.Token)), Value: data}},
		{Range: countUnder(b.historyPrefix())},
	}})
	if err != nil {
		return fmt.Errorf("etcd %s: record term %d in %s: %w", b.endpoints, t.Token, b.historyPrefix(), err)
	}
	n := resp.rangeAt(1).Count
	if n <= backends.HistoryLimit+backends.HistoryLimit/10 {
		return nil
	}
	// The oldest n - HistoryLimit keys sort first; delete them as a range.
	old, err := b.cli.rangeKeys(ctx, &rangeRequest{Key: []byte(b.historyPrefix()), RangeEnd: prefixEnd(b.historyPrefix()),
		KeysOnly: true, SortOrder: sortAscend, SortTarget: sortByKey, Limit: n - backends.HistoryLimit})
	if err != nil || len(old.Kvs) == 0 {
		return err
	}
	last := string(old.Kvs[len(old.Kvs)-1].Key)
	return b.cli.deleteRange(ctx, deleteRequest{Key: []byte(b.historyPrefix()), RangeEnd: []byte(last + "\x00")})
}
