package redis

import (
	"context"
	"crypto/tls"
	"crypto/x509"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"net/url"
	"os"
	"strconv"
	"strings"
	"sync/atomic"
	"time"

	"github.com/redis/go-redis/v9"
	"github.com/redis/go-redis/v9/maintnotifications"

	"github.com/leaderrun/leaderrun/backends"
)

// TLSFiles are the files of a TLS configuration, as redis-cli's --cacert,
// --cert and --key take them. Each may be empty.
type TLSFiles struct {
	CA, Cert, Key string
}

// Check reads the files as the backend will, for a configuration error
// before anything is contacted.
func (f TLSFiles) Check() error {
	_, err := f.load()
	return err
}

// load reads the files into a client configuration.
func (f TLSFiles) load() (*tls.Config, error) {
	cfg := &tls.Config{MinVersion: tls.VersionTLS12}
	if f.CA != "" {
		pem, err := os.ReadFile(f.CA)
		if err != nil {
			return nil, fmt.Errorf("CA bundle: %w", err)
		}
		cfg.RootCAs = x509.NewCertPool()
		if !cfg.RootCAs.AppendCertsFromPEM(pem) {
			return nil, fmt.Errorf("CA bundle %s: no PEM certificate in it", f.CA)
		}
	}
	if (f.Cert == "") != (f.Key == "") {
		return nil, errors.New("a client certificate needs both the certificate and its key")
	}
	if f.Cert != "" {
		pair, err := tls.LoadX509KeyPair(f.Cert, f.Key)
		if err != nil {
			// Its messages name files, never what a key holds.
			return nil, fmt.Errorf("client certificate: %w", err)
		}
		cfg.Certificates = []tls.Certificate{pair}
	}
	return cfg, nil
}

// clients are the go-redis clients of one configuration.
type clients struct {
	main *redis.Client
	// tracker builds a client for a lease's tracking connection (see
	// track.go): the same server, one connection, onConnect run on it.
	tracker func(onConnect func(context.Context, *redis.Conn) error) *redis.Client
	addr    string   // for messages
	secrets []string // to redact
}

// newClient builds the go-redis clients of cfg, and returns the address
// for messages and the secrets to redact from them.
func newClient(cfg Config) (clients, error) {
	base, err := parseURL(cfg)
	if err != nil {
		return clients{}, err
	}
	if base.Password == "" {
		base.Password = cfg.Password
	}
	secrets := []string{base.Password, cfg.SentinelPassword}
	var tlsCfg *tls.Config
	if base.TLSConfig != nil || cfg.TLS != nil {
		if base.TLSConfig == nil {
			return clients{}, errors.New("redis: TLS files given for a redis:// or unix:// URL: use rediss://")
		}
		files := TLSFiles{}
		if cfg.TLS != nil {
			files = *cfg.TLS
		}
		if tlsCfg, err = files.load(); err != nil {
			return clients{}, fmt.Errorf("redis: %w", err)
		}
		tlsCfg.InsecureSkipVerify = base.TLSConfig.InsecureSkipVerify // skip_verify=true in the URL
	}
	dial := guardedDialer(base.DialTimeout, tlsCfg)
	if cfg.SentinelMaster == "" && len(cfg.Sentinels) == 0 {
		tune(base, dial)
		tmpl := *base // NewClient changes what it is given
		c := clients{main: redis.NewClient(base), addr: endpoint(base.Network, base.Addr), secrets: secrets}
		c.tracker = func(onConnect func(context.Context, *redis.Conn) error) *redis.Client {
			o := tmpl
			o.PoolSize, o.MaxIdleConns, o.OnConnect = 1, 1, onConnect
			return redis.NewClient(&o)
		}
		return c, nil
	}
	if cfg.SentinelMaster == "" || len(cfg.Sentinels) == 0 {
		return clients{}, errors.New("redis: Sentinel needs both the master name and the Sentinels' addresses")
	}
	for _, s := range cfg.Sentinels {
		if _, port, err := net.SplitHostPort(s); err != nil || port == "" {
			return clients{}, fmt.Errorf("redis: Sentinel %q: want HOST:PORT", backends.Redact(s))
		}
	}
	fo := &redis.FailoverOptions{
		MasterName: cfg.SentinelMaster, SentinelAddrs: cfg.Sentinels, SentinelPassword: cfg.SentinelPassword,
		Username: base.Username, Password: base.Password, DB: base.DB,
		DialTimeout: base.DialTimeout, ReadTimeout: base.ReadTimeout, WriteTimeout: base.WriteTimeout,
		TLSConfig: tlsCfg,
	}
	opt := &redis.Options{}
	tune(opt, dial)
	fo.Protocol, fo.PoolSize, fo.MaxIdleConns, fo.PipelinePoolSize = opt.Protocol, opt.PoolSize, opt.MaxIdleConns, opt.PipelinePoolSize
	fo.ReadBufferSize, fo.WriteBufferSize, fo.DisableIdentity, fo.ClientName = opt.ReadBufferSize, opt.WriteBufferSize, true, opt.ClientName
	fo.ContextTimeoutEnabled, fo.Dialer = true, dial
	fo.DialerRetries, fo.MaxRetries = opt.DialerRetries, opt.MaxRetries
	tmpl := *fo
	c := clients{main: redis.NewFailoverClient(fo), secrets: secrets,
		addr: fmt.Sprintf("Sentinel master %q via %s", cfg.SentinelMaster, strings.Join(cfg.Sentinels, ","))}
	c.tracker = func(onConnect func(context.Context, *redis.Conn) error) *redis.Client {
		o := tmpl
		// Run on the Sentinels' connections too, where it fails, and
		// says nothing: the tracker's probe finds out what works.
		o.PoolSize, o.MaxIdleConns, o.OnConnect = 1, 1, onConnect
		return redis.NewFailoverClient(&o)
	}
	return c, nil
}

