// Package etcd is the etcd backend. Candidates campaign with the client's
// concurrency package: one Session (a lease that the client keeps alive) per
// candidacy, and an Election on <prefix><lock>, whose candidates are the keys
// <prefix><lock>/<lease ID in hex> with the identity as value. The candidate
// whose key has the lowest create revision leads; the others wait for the
// deletion of the keys created before theirs. The lock is therefore the one
// `etcdctl elect <prefix><lock>` observes.
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
	"errors"
	"fmt"
	"log/slog"
	"math"
	"strings"
	"time"

	"go.etcd.io/etcd/api/v3/v3rpc/rpctypes"
	"go.etcd.io/etcd/client/pkg/v3/transport"
	clientv3 "go.etcd.io/etcd/client/v3"
	"go.uber.org/zap"
	"google.golang.org/grpc/codes"

	"github.com/leaderrun/leaderrun/backends"
)

// Defaults of Config.
const (
	DefaultDialTimeout = 5 * time.Second
	DefaultTTL         = 15 * time.Second
)

const (
	// keepaliveTime is how long a gRPC connection may be silent before the
	// client pings etcd to find out whether it is still there; gRPC raises
	// anything shorter to 10 s. A black-holed connection is then dropped and
	// the client dials again, possibly another endpoint.
	keepaliveTime = 10 * time.Second

	// withdrawTimeout bounds the clean-up of a candidacy that did not win
	// (cancelled, --try, or its session ended): revoking its lease. If etcd
	// does not answer in time, the lease expires on its own after its TTL.
	withdrawTimeout = 2 * time.Second

	// maxBackoff caps the pause between two attempts of a waiting candidate
	// to campaign again after its candidacy ended.
	maxBackoff = 2 * time.Second
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

	// TTL is the lease lifetime asked of etcd. etcd grants whole seconds,
	// so it is rounded up, and raises what is below its minimum (1.5 ×
	// its election timeout, 2 s by default); Lease.TTL reports what was
	// granted. Zero: 15 s.
	TTL time.Duration

	// Log receives a line when a waiting candidate has to campaign again.
	// Nil: nothing is logged.
	Log *slog.Logger
}

// Backend campaigns for one lock in one etcd cluster.
type Backend struct {
	cli         *clientv3.Client
	endpoints   string // for messages
	lock        string
	pfx         string // the election's prefix, <prefix><lock>
	ttl         int64  // seconds asked
	dialTimeout time.Duration
	log         *slog.Logger
}

var _ backends.Backend = (*Backend)(nil)

// New returns a backend for cfg.Lock. It does not wait for a connection
// unless cfg.Username is set (authentication is a round trip); a store that
// cannot be reached shows in the first Campaign or Status, as an error
// wrapping backends.ErrUnavailable.
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
	if cfg.TTL <= 0 {
		cfg.TTL = DefaultTTL
	}
	if cfg.Log == nil {
		cfg.Log = slog.New(slog.DiscardHandler)
	}
	b := &Backend{
		endpoints:   strings.Join(cfg.Endpoints, ","),
		lock:        cfg.Lock,
		pfx:         cfg.Prefix + cfg.Lock,
		ttl:         int64(math.Ceil(cfg.TTL.Seconds())),
		dialTimeout: cfg.DialTimeout,
		log:         cfg.Log.With("backend", "etcd", "lock", cfg.Lock),
	}
	cli, err := clientv3.New(clientv3.Config{
		Endpoints:            cfg.Endpoints,
		TLS:                  cfg.TLS,
		Username:             cfg.Username,
		Password:             cfg.Password,
		DialTimeout:          cfg.DialTimeout,
		DialKeepAliveTime:    keepaliveTime,
		DialKeepAliveTimeout: cfg.DialTimeout,
		// The client logs every retry; leaderrun logs once, where an
		// error is handled.
		Logger: zap.NewNop(),
	})
	if err != nil {
		return nil, b.unavailable("connect", err)
	}
	b.cli = cli
	// The client connects on its first request; start now, so that the
	// handshake overlaps with what the caller does before campaigning.
	cli.ActiveConnection().Connect()
	return b, nil
}

// LoadTLS builds the client's TLS configuration from PEM files, as etcdctl
// does with --cacert, --cert and --key. Any may be empty; cert and key go
// together.
func LoadTLS(caFile, certFile, keyFile string) (*tls.Config, error) {
	if (certFile == "") != (keyFile == "") {
		return nil, errors.New("a client certificate needs both a certificate and a key file")
	}
	info := transport.TLSInfo{TrustedCAFile: caFile, CertFile: certFile, KeyFile: keyFile}
	return info.ClientConfig()
}

// Name implements backends.Backend.
func (b *Backend) Name() string { return "etcd" }

// Close implements backends.Backend.
func (b *Backend) Close() error { return b.cli.Close() }

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
	leader := resp.Responses[0].GetResponseRange().Kvs
	st.Waiting = 0
	if len(leader) == 0 {
		return st, nil
	}
	kv := leader[0]
	st.Held = true
	st.Key = string(kv.Key)
	st.Identity = string(kv.Value)
	st.Token = uint64(kv.CreateRevision)
	st.Waiting = int(resp.Responses[1].GetResponseRange().Count) - 1
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
	var ee rpctypes.EtcdError
	if !errors.As(err, &ee) {
		return false
	}
	return ee.Code() == codes.PermissionDenied ||
		errors.Is(err, rpctypes.ErrAuthFailed) || errors.Is(err, rpctypes.ErrUserEmpty)
}
