package etcd

import (
	"context"
	"crypto/tls"
	"errors"
	"fmt"
	"log/slog"
	"strings"
	"sync/atomic"
	"time"

	"go.etcd.io/etcd/api/v3/v3rpc/rpctypes"
	"go.etcd.io/etcd/client/pkg/v3/transport"
	clientv3 "go.etcd.io/etcd/client/v3"
	"google.golang.org/grpc"

	"github.com/leaderrun/leaderrun/backends"
)

// Config describes one etcd cluster.
type Config struct {
	// Endpoints are the client URLs of the cluster's members, as etcdctl
	// takes them: http://host:port, https://host:port, host:port (TLS if
	// TLS is set), unix://path or unixs://path (TLS). They must agree on
	// TLS (see CheckEndpoints). Required.
	Endpoints []string
	// TLS secures the connection; see LoadTLS. Nil: plain TCP, except
	// for https:// and unixs:// endpoints, which get TLS with the
	// system's roots.
	TLS *tls.Config
	// Username and Password authenticate against etcd's auth. Empty: none.
	Username, Password string
	// DialTimeout bounds authentication, and every request made before
	// leadership while no connection is ready. Zero: DefaultDialTimeout.
	DialTimeout time.Duration
	// Prefix begins the key of every lock: the election of lock L is
	// <Prefix>L.
	Prefix string
	// Log receives the etcd client's own warnings and errors. Nil:
	// nothing is logged.
	Log *slog.Logger
}

// etcdctl's --dial-timeout, Config.DialTimeout's default; its
// --command-timeout, bounding a request before leadership once a
// connection is ready; and its --keepalive-time and --keepalive-timeout,
// so that a black-holed member is left for another (gRPC raises a time
// below 10 s to 10 s).
const (
	DefaultDialTimeout = 2 * time.Second
	requestTimeout     = 5 * time.Second
	keepAliveTime      = 2 * time.Second
	keepAliveTimeout   = 6 * time.Second
)

// recvLimit bounds every answer: above the largest leaderrun reads (two
// keys, a count, watch events, the 64 KiB history), and low enough that
// one decodes into 11 MiB at worst (docs/backends/etcd.md, "Bounded
// against a hostile server"). maxHeaderList bounds an answer's headers
// and trailers (etcd's are a few hundred bytes; gRPC's default is 16 MiB).
const (
	recvLimit     = 128 << 10
	maxHeaderList = 64 << 10
)

// clientConfig is the etcd client's configuration for cfg, as etcdctl
// builds it, with the receive limits above. Credentials go only to the
// endpoints given: gRPC follows no redirects, and the client does not
// sync its endpoints from the member list (AutoSyncInterval 0).
func clientConfig(cfg Config, log *slog.Logger) (clientv3.Config, error) {
	if err := CheckEndpoints(cfg.Endpoints, cfg.TLS != nil); err != nil {
		return clientv3.Config{}, fmt.Errorf("etcd: %w", err)
	}
	// A user name and password in an endpoint URL are never sent (gRPC
	// ignores them); dropped here, the client cannot print them either.
	endpoints := make([]string, len(cfg.Endpoints))
	for i, ep := range cfg.Endpoints {
		endpoints[i] = backends.Redact(ep)
	}
	return clientv3.Config{
		Endpoints:            endpoints,
		TLS:                  cfg.TLS,
		Username:             cfg.Username,
		Password:             cfg.Password,
		DialTimeout:          cfg.DialTimeout,
		DialKeepAliveTime:    keepAliveTime,
		DialKeepAliveTimeout: keepAliveTimeout,
		MaxCallRecvMsgSize:   recvLimit,
		Logger:               zapLogger(log),
		DialOptions: []grpc.DialOption{
			grpc.WithMaxHeaderListSize(maxHeaderList),
			// Fixed flow-control windows: gRPC's default grows a
			// stream's window up to 16 MiB on a fast link, which a
			// server could fill before the size check of a message
			// fails it.
			grpc.WithInitialWindowSize(recvLimit),
			grpc.WithInitialConnWindowSize(recvLimit),
			grpc.WithChainUnaryInterceptor(recordLastError),
		},
	}, nil
}

// CheckEndpoints checks that endpoints agree on TLS (tlsOn: TLS files
// were given). etcd's client speaks to every endpoint as the first one's
// scheme asks for, so a list that mixes them would speak to some members
// in a way they did not ask for: an unixs:// endpoint after an http://
// one in clear text.
func CheckEndpoints(endpoints []string, tlsOn bool) error {
	secure := func(ep string) bool {
		switch scheme, _, ok := strings.Cut(ep, "://"); {
		case !ok:
			return strings.HasPrefix(ep, "unixs:") || tlsOn
		case scheme == "https", scheme == "unixs":
			return true
		case scheme == "http":
			return false
		}
		return tlsOn
	}
	for _, ep := range endpoints[1:] {
		if secure(ep) != secure(endpoints[0]) {
			return fmt.Errorf("endpoints %s and %s: one with TLS and one without; etcd's client speaks to all endpoints as to the first, so they must agree (https:// or unixs://, or http://)",
				backends.Redact(endpoints[0]), backends.Redact(ep))
		}
	}
	return nil
}

// LoadTLS builds the client's TLS configuration from PEM files, as etcdctl
// does with --cacert, --cert and --key (etcd's transport.TLSInfo). Any may
// be empty; cert and key go together.
func LoadTLS(caFile, certFile, keyFile string) (*tls.Config, error) {
	if (certFile == "") != (keyFile == "") {
		return nil, errors.New("a client certificate needs both a certificate and a key file")
	}
	info := transport.TLSInfo{TrustedCAFile: caFile, CertFile: certFile, KeyFile: keyFile}
	return info.ClientConfig()
}

// lastError keeps the last error of a request's attempts, as gRPC gave it:
// the client turns a deadline into the bare context error, which would
// hide why no connection was ready (refused, a TLS failure, no answer).
type lastError struct{ atomic.Pointer[error] }

type lastErrorKey struct{}

// recordLastError is a gRPC interceptor around every attempt of a request.
func recordLastError(ctx context.Context, method string, req, reply any, cc *grpc.ClientConn, invoker grpc.UnaryInvoker, opts ...grpc.CallOption) error {
	err := invoker(ctx, method, req, reply, cc, opts...)
	if l, ok := ctx.Value(lastErrorKey{}).(*lastError); ok && err != nil {
		l.Store(&err)
	}
	return err
}

// detail is the last error for a message, or "" if it says no more than
// that time ran out.
func (l *lastError) detail() string {
	err := l.Load()
	if err == nil {
		return ""
	}
	desc := rpctypes.ErrorDesc(*err)
	if desc == context.DeadlineExceeded.Error() || desc == context.Canceled.Error() {
		return ""
	}
	return " (" + desc + ")"
}