// parseURL parses cfg.URL with go-redis's ParseURL. With Sentinels the
// URL names no host (the Sentinels name the primary), and may be empty.
// The user information is split off first (backends.SplitUserinfo), so
// that a password holding "/" or "," reaches the server whole, and no
// parser ever sees it or quotes part of it in an error.
func parseURL(cfg Config) (*redis.Options, error) {
	sentinel := cfg.SentinelMaster != "" || len(cfg.Sentinels) > 0
	raw := cfg.URL
	if raw == "" {
		if !sentinel {
			return nil, errors.New("redis: no server URL")
		}
		raw = "redis://"
	}
	raw, user, password, hasPassword, _ := backends.SplitUserinfo(raw)
	u, err := url.Parse(raw)
	if err != nil {
		return nil, errors.New("redis: the URL does not parse (scheme://[user:password@]host:port[/db])")
	}
	if sentinel && u.Scheme != "redis" && u.Scheme != "rediss" {
		return nil, fmt.Errorf("redis: with Sentinel, the URL's scheme is redis:// or rediss://, not %s://", u.Scheme)
	}
	if sentinel && u.Host != "" {
		return nil, fmt.Errorf("redis: with Sentinel, the URL names no host, only the scheme, user, password and database (e.g. %s://user:password@/0): the Sentinels name the primary",
			u.Scheme)
	}
	opt, err := redis.ParseURL(raw)
	if err != nil {
		msg := strings.TrimPrefix(err.Error(), "redis: ")
		return nil, fmt.Errorf("redis: URL: %s (want redis://, rediss:// or unix://)", msg)
	}
	opt.Username = user
	if hasPassword {
		opt.Password = password
	}
	if opt.DialTimeout == 0 {
		opt.DialTimeout = DefaultDialTimeout
	}
	return opt, nil
}

// tune sets what the backend relies on, whatever the URL said.
func tune(opt *redis.Options, dial func(context.Context, string, string) (net.Conn, error)) {
	// RESP2: what the guard follows. Nothing here needs RESP3.
	opt.Protocol = 2
	// A renewal, a loss check and a release at once; a waiter's pub/sub
	// connection is apart. No pipeline pool: pipelines run on these.
	opt.PoolSize, opt.MaxIdleConns, opt.MinIdleConns, opt.PipelinePoolSize = 4, 4, 0, -1
	// Replies are small (see guard.go): small buffers, per connection.
	opt.ReadBufferSize, opt.WriteBufferSize = 4096, 4096
	// CLIENT SETINFO costs a round trip per connection; the name goes
	// with HELLO.
	opt.DisableIdentity, opt.ClientName = true, "leaderrun"
	// The context's deadline bounds every request. One dial per attempt
	// and one retry of a request (a pooled connection that broke while
	// idle fails the first request on it): the backend's own loops retry
	// while waiting, and a store that is down at the start must be an
	// error at once, not after go-redis's backoff.
	opt.ContextTimeoutEnabled = true
	opt.DialerRetries, opt.MaxRetries = 1, 1
	opt.MaintNotificationsConfig = &maintnotifications.Config{Mode: maintnotifications.ModeDisabled}
	opt.Dialer = dial
}

