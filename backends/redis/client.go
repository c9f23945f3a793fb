package redis

import (
	"context"
	"crypto/tls"
	"crypto/x509"
	"errors"
	"fmt"
	"net"
	"net/url"
	"os"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/redis/go-redis/v9"
	"github.com/redis/go-redis/v9/maintnotifications"

	"github.com/leaderrun/leaderrun/backends"
)

// DefaultDialTimeout bounds each connection attempt, unless the URL's
// dial_timeout says otherwise.
const DefaultDialTimeout = 5 * time.Second

// TLSFiles are the files of a TLS configuration, as redis-cli's --cacert,
// --cert and --key take them. Each may be empty.
type TLSFiles struct {
	CA, Cert, Key string
}

// Check reads the files as the store will, for a configuration error
// before anything is contacted.
func (f TLSFiles) Check() error {
	_, err := f.load()
	return err
}

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

// opener builds a client of the configured server (or Sentinel-managed
// primary) with a pool of the given size, onConnect run on every new
// connection.
type opener func(pool int, onConnect func(context.Context, *redis.Conn) error) *redis.Client

// newClient parses cfg, and returns how to open its clients, the address
// for messages and the secrets to redact from them.
func newClient(cfg Config) (open opener, addr string, secrets []string, err error) {
	base, err := parseURL(cfg)
	if err != nil {
		return nil, "", nil, err
	}
	if base.Password == "" {
		base.Password = cfg.Password
	}
	secrets = []string{base.Password, cfg.SentinelPassword}
	var tlsCfg *tls.Config
	if base.TLSConfig != nil || cfg.TLS != nil {
		if base.TLSConfig == nil {
			return nil, "", nil, errors.New("redis: TLS files given for a redis:// or unix:// URL: use rediss://")
		}
		files := TLSFiles{}
		if cfg.TLS != nil {
			files = *cfg.TLS
		}
		if tlsCfg, err = files.load(); err != nil {
			return nil, "", nil, fmt.Errorf("redis: %w", err)
		}
		tlsCfg.InsecureSkipVerify = base.TLSConfig.InsecureSkipVerify // skip_verify=true in the URL
	}
	dial := guardedDialer(base.DialTimeout, tlsCfg)
	if cfg.SentinelMaster == "" && len(cfg.Sentinels) == 0 {
		addr = base.Addr
		if base.Network == "unix" {
			addr = "unix:" + addr
		}
		return func(pool int, onConnect func(context.Context, *redis.Conn) error) *redis.Client {
			o := *base // NewClient changes what it is given
			tune(&o, dial, pool)
			o.OnConnect = onConnect
			return redis.NewClient(&o)
		}, addr, secrets, nil
	}
	if cfg.SentinelMaster == "" || len(cfg.Sentinels) == 0 {
		return nil, "", nil, errors.New("redis: Sentinel needs both the master name and the Sentinels' addresses")
	}
	for _, s := range cfg.Sentinels {
		if _, port, err := net.SplitHostPort(s); err != nil || port == "" {
			return nil, "", nil, fmt.Errorf("redis: Sentinel %q: want HOST:PORT", backends.Redact(s))
		}
	}
	addr = fmt.Sprintf("Sentinel master %q via %s", cfg.SentinelMaster, strings.Join(cfg.Sentinels, ","))
	return func(pool int, onConnect func(context.Context, *redis.Conn) error) *redis.Client {
		var o redis.Options
		tune(&o, dial, pool)
		// OnConnect runs on the Sentinels' connections too, where
		// tracking fails and says nothing: the holder's probe tells.
		return redis.NewFailoverClient(&redis.FailoverOptions{
			MasterName: cfg.SentinelMaster, SentinelAddrs: cfg.Sentinels, SentinelPassword: cfg.SentinelPassword,
			Username: base.Username, Password: base.Password, DB: base.DB, TLSConfig: tlsCfg, OnConnect: onConnect,
			DialTimeout: base.DialTimeout, ReadTimeout: base.ReadTimeout, WriteTimeout: base.WriteTimeout,
			Protocol: o.Protocol, PoolSize: o.PoolSize, MaxIdleConns: o.MaxIdleConns, PipelinePoolSize: o.PipelinePoolSize,
			ReadBufferSize: o.ReadBufferSize, WriteBufferSize: o.WriteBufferSize, DisableIdentity: true, ClientName: o.ClientName,
			ContextTimeoutEnabled: true, Dialer: dial, DialerRetries: o.DialerRetries, MaxRetries: o.MaxRetries,
		})
	}, addr, secrets, nil
}

