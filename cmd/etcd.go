package cmd

import (
	"github.com/urfave/cli/v2"

	"github.com/leaderrun/leaderrun/backends"
)

// etcdFlags are the flags of the etcd backend.
func etcdFlags() []cli.Flag {
	return []cli.Flag{
		&cli.StringFlag{Name: "etcd-endpoints", Category: categoryStore, EnvVars: []string{"LEADERRUN_ETCD_ENDPOINTS", "ETCDCTL_ENDPOINTS"},
			Usage: "comma-separated etcd `URLS`"},
	}
}

// etcdSelected reports whether etcd endpoints are configured.
func etcdSelected(c *cli.Context) bool { return c.String("etcd-endpoints") != "" }

func newEtcdBackend(c *cli.Context, cfg storeConfig) (backends.Backend, error) {
	return nil, usageErrorf("--backend etcd: not available in this build")
}