// guardedDialer dials TCP or a unix socket, does the TLS handshake if
// tlsCfg is set (checking the name of the address dialled), and puts the
// guard (guard.go) on the connection.
func guardedDialer(timeout time.Duration, tlsCfg *tls.Config) func(context.Context, string, string) (net.Conn, error) {
	return func(ctx context.Context, network, addr string) (net.Conn, error) {
		d := &net.Dialer{Timeout: timeout, KeepAlive: 15 * time.Second}
		conn, err := d.DialContext(ctx, network, addr)
		if err != nil {
			return nil, err
		}
		if tlsCfg != nil {
			cfg := tlsCfg.Clone()
			if cfg.ServerName == "" {
				if host, _, err := net.SplitHostPort(addr); err == nil {
					cfg.ServerName = host
				}
			}
			tc := tls.Client(conn, cfg)
			hctx, cancel := context.WithTimeout(ctx, timeout)
			err := tc.HandshakeContext(hctx)
			cancel()
			if err != nil {
				conn.Close()
				return nil, fmt.Errorf("TLS handshake with %s: %w", addr, err)
			}
			conn = tc
		}
		return guard(conn), nil
	}
}

// endpoint is the server's address for messages.
func endpoint(network, addr string) string {
	if network == "unix" {
		return "unix:" + addr
	}
	return addr
}

// certificateError reports whether err is a TLS certificate that is not
// trusted, or a TLS handshake with something that does not speak TLS.
func certificateError(err error) bool {
	var unknown x509.UnknownAuthorityError
	var host x509.HostnameError
	var invalid x509.CertificateInvalidError
	var verify *tls.CertificateVerificationError
	var header tls.RecordHeaderError
	return errors.As(err, &unknown) || errors.As(err, &host) || errors.As(err, &invalid) ||
		errors.As(err, &verify) || errors.As(err, &header)
}

// libraryLog is where go-redis's own lines go (it has one logger per
// process): the newest backend's log, at debug level, redacted.
var libraryLog atomic.Pointer[libLogger]

type libLogger struct {
	log    *slog.Logger
	redact func(string) string
}

func (l *libLogger) Printf(_ context.Context, format string, v ...any) {
	l.log.Debug(l.redact(fmt.Sprintf(format, v...)), "source", "go-redis")
}

type libShim struct{}

func (libShim) Printf(ctx context.Context, format string, v ...any) {
	if l := libraryLog.Load(); l != nil {
		l.Printf(ctx, format, v...)
	}
}

func setLibraryLog(log *slog.Logger, redact func(string) string) {
	if libraryLog.Swap(&libLogger{log: log, redact: redact}) == nil {
		redis.SetLogger(libShim{})
	}
}

// startChecks asks the server, once per backend and in the background
// (the first campaign does not wait for it), for what its users should
// know: replicas while no replica is waited for (a failover can lose a
// grant), fewer replicas than waited for (no child will start), and no
// append-only file (a restart can repeat tokens).
func (b *Backend) startChecks() {
	if b.root != nil {
		b = b.root // once per connection, not per slot
	}
	b.checks.Do(func() {
		b.checkWG.Add(1)
		go func() {
			defer b.checkWG.Done()
			ctx, cancel := context.WithTimeout(b.checkCtx, requestTimeout)
			defer cancel()
			var repl, pers *redis.StringCmd
			_, err := b.c.Pipelined(ctx, func(p redis.Pipeliner) error {
				repl, pers = p.Info(ctx, "replication"), p.Info(ctx, "persistence")
				return nil
			})
			if err != nil {
				b.log.Debug("redis: could not read INFO replication and persistence", "err", b.redact(err))
				return
			}
			b.checkReplicas(infoField(repl.Val(), "connected_slaves"))
			if aof := infoField(pers.Val(), "aof_enabled"); aof == "0" {
				b.log.Info("redis: the server keeps no append-only file (aof_enabled:0): a restart forgets grants and tokens since its last snapshot, "+
					"and tokens can repeat; run it with appendonly yes and appendfsync always (docs/backends/redis.md)", "server", b.addr)
			}
		}()
	})
}

func (b *Backend) checkReplicas(field string) {
	n, err := strconv.Atoi(field)
	if err != nil {
		return
	}
	switch {
	case n > 0 && b.minRepl == 0:
		b.log.Warn("redis: the server has replicas, and --redis-min-replicas is 0: replication is asynchronous, so a failover to a replica "+
			"can lose a grant and its token increment; two holders and a repeated token are then possible. "+
			"--redis-min-replicas narrows that window (docs/backends/redis.md)", "server", b.addr, "connected_replicas", n)
	case n < b.minRepl:
		b.log.Warn("redis: fewer replicas are connected than --redis-min-replicas: no grant will count until enough are",
			"server", b.addr, "connected_replicas", n, "min_replicas", b.minRepl)
	}
}

// infoField is the value of name in an INFO section's text, "" if none.
func infoField(info, name string) string {
	for _, line := range strings.Split(info, "\n") {
		if v, ok := strings.CutPrefix(strings.TrimSpace(line), name+":"); ok {
			return v
		}
	}
	return ""
}
