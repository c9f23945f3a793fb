package cmd

import (
	"crypto/tls"
	"crypto/x509"
	"errors"
	"fmt"
	"os"
	"strings"

	"github.com/urfave/cli/v2"

	"github.com/leaderrun/leaderrun/backends"
	"github.com/leaderrun/leaderrun/backends/redis"
)

// redisFlags are the flags of the Redis backend. The password is read as
// redis-cli reads it: from the URL, else from REDISCLI_AUTH, which never
// selects the store by itself.
func redisFlags() []cli.Flag {
	return []cli.Flag{
		&cli.StringFlag{Name: "redis-url", Category: categoryStore, EnvVars: []string{"LEADERRUN_REDIS_URL"},
			Usage: "Redis `URL`: redis://[user[:password]@]host:port[/db], rediss:// for TLS, or unix://[user[:password]@]/path/to/redis.sock; " +
				"without a password in it, the password comes from REDISCLI_AUTH, as redis-cli reads it. " +
				"Put no password here: arguments are visible to every user of the host; use the variable, or REDISCLI_AUTH for the password alone. " +
				"skip_verify=true turns rediss://'s certificate check off; leaderrun warns at start of it, of a password here, and of one sent over redis:// to another host. " +
				"Tokens only increase while the server never forgets an acknowledged write (appendonly yes, appendfsync always): see docs/backends/redis.md"},
		&cli.StringFlag{Name: "redis-sentinels", Category: categoryStore, EnvVars: []string{"LEADERRUN_REDIS_SENTINELS"},
			Usage: "comma-separated `HOSTS` (host:port) of the Sentinels that watch the primary, with --redis-sentinel-master; " +
				"--redis-url then gives only the scheme, user, password and database, no host (rediss://user:password@/0)"},
		&cli.StringFlag{Name: "redis-sentinel-master", Category: categoryStore, EnvVars: []string{"LEADERRUN_REDIS_SENTINEL_MASTER"},
			Usage: "master `NAME` of the primary, as the Sentinels know it"},
		&cli.StringFlag{Name: "redis-sentinel-password", Category: categoryStore, EnvVars: []string{"LEADERRUN_REDIS_SENTINEL_PASSWORD"},
			Usage: "`PASSWORD` of the Sentinels themselves; prefer LEADERRUN_REDIS_SENTINEL_PASSWORD: arguments are visible to every user of the host (warned at start)"},
		&cli.IntFlag{Name: "redis-min-replicas", Category: categoryStore, EnvVars: []string{"LEADERRUN_REDIS_MIN_REPLICAS"}, Value: 0,
			Usage: "start the command only once `N` replicas acknowledged the grant (WAIT), and count each renewal only once they acknowledged it; " +
				"narrows what a failover can lose, does not close it (docs/backends/redis.md)"},
		&cli.StringFlag{Name: "redis-cacert", Category: categoryStore, EnvVars: []string{"LEADERRUN_REDIS_CACERT"},
			Usage: "verify the server's TLS certificate (rediss://) with the CA bundle in `FILE`"},
		&cli.StringFlag{Name: "redis-cert", Category: categoryStore, EnvVars: []string{"LEADERRUN_REDIS_CERT"},
			Usage: "TLS client certificate `FILE` (with --redis-key)"},
		&cli.StringFlag{Name: "redis-key", Category: categoryStore, EnvVars: []string{"LEADERRUN_REDIS_KEY"},
			Usage: "TLS client key `FILE` (with --redis-cert)"},
	}
}

var redisStore = store{
	name:     "redis",
	flags:    redisFlags,
	selected: func(c *cli.Context) bool { return c.String("redis-url") != "" || c.String("redis-sentinels") != "" },
	open:     newRedisStore,
	address:  "--redis-url (LEADERRUN_REDIS_URL), or --redis-sentinels with --redis-sentinel-master",
	// What lets a job write to the lock's keys: the URL (it may carry a
	// password), redis-cli's password variable, the Sentinels' password
	// and the client certificate (the CA only checks the server).
	credentials: []string{"LEADERRUN_REDIS_URL", "REDISCLI_AUTH", "LEADERRUN_REDIS_SENTINEL_PASSWORD",
		"LEADERRUN_REDIS_CERT", "LEADERRUN_REDIS_KEY"},
	risks: redisRisks,
}

