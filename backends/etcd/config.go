package etcd

import (
	"context"
	"crypto/tls"
	"errors"
	"fmt"
	"log/slog"
	"strings"
	"sync"
	"time"

	"go.etcd.io/etcd/api/v3/v3rpc/rpctypes"
	"go.etcd.io/etcd/client/pkg/v3/transport"
	clientv3 "go.etcd.io/etcd/client/v3"
	"google.golang.org/grpc"

	"github.com/leaderrun/leaderrun/backends"
)

// DefaultDialTimeout is Config.DialTimeout's default: etcdctl's
// --dial-timeout.
const DefaultDialTimeout = 2 * time.Second

const (
	// requestTimeout bounds a request made before leadership once a
	// connection is ready: etcdctl's --command-timeout.
	requestTimeout = 5 * time.Second

	// keepAliveTime and keepAliveTimeout are etcdctl's --keepalive-time
	// and --keepalive-timeout: a connection silent for keepAliveTime is
	// pinged, and dropped if the ping is not answered within
	// keepAliveTimeout, so that a black-holed member is left for another.
	// gRPC raises a time below 10 s to 10 s.
	keepAliveTime    = 2 * time.Second
	keepAliveTimeout = 6 * time.Second
)

// What leaderrun reads from etcd is small: at most two candidates' keys
// (their values are identities, at most 256 bytes), a count, watch events
// on one key, and a lock's two documents (at most 64 KiB of history, 16 KiB
// of markers: backends/journal.go). recvLimit bounds every answer above
// that, and well below what
// could hurt: the smallest protobuf elements decode into many times their
// size (an empty KeyValue is 2 bytes on the wire and about 170 bytes in
// memory, measured by TestReceiveLimitBoundsMemory), so an answer of
// recvLimit bytes decodes into about 11 MiB at worst. With the runtime's
// own (about 16 MiB) and the collector's slack (a heap may grow to twice
// what is live), leaderrun stays well under 64 MiB whatever a server
// sends (e2e TestEtcdHostileStore; 256 KiB came to 60 MiB). A larger
// answer fails its request with "received message larger than max".
const (
	recvLimit = 128 << 10

	// maxHeaderList bounds the headers and trailers of one answer
	// (etcd's are a few hundred bytes; gRPC's default is 16 MiB).
	maxHeaderList = 64 << 10
)

// Config describes one etcd cluster. The zero value of each field is
// noted.
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
	// leadership while no connection is ready: without it, the client
	// would wait for a connection for as long as the campaign may wait.
	// Zero: DefaultDialTimeout.
	DialTimeout time.Duration

	// Prefix begins the key of every lock: the election of lock L is
	// <Prefix>L.
	Prefix string

	// Log receives the etcd client's own warnings and errors. Nil:
	// nothing is logged.
	Log *slog.Logger
}

// clientConfig is the etcd client's configuration for cfg, as etcdctl
// builds it, with the receive limits above.
//
// Credentials (the password, the auth token, the client certificate) go
// only to the endpoints given: gRPC follows no redirects, and the client
// does not sync its endpoints from the member list (AutoSyncInterval 0).
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

// CheckEndpoints checks that endpoints agree on TLS, with tlsOn telling
// whether TLS files were given. etcd's client speaks to every endpoint as
// its scheme asks for the first one (https:// and unixs:// with TLS,
// http:// without, host:port and unix:// with TLS if tlsOn), so a list
// that mixes them would send to some members in a way they did not ask
// for: an unixs:// endpoint after an http:// one in clear text.
func CheckEndpoints(endpoints []string, tlsOn bool) error {
	secure := func(ep string) bool {
		scheme, _, ok := strings.Cut(ep, "://")
		switch {
		case !ok && strings.HasPrefix(ep, "unixs:"):
			return true
		case !ok:
			return tlsOn
		}
		switch scheme {
		case "https", "unixs":
			return true
		case "http":
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
type lastError struct {
	mu  sync.Mutex
	err error
}

type lastErrorKey struct{}

func withLastError(ctx context.Context, l *lastError) context.Context {
	return context.WithValue(ctx, lastErrorKey{}, l)
}

// recordLastError is a gRPC interceptor around every attempt of a request.
func recordLastError(ctx context.Context, method string, req, reply any, cc *grpc.ClientConn, invoker grpc.UnaryInvoker, opts ...grpc.CallOption) error {
	err := invoker(ctx, method, req, reply, cc, opts...)
	if l, ok := ctx.Value(lastErrorKey{}).(*lastError); ok && err != nil {
		l.mu.Lock()
		l.err = err
		l.mu.Unlock()
	}
	return err
}

// detail is the last error for a message, or "" if it says no more than
// that time ran out.
func (l *lastError) detail() string {
	l.mu.Lock()
	defer l.mu.Unlock()
	if l.err == nil {
		return ""
	}
	desc := rpctypes.ErrorDesc(l.err)
	if desc == context.DeadlineExceeded.Error() || desc == context.Canceled.Error() {
		return ""
	}
	return " (" + desc + ")"
}
