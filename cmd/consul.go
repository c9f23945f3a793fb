package cmd

import (
	"github.com/urfave/cli/v2"

	"github.com/leaderrun/leaderrun/backends"
)

// consulFlags are the flags of the Consul backend.
func consulFlags() []cli.Flag {
	return []cli.Flag{
		&cli.StringFlag{Name: "consul-addr", Category: categoryStore, EnvVars: []string{"LEADERRUN_CONSUL_ADDR", "CONSUL_HTTP_ADDR"},
			Usage: "Consul agent `ADDR` (host:port or URL)"},
	}
}

// consulSelected reports whether a Consul address is configured.
func consulSelected(c *cli.Context) bool { return c.String("consul-addr") != "" }

func newConsulBackend(c *cli.Context, cfg storeConfig) (backends.Backend, error) {
	return nil, usageErrorf("--backend consul: not available in this build")
}
