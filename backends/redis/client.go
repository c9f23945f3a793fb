package redis

import (
	"context"
	"crypto/tls"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"net/url"
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

// New returns the store of cfg. It sends nothing to the server.
func New(cfg Config) (*Store, error) {
	if cfg.MinReplicas < 0 {
		return nil, fmt.Errorf("redis: %d replicas to wait for: want 0 or more", cfg.MinReplicas)
	}
	base, err := parseURL(cfg)
	if err != nil {
		return nil, err
	}
	if base.Password == "" {
		base.Password = cfg.Password
	}
	tlsCfg := cfg.TLS
	if base.TLSConfig != nil || tlsCfg != nil {
		if base.TLSConfig == nil {
			return nil, errors.New("redis: TLS files given for a redis:// or unix:// URL: use rediss://")
		} else if tlsCfg == nil {
			tlsCfg = &tls.Config{MinVersion: tls.VersionTLS12}
		}
		tlsCfg = tlsCfg.Clone()
		tlsCfg.InsecureSkipVerify = base.TLSConfig.InsecureSkipVerify // skip_verify=true in the URL
	}
	if cfg.Log == nil {
		cfg.Log = slog.New(slog.DiscardHandler)
	}
	s := &Store{prefix: cfg.Prefix, addr: base.Addr, secrets: []string{base.Password, cfg.SentinelPassword},
		minRepl: cfg.MinReplicas, log: cfg.Log.With("backend", "redis")}
	dial := guardedDialer(base.DialTimeout, tlsCfg)
	switch {
	case cfg.SentinelMaster == "" && len(cfg.Sentinels) == 0:
		if base.Network == "unix" {
			s.addr = "unix:" + s.addr
		}
		s.open = func(pool int, onConnect func(context.Context, *redis.Conn) error) *redis.Client {
			o := *base // NewClient changes what it is given
			tune(&o, dial, pool)
			o.OnConnect = onConnect
			return redis.NewClient(&o)
		}
	case cfg.SentinelMaster == "" || len(cfg.Sentinels) == 0:
		return nil, errors.New("redis: Sentinel needs both the master name and the Sentinels' addresses")
	default:
		for _, a := range cfg.Sentinels {
			if _, port, err := net.SplitHostPort(a); err != nil || port == "" {
				return nil, fmt.Errorf("redis: Sentinel %q: want HOST:PORT", backends.Redact(a))
			}
		}
		s.addr = fmt.Sprintf("Sentinel master %q via %s", cfg.SentinelMaster, strings.Join(cfg.Sentinels, ","))
		s.open = func(pool int, onConnect func(context.Context, *redis.Conn) error) *redis.Client {
			var o redis.Options
			tune(&o, dial, pool)
			// OnConnect runs on the Sentinels' connections too, where
			// tracking fails and says nothing (follow.go).
			return redis.NewFailoverClient(&redis.FailoverOptions{
				MasterName: cfg.SentinelMaster, SentinelAddrs: cfg.Sentinels, SentinelPassword: cfg.SentinelPassword,
				Username: base.Username, Password: base.Password, DB: base.DB, TLSConfig: tlsCfg, OnConnect: onConnect,
				DialTimeout: base.DialTimeout, ReadTimeout: base.ReadTimeout, WriteTimeout: base.WriteTimeout,
				Protocol: o.Protocol, PoolSize: o.PoolSize, MaxIdleConns: o.MaxIdleConns, PipelinePoolSize: o.PipelinePoolSize,
				ReadBufferSize: o.ReadBufferSize, WriteBufferSize: o.WriteBufferSize, DisableIdentity: true, ClientName: o.ClientName,
				ContextTimeoutEnabled: true, Dialer: dial, DialerRetries: o.DialerRetries, MaxRetries: o.MaxRetries,
			})
		}
	}
	s.c = s.open(4, nil)
	s.ctx, s.stop = context.WithCancel(context.Background())
	libraryLog.Store(s)
	libraryOnce.Do(func() { redis.SetLogger(libShim{}) })
	return s, nil
}

// parseURL parses cfg.URL with go-redis's ParseURL, the user information
// split off first, so that a password holding "/" or "," reaches the
// server whole, and no parser ever quotes part of it in an error.
func parseURL(cfg Config) (*redis.Options, error) {
	sentinel, raw := cfg.SentinelMaster != "" || len(cfg.Sentinels) > 0, cfg.URL
	if raw == "" && !sentinel {
		return nil, errors.New("redis: no server URL")
	} else if raw == "" {
		raw = "redis://"
	}
	raw, user, password, hasPassword, _ := backends.SplitUserinfo(raw)
	u, err := url.Parse(raw)
	switch {
	case err != nil:
		return nil, errors.New("redis: the URL does not parse (scheme://[user:password@]host:port[/db])")
	case sentinel && u.Scheme != "redis" && u.Scheme != "rediss":
		return nil, fmt.Errorf("redis: with Sentinel, the URL's scheme is redis:// or rediss://, not %s://", u.Scheme)
	case sentinel && u.Host != "":
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

// tune sets what the store relies on, whatever the URL said.
func tune(opt *redis.Options, dial func(context.Context, string, string) (net.Conn, error), pool int) {
	opt.Protocol = 2 // RESP2: what the guard follows
	// A renewal, a read of the holder's key and a release may overlap;
	// pipelines run on these connections, pub/sub on its own.
	opt.PoolSize, opt.MaxIdleConns, opt.MinIdleConns, opt.PipelinePoolSize = pool, pool, 0, -1
	opt.ReadBufferSize, opt.WriteBufferSize = 4096, 4096 // replies are small (guard.go)
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

// guardedDialer dials, does the TLS handshake if tlsCfg is set (checking
// the name of the address dialled), and puts the guard on the connection.
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

// refused reports whether err is the server refusing us for good
// (credentials, ACL permissions, an unknown command, a certificate either
// side does not trust, no TLS) or answering as no Redis does (the guard),
// rather than a failure that may pass: the network, or one of the
// transient replies below.
func refused(err error) bool {
	var rerr redis.Error
	var verify *tls.CertificateVerificationError
	var header tls.RecordHeaderError
	if errors.As(err, &verify) || errors.As(err, &header) || errors.Is(err, errHostileReply) {
		return true
	} else if !errors.As(err, &rerr) {
		return false
	}
	for _, transient := range []string{"LOADING", "READONLY", "MASTERDOWN", "NOREPLICAS", "BUSY", "TRYAGAIN",
		"CLUSTERDOWN", "MASTER_DOWN", "ERR max number of clients"} {
		if strings.HasPrefix(rerr.Error(), transient) {
			return false
		}
	}
	return true
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

// startChecks asks the server, once per store and in the background, for
// what its users should know: replicas not waited for, fewer replicas
// than waited for, and no append-only file.
func (s *Store) startChecks() {
	s.checks.Do(func() {
		s.wg.Go(func() {
			var repl, pers *redis.StringCmd
			_, err := s.c.Pipelined(s.ctx, func(p redis.Pipeliner) error {
				repl, pers = p.Info(s.ctx, "replication"), p.Info(s.ctx, "persistence")
				return nil
			})
			if err != nil {
				s.log.Debug("redis: could not read INFO replication and persistence", "err", s.redactString(err.Error()))
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
	_, v, _ := strings.Cut(info, "\n"+name+":")
	v, _, _ = strings.Cut(v, "\r")
	return strings.TrimSpace(v)
}