// parseURL parses cfg.URL with go-redis's ParseURL. With Sentinels the
// URL names no host (the Sentinels name the primary), and may be empty.
// Errors never show the URL: it may carry a password.
func parseURL(cfg Config) (*redis.Options, error) {
	sentinel := cfg.SentinelMaster != "" || len(cfg.Sentinels) > 0
	raw := cfg.URL
	if raw == "" {
		if !sentinel {
			return nil, errors.New("redis: no server URL")
		}
		raw = "redis://"
	}
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
		// go-redis's messages quote query parameters and paths, not the
		// user information; redact the password all the same.
		msg := strings.TrimPrefix(err.Error(), "redis: ")
		if p, ok := u.User.Password(); ok && p != "" {
			msg = strings.ReplaceAll(msg, p, "xxxxx")
		}
		return nil, fmt.Errorf("redis: URL: %s (want redis://, rediss:// or unix://)", msg)
	}
	if opt.DialTimeout == 0 {
		opt.DialTimeout = DefaultDialTimeout
	}
	return opt, nil
}

// tune sets what the store relies on, whatever the URL said.
func tune(opt *redis.Options, dial func(context.Context, string, string) (net.Conn, error), pool int) {
	// RESP2: what the guard follows. Nothing here needs RESP3.
	opt.Protocol = 2
	// The main pool: a renewal, a read of the holder's key and a release
	// may overlap. Pub/sub connections are apart; pipelines run on these.
	opt.PoolSize, opt.MaxIdleConns, opt.MinIdleConns, opt.PipelinePoolSize = pool, pool, 0, -1
	// Replies are small (see guard.go): small buffers, per connection.
	opt.ReadBufferSize, opt.WriteBufferSize = 4096, 4096
	// CLIENT SETINFO costs a round trip per connection; the name goes
	// with HELLO.
	opt.DisableIdentity, opt.ClientName = true, "leaderrun"
	// The context's deadline bounds every request. One dial per attempt
	// and one retry of a request (a pooled connection that broke while
	// idle fails the first request on it): the driver retries with a
	// backoff of its own, and a --try must fail at once.
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
			if host, _, err := net.SplitHostPort(addr); err == nil && cfg.ServerName == "" {
				cfg.ServerName = host
			}
			tc := tls.Client(conn, cfg)
			hctx, cancel := context.WithTimeout(ctx, timeout)
			defer cancel()
			if err := tc.HandshakeContext(hctx); err != nil {
				conn.Close()
				return nil, fmt.Errorf("TLS handshake with %s: %w", addr, err)
			}
			conn = tc
		}
		return guard(conn), nil
	}
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
// process): the newest store's log, at debug level, redacted.
var (
	libraryLog  atomic.Pointer[Store]
	libraryOnce sync.Once
)

type libShim struct{}

func (libShim) Printf(_ context.Context, format string, v ...any) {
	if s := libraryLog.Load(); s != nil {
		s.log.Debug(s.redactString(fmt.Sprintf(format, v...)), "source", "go-redis")
	}
}

// startChecks asks the server, once per store and in the background
// (the first campaign does not wait for it), for what its users should
// know: replicas while no replica is waited for (a failover can lose a
// grant), fewer replicas than waited for (no child will start), and no
// append-only file (a restart can repeat tokens).
func (s *Store) startChecks() {
	s.checks.Do(func() {
		s.wg.Go(func() {
			var repl, pers *redis.StringCmd
			_, err := s.c.Pipelined(s.ctx, func(p redis.Pipeliner) error {
				repl, pers = p.Info(s.ctx, "replication"), p.Info(s.ctx, "persistence")
				return nil
			})
			if err != nil {
				s.log.Debug("redis: could not read INFO replication and persistence", "err", s.redact(err))
				return
			}
			n, err := strconv.Atoi(infoField(repl.Val(), "connected_slaves"))
			switch {
			case err != nil:
			case n > 0 && s.minRepl == 0:
				s.log.Warn("redis: the server has replicas, and --redis-min-replicas is 0: replication is asynchronous, so a failover to a replica "+
					"can lose a grant and its token increment; two holders and a repeated token are then possible. "+
					"--redis-min-replicas narrows that window (docs/backends/redis.md)", "server", s.addr, "connected_replicas", n)
			case n < s.minRepl:
				s.log.Warn("redis: fewer replicas are connected than --redis-min-replicas: no grant will count until enough are",
					"server", s.addr, "connected_replicas", n, "min_replicas", s.minRepl)
			}
			if infoField(pers.Val(), "aof_enabled") == "0" {
				s.log.Info("redis: the server keeps no append-only file (aof_enabled:0): a restart forgets grants and tokens since its last snapshot, "+
					"and tokens can repeat; run it with appendonly yes and appendfsync always (docs/backends/redis.md)", "server", s.addr)
			}
		})
	})
}

// infoField is the value of name in an INFO section's text, "" if none.
func infoField(info, name string) string {
	for line := range strings.Lines(info) {
		if v, ok := strings.CutPrefix(strings.TrimSpace(line), name+":"); ok {
			return v
		}
	}
	return ""
}
