package cmd

import (
	"fmt"
	"log/slog"
	"os"
	"path/filepath"
	"strings"
	"time"

	"github.com/urfave/cli/v2"

	"github.com/leaderrun/leaderrun/backends"
	"github.com/leaderrun/leaderrun/backends/local"
)

const (
	categoryLock    = "Lock"
	categoryTiming  = "Timing"
	categoryChild   = "Child"
	categoryStore   = "Store"
	categoryLogging = "Logging"
)

// storeFlags are the flags that choose and reach a store, shared by run and
// status.
func storeFlags() []cli.Flag {
	flags := []cli.Flag{
		&cli.StringFlag{Name: "lock", Category: categoryLock, EnvVars: []string{"LEADERRUN_LOCK"},
			Usage: "lock `NAME`, 1-128 characters from [A-Za-z0-9._-] (required)"},
		&cli.StringFlag{Name: "backend", Category: categoryStore, EnvVars: []string{"LEADERRUN_BACKEND"},
			Usage: "`STORE`: etcd, consul or local (default: etcd if etcd endpoints are set, consul if a Consul address is set)"},
		&cli.StringFlag{Name: "prefix", Category: categoryStore, EnvVars: []string{"LEADERRUN_PREFIX"}, Value: "leaderrun/",
			Usage: "key `PREFIX` of the lock in etcd and Consul"},
		&cli.StringFlag{Name: "state-dir", Category: categoryStore, EnvVars: []string{"LEADERRUN_STATE_DIR"}, Value: defaultStateDir(),
			Usage: "`DIR` of the local backend's lock and token files"},
	}
	flags = append(flags, etcdFlags()...)
	flags = append(flags, consulFlags()...)
	return append(flags, logFlags()...)
}

func logFlags() []cli.Flag {
	return []cli.Flag{
		&cli.StringFlag{Name: "log-format", Category: categoryLogging, EnvVars: []string{"LEADERRUN_LOG_FORMAT"}, Value: "text",
			Usage: "`FORMAT` of the log lines on stderr: text or json"},
		&cli.StringFlag{Name: "log-level", Category: categoryLogging, EnvVars: []string{"LEADERRUN_LOG_LEVEL"}, Value: "info",
			Usage: "`LEVEL`: debug, info, warn or error"},
		&cli.BoolFlag{Name: "quiet", Aliases: []string{"q"}, Category: categoryLogging, EnvVars: []string{"LEADERRUN_QUIET"},
			Usage: "log only warnings and errors (a --try that finds the lock held then prints nothing)"},
	}
}

// defaultStateDir is where the local backend keeps its lock and token
// files. It must survive reboots: the token counter starting again at 1
// would hand out tokens that fenced resources have already seen. So
// /var/lib/leaderrun as root, else $XDG_STATE_HOME/leaderrun, else
// ~/.local/state/leaderrun (DESIGN.md's /run/leaderrun is a tmpfs).
func defaultStateDir() string {
	if os.Geteuid() == 0 {
		return "/var/lib/leaderrun"
	}
	if d := os.Getenv("XDG_STATE_HOME"); d != "" {
		return filepath.Join(d, "leaderrun")
	}
	if home, err := os.UserHomeDir(); err == nil {
		return filepath.Join(home, ".local", "state", "leaderrun")
	}
	return filepath.Join(os.TempDir(), fmt.Sprintf("leaderrun-%d", os.Geteuid()))
}

func newLogger(c *cli.Context, w *os.File) (*slog.Logger, error) {
	var level slog.Level
	if err := level.UnmarshalText([]byte(c.String("log-level"))); err != nil {
		return nil, usageErrorf("--log-level %q: want debug, info, warn or error", c.String("log-level"))
	}
	if c.Bool("quiet") && level < slog.LevelWarn {
		level = slog.LevelWarn
	}
	opts := &slog.HandlerOptions{Level: level}
	switch c.String("log-format") {
	case "text":
		return slog.New(slog.NewTextHandler(w, opts)), nil
	case "json":
		return slog.New(slog.NewJSONHandler(w, opts)), nil
	}
	return nil, usageErrorf("--log-format %q: want text or json", c.String("log-format"))
}

// storeConfig is what every backend constructor needs.
type storeConfig struct {
	Lock          string
	Prefix        string
	LeaseDuration time.Duration
}

// openBackend validates the store flags and builds the chosen backend.
// chooseStore validates the lock and store flags, touching nothing: a
// usage error must come before anything is started.
func chooseStore(c *cli.Context) (string, error) {
	lock := c.String("lock")
	if lock == "" {
		return "", usageErrorf("--lock is required (or LEADERRUN_LOCK)")
	}
	if err := backends.ValidateLockName(lock); err != nil {
		return "", usageErrorf("--lock: %v", err)
	}
	name := c.String("backend")
	if name == "" {
		etcd, consul := etcdSelected(c), consulSelected(c)
		switch {
		case etcd && consul:
			return "", usageErrorf("both etcd endpoints and a Consul address are set: choose one with --backend")
		case etcd:
			name = "etcd"
		case consul:
			name = "consul"
		default:
			return "", usageErrorf("no store configured: set --etcd-endpoints, --consul-addr, or --backend local for a single host")
		}
	}
	switch name {
	case "local":
		if strings.TrimSpace(c.String("state-dir")) == "" {
			return "", usageErrorf("--state-dir must not be empty")
		}
	case "etcd", "consul":
	default:
		return "", usageErrorf("--backend %q: want etcd, consul or local", name)
	}
	return name, nil
}

// openBackend validates the store flags and builds the chosen backend.
func openBackend(c *cli.Context, leaseDuration time.Duration) (backends.Backend, storeConfig, error) {
	cfg := storeConfig{Lock: c.String("lock"), Prefix: c.String("prefix"), LeaseDuration: leaseDuration}
	name, err := chooseStore(c)
	if err != nil {
		return nil, cfg, err
	}
	switch name {
	case "etcd":
		b, err := newEtcdBackend(c, cfg)
		return b, cfg, err
	case "consul":
		b, err := newConsulBackend(c, cfg)
		return b, cfg, err
	}
	return local.New(local.Config{Dir: c.String("state-dir"), Lock: cfg.Lock}), cfg, nil
}