// newRedisStore validates the Redis flags and opens the store. No
// message shows a password: the URL is printed without its user
// information, and the store's messages are redacted again here.
func newRedisStore(c *cli.Context, cfg storeConfig) (backends.Store, error) {
	rawURL, master := c.String("redis-url"), c.String("redis-sentinel-master")
	if list := c.String("redis-sentinels"); backends.Redact(list) != list {
		// Refused before the list is split, so that no piece of a
		// password holding "," is quoted as a Sentinel.
		return nil, usageErrorf("--redis-sentinels %q: want HOST:PORT, without user information (the Sentinels' password goes in LEADERRUN_REDIS_SENTINEL_PASSWORD)",
			backends.Redact(list))
	}
	var sentinels []string
	for _, s := range strings.Split(c.String("redis-sentinels"), ",") {
		if s = strings.TrimSpace(s); s != "" {
			sentinels = append(sentinels, s)
		}
	}
	secrets := []string{os.Getenv("REDISCLI_AUTH"), c.String("redis-sentinel-password")}
	if _, _, p, ok, _ := backends.SplitUserinfo(rawURL); ok {
		secrets = append(secrets, p)
	}
	switch {
	case rawURL == "" && len(sentinels) == 0 && master == "":
		return nil, usageErrorf("--backend redis: set --redis-url (LEADERRUN_REDIS_URL), or --redis-sentinels with --redis-sentinel-master")
	case len(sentinels) == 0 && master != "", len(sentinels) > 0 && master == "":
		return nil, usageErrorf("--redis-sentinels and --redis-sentinel-master go together")
	}
	n := c.Int("redis-min-replicas")
	if n < 0 {
		return nil, usageErrorf("--redis-min-replicas %d: want 0 or more", n)
	}
	var tlsCfg *tls.Config
	if ca, cert, key := c.String("redis-cacert"), c.String("redis-cert"), c.String("redis-key"); ca+cert+key != "" {
		var err error
		if tlsCfg, err = redisTLS(ca, cert, key); err != nil {
			return nil, usageErrorf("--redis-cacert %q, --redis-cert %q, --redis-key %q: %v", ca, cert, key, err)
		}
	}
	log, err := newLogger(c, os.Stderr)
	if err != nil {
		return nil, err
	}
	s, err := redis.New(redis.Config{
		URL:              rawURL,
		Password:         os.Getenv("REDISCLI_AUTH"),
		SentinelMaster:   master,
		Sentinels:        sentinels,
		SentinelPassword: c.String("redis-sentinel-password"),
		TLS:              tlsCfg,
		Prefix:           cfg.Prefix,
		MinReplicas:      n,
		Log:              log,
	})
	if err != nil {
		msg := err.Error()
		for _, p := range secrets {
			if p != "" {
				msg = strings.ReplaceAll(msg, p, "xxxxx")
			}
		}
		if len(sentinels) > 0 {
			return nil, usageErrorf("--redis-sentinels %q, --redis-url %q: %s", strings.Join(sentinels, ","), backends.Redact(rawURL), msg)
		}
		return nil, usageErrorf("--redis-url %q: %s", backends.Redact(rawURL), msg)
	}
	return s, nil
}

// redisTLS reads the files of --redis-cacert, --redis-cert and
// --redis-key, as redis-cli reads them. Each may be empty.
func redisTLS(ca, cert, key string) (*tls.Config, error) {
	cfg := &tls.Config{MinVersion: tls.VersionTLS12}
	if ca != "" {
		pem, err := os.ReadFile(ca)
		if err != nil {
			return nil, fmt.Errorf("CA bundle: %w", err)
		}
		cfg.RootCAs = x509.NewCertPool()
		if !cfg.RootCAs.AppendCertsFromPEM(pem) {
			return nil, fmt.Errorf("CA bundle %s: no PEM certificate in it", ca)
		}
	}
	if (cert == "") != (key == "") {
		return nil, errors.New("a client certificate needs both the certificate and its key")
	}
	if cert != "" {
		pair, err := tls.LoadX509KeyPair(cert, key)
		if err != nil {
			// Its messages name files, never what a key holds.
			return nil, fmt.Errorf("client certificate: %w", err)
		}
		cfg.Certificates = []tls.Certificate{pair}
	}
	return cfg, nil
}
