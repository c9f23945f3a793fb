package cmd

import (
	"os"

	"github.com/urfave/cli/v2"

	"github.com/hashicorp/consul/api"
	"github.com/leaderrun/leaderrun/backends"
	"github.com/leaderrun/leaderrun/backends/consul"
)

// consulFlags are the flags of the Consul backend. The address, token and
// TLS settings are read as the consul CLI reads them; TLS comes from the
// CONSUL_CACERT, CONSUL_CAPATH, CONSUL_CLIENT_CERT, CONSUL_CLIENT_KEY,
// CONSUL_TLS_SERVER_NAME and CONSUL_HTTP_SSL* variables only.
func consulFlags() []cli.Flag {
	return []cli.Flag{
		&cli.StringFlag{Name: "consul-addr", Category: categoryStore, EnvVars: []string{"LEADERRUN_CONSUL_ADDR", api.HTTPAddrEnvName},
			Usage: "Consul agent `ADDR` (host:port or URL; https:// for TLS, with CONSUL_CACERT, CONSUL_CLIENT_CERT, CONSUL_CLIENT_KEY)"},
		&cli.StringFlag{Name: "consul-token", Category: categoryStore, EnvVars: []string{api.HTTPTokenEnvName},
			Usage: "Consul ACL `TOKEN`; prefer --consul-token-file, CONSUL_HTTP_TOKEN_FILE or CONSUL_HTTP_TOKEN: arguments are visible to every user of the host (warned at start)"},
		&cli.StringFlag{Name: "consul-token-file", Category: categoryStore, EnvVars: []string{api.HTTPTokenFileEnvName},
			Usage: "`FILE` holding the Consul ACL token; wins over --consul-token"},
		&cli.DurationFlag{Name: "consul-lock-delay", Category: categoryStore, EnvVars: []string{"LEADERRUN_CONSUL_LOCK_DELAY"},
			DefaultText: "--kill-grace + 1s",
			Usage:       "after a leader's session is destroyed or invalidated, Consul keeps the lock from everyone for `D` (0s-60s), so that a leader that hears of it stops its command first; failover after a crash takes up to --lease-duration + D"},
	}
}

var consulStore = store{
	name:     "consul",
	flags:    consulFlags,
	selected: func(c *cli.Context) bool { return c.String("consul-addr") != "" },
	open:     openConsul,
	address:  "--consul-addr (CONSUL_HTTP_ADDR)",
	credentials: []string{"CONSUL_HTTP_TOKEN", "CONSUL_HTTP_TOKEN_FILE", "CONSUL_HTTP_AUTH",
		"CONSUL_CLIENT_CERT", "CONSUL_CLIENT_KEY"},
	risks: consulRisks,
}

// openConsul validates the Consul flags and opens the store. The token's
// precedence is the consul CLI's: --consul-token-file, then
// --consul-token, then CONSUL_HTTP_TOKEN_FILE, then CONSUL_HTTP_TOKEN
// (api.NewClient applies it, telling a flag from the variable by value).
func openConsul(c *cli.Context, cfg storeConfig) (backends.Store, error) {
	// Unless given, the lock-delay is each candidate's --kill-grace + 1 s,
	// at most Consul's 60 s, derived from the run's timings by the store.
	d := consul.DefaultLockDelay
	if c.IsSet("consul-lock-delay") {
		if d = c.Duration("consul-lock-delay"); d < 0 || d > consul.MaxLockDelay {
			return nil, usageErrorf("--consul-lock-delay %v: want 0s to %v", d, consul.MaxLockDelay)
		}
	}
	addr := c.String("consul-addr")
	if addr == "" {
		return nil, usageErrorf("--backend consul needs --consul-addr (or CONSUL_HTTP_ADDR)")
	}
	if err := consul.CheckAddress(addr); err != nil {
		return nil, usageErrorf("--consul-addr (CONSUL_HTTP_ADDR): %v", err)
	}
	apiCfg := api.DefaultConfig()
	apiCfg.Address = addr
	apiCfg.Token = c.String("consul-token")
	apiCfg.TokenFile = c.String("consul-token-file")
	if f := apiCfg.TokenFile; f != "" {
		// Say which flag is wrong before the client's own message does.
		if _, err := os.Stat(f); err != nil {
			return nil, usageErrorf("--consul-token-file: %v", err)
		}
	}
	s, err := consul.Open(consul.Config{API: apiCfg, Prefix: cfg.Prefix, LockDelay: d})
	if err != nil {
		return nil, usageErrorf("%v", err)
	}
	return s, nil
}
