package cmd

import (
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
	open:     newRedisBackend,
	address:  "--redis-url (LEADERRUN_REDIS_URL), or --redis-sentinels with --redis-sentinel-master",
	// What lets a job write to the lock's keys: the URL (it may carry a
	// password), redis-cli's password variable, the Sentinels' password
	// and the client certificate (the CA only checks the server).
	credentials: []string{"LEADERRUN_REDIS_URL", "REDISCLI_AUTH", "LEADERRUN_REDIS_SENTINEL_PASSWORD",
		"LEADERRUN_REDIS_CERT", "LEADERRUN_REDIS_KEY"},
	risks: redisRisks,
}

// newRedisBackend validates the Redis flags and builds the backend.
// Waiters try again every --retry-period (zero, for status and history,
// which have no such flag: the backend's default). No message shows a
// password: the URL is printed without its user information, and the
// backend's messages are redacted again here.
func newRedisBackend(c *cli.Context, cfg storeConfig) (backends.Backend, error) {
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
	var files *redis.TLSFiles
	if ca, cert, key := c.String("redis-cacert"), c.String("redis-cert"), c.String("redis-key"); ca+cert+key != "" {
		files = &redis.TLSFiles{CA: ca, Cert: cert, Key: key}
		if err := files.Check(); err != nil {
			return nil, usageErrorf("--redis-cacert %q, --redis-cert %q, --redis-key %q: %v", ca, cert, key, err)
		}
	}
	log, err := newLogger(c, os.Stderr)
	if err != nil {
		return nil, err
	}
	b, err := redis.New(redis.Config{
		URL:              rawURL,
		Password:         os.Getenv("REDISCLI_AUTH"),
		SentinelMaster:   master,
		Sentinels:        sentinels,
		SentinelPassword: c.String("redis-sentinel-password"),
		TLS:              files,
		Prefix:           cfg.Prefix,
		Lock:             cfg.Lock,
		MinReplicas:      n,
		RetryPeriod:      c.Duration("retry-period"),
		Log:              log,
	})
	if err != nil {
		msg := err.Error()
		for _, s := range secrets {
			if s != "" {
				msg = strings.ReplaceAll(msg, s, "xxxxx")
			}
		}
		if len(sentinels) > 0 {
			return nil, usageErrorf("--redis-sentinels %q, --redis-url %q: %s", strings.Join(sentinels, ","), backends.Redact(rawURL), msg)
		}
		return nil, usageErrorf("--redis-url %q: %s", backends.Redact(rawURL), msg)
	}
	return b, nil
}
