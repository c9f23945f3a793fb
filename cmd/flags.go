package cmd

import (
	"fmt"
	"log/slog"
	"os"
	"path/filepath"
	"strings"

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

// store is one backend as the command line knows it. Adding a backend is
// a file with its store value and flags, and one line in stores.
type store struct {
	// name is what --backend takes.
	name string
	// flags reach the store; they are shown under the Store category.
	flags func() []cli.Flag
	// selected reports whether the store's address is set by one of its
	// flags or its own variables (LEADERRUN_*, or the store CLI's own,
	// such as ETCDCTL_ENDPOINTS): that infers --backend. Widely set
	// variables (KUBECONFIG, DATABASE_URL, PG*) never select a store.
	// Nil: never inferred (local).
	selected func(c *cli.Context) bool
	// open validates the store's flags and opens the store. It must not
	// wait on the network: a store that cannot be reached shows in the
	// first campaign or status. It reads no timing flag: the store gets
	// the run's timings with every campaign (backends.Claim).
	open func(c *cli.Context, cfg storeConfig) (backends.Store, error)
	// handOver, when set, runs once the store is chosen, before any
	// signal is caught or anything started: a leaderrun built without the
	// store's backend checks the store's flags and replaces itself with
	// the companion binary that has it (companion.go).
	handOver func(c *cli.Context, cfg storeConfig) error
	// address describes how to select the store, for the usage error.
	address string
	// credentials are the environment variables that carry the store's
	// credentials for the lock only; they are removed from the command's
	// environment unless --pass-credentials. Variables that jobs commonly
	// use for their own work (DATABASE_URL, PG*, KUBECONFIG) are not here.
	credentials []string
	// risks, when set, lists what in the store's settings puts its
	// credentials at risk (risks.go); given are the flags on the command
	// line. Logged as one warning line once the store is chosen.
	risks func(c *cli.Context, given map[string]bool) []string
}

// stores are the backends, in the order the help lists them.
var stores = []store{etcdStore, consulStore, postgresStore, kubernetesStore, zkStore, redisStore, dynamodbStore, s3Store, azureStore, mysqlStore, localStore}

var localStore = store{
	name: "local",
	flags: func() []cli.Flag {
		return []cli.Flag{
			&cli.StringFlag{Name: "state-dir", Category: categoryStore, EnvVars: []string{"LEADERRUN_STATE_DIR"}, Value: defaultStateDir(),
				Usage: "`DIR` of the local backend's lock and token files: this user's or root's, writable by its owner alone (created 0700 if missing)"},
		}
	},
	open: func(c *cli.Context, cfg storeConfig) (backends.Store, error) {
		if strings.TrimSpace(c.String("state-dir")) == "" {
			return nil, usageErrorf("--state-dir must not be empty")
		}
		if err := checkStateDir(c.String("state-dir"), c.Command.Name != "run"); err != nil {
			return nil, err
		}
		return local.Open(c.String("state-dir")), nil
	},
	address: "--backend local for a single host",
}

func storeNames() string {
	names := make([]string, len(stores))
	for i, s := range stores {
		names[i] = s.name
	}
	return strings.Join(names, ", ")
}

// storeFlags are the flags that choose and reach a store, shared by run,
// status and history.
func storeFlags() []cli.Flag {
	flags := []cli.Flag{
		&cli.StringFlag{Name: "lock", Category: categoryLock, EnvVars: []string{"LEADERRUN_LOCK"},
			Usage: "lock `NAME`, 1-128 characters from [A-Za-z0-9._-] (required)"},
		&cli.StringFlag{Name: "backend", Category: categoryStore, EnvVars: []string{"LEADERRUN_BACKEND"},
			Usage: "`STORE`: " + storeNames() + " (default: the one whose address is set)"},
		&cli.StringFlag{Name: "prefix", Category: categoryStore, EnvVars: []string{"LEADERRUN_PREFIX"}, Value: "leaderrun/",
			Usage: "key `PREFIX` of the lock in the store"},
	}
	for _, s := range stores {
		flags = append(flags, s.flags()...)
	}
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
// ~/.local/state/leaderrun (never /run, a tmpfs).
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
	opts := logOptions(level)
	switch c.String("log-format") {
	case "text":
		return slog.New(slog.NewTextHandler(w, opts)), nil
	case "json":
		return slog.New(slog.NewJSONHandler(w, opts)), nil
	}
	return nil, usageErrorf("--log-format %q: want text or json", c.String("log-format"))
}

// logOptions are the options of leaderrun's log: each line one line, even
// where an error's text holds line breaks (a PostgreSQL client lists each
// address it tried on a line of its own).
func logOptions(level slog.Level) *slog.HandlerOptions {
	return &slog.HandlerOptions{Level: level, ReplaceAttr: oneLine}
}

// oneLine joins the lines of a string or error value with "; ".
func oneLine(_ []string, a slog.Attr) slog.Attr {
	var text string
	switch v := a.Value.Any().(type) {
	case string:
		text = v
	case error:
		text = v.Error()
	default:
		return a
	}
	if strings.ContainsAny(text, "\n\r") {
		a.Value = slog.StringValue(lineBreaks.Replace(text))
	}
	return a
}

var lineBreaks = strings.NewReplacer("\r\n", "; ", "\n\t", "; ", "\n", "; ", "\r", "; ")

// storeConfig is what every store's constructor needs: the lock is
// named only for a companion's hand-over, which checks it; the store
// hands out every lock.
type storeConfig struct {
	Lock   string
	Prefix string
}

// chooseStore validates the lock and store flags, touching nothing: a
// usage error must come before the store is touched or the command
// started.
func chooseStore(c *cli.Context) (store, error) {
	if err := flagAsValue(c); err != nil {
		return store{}, err
	}
	lock := c.String("lock")
	if lock == "" && c.IsSet("lock") {
		return store{}, usageErrorf("--lock is empty: want a name of 1-128 characters from [A-Za-z0-9._-]")
	}
	if lock == "" {
		return store{}, usageErrorf("--lock is required (or LEADERRUN_LOCK)")
	}
	if err := backends.ValidateLockName(lock); err != nil {
		return store{}, usageErrorf("--lock: %v", err)
	}
	if name := c.String("backend"); name != "" {
		for _, s := range stores {
			if s.name == name {
				return s, otherStoreFlags(c, s, "--backend is "+s.name)
			}
		}
		return store{}, usageErrorf("--backend %q: want one of %s", name, storeNames())
	}
	var chosen []store
	var how []string
	for _, s := range stores {
		if s.selected != nil && s.selected(c) {
			chosen = append(chosen, s)
		}
		how = append(how, s.address)
	}
	switch len(chosen) {
	case 1:
		return chosen[0], otherStoreFlags(c, chosen[0], "the store is "+chosen[0].name+" (its address is set)")
	case 0:
		return store{}, usageErrorf("no store configured: set %s", strings.Join(how, ", or "))
	}
	names := make([]string, len(chosen))
	for i, s := range chosen {
		names[i] = s.name
	}
	return store{}, usageErrorf("addresses of several stores are set (%s): choose one with --backend", strings.Join(names, ", "))
}

// otherStoreFlags refuses a flag of another store given on the command
// line beside the store chosen, whether by --backend or by its address:
// "--backend local --etcd-endpoints ..." names two stores, and leaderrun
// will not guess which one was meant; "--etcd-endpoints URL
// --redis-min-replicas 2" asks for a safeguard that etcd would silently
// not give. why says how the store was chosen. Variables are left alone:
// an environment set up for etcdctl may well run a job on the local
// backend.
func otherStoreFlags(c *cli.Context, chosen store, why string) error {
	given := commandLineFlags(c)
	for _, s := range stores {
		if s.name == chosen.name {
			continue
		}
		for _, f := range s.flags() {
			if name := f.Names()[0]; given[name] {
				return usageErrorf("--%s is a flag of the %s store, but %s: drop one of them", name, s.name, why)
			}
		}
	}
	return nil
}

// commandLineFlags are the flags given on the command line before
// "--" (not those set from variables).
func commandLineFlags(c *cli.Context) map[string]bool {
	args, _ := c.App.Metadata[argsKey].([]string)
	given := map[string]bool{}
	for _, a := range args {
		if a == "--" {
			break
		}
		if strings.HasPrefix(a, "-") {
			// The flag package takes -name as --name.
			name, _, _ := strings.Cut(strings.TrimLeft(a, "-"), "=")
			given[name] = true
		}
	}
	return given
}

// argsKey is where run keeps the raw arguments in the app's Metadata.
const argsKey = "args"

// openStore validates the store flags and opens the chosen store.
func openStore(c *cli.Context) (backends.Store, store, error) {
	s, err := storeToServe(c)
	if err != nil {
		return nil, s, err
	}
	b, err := s.open(c, storeConfig{Lock: c.String("lock"), Prefix: c.String("prefix")})
	return b, s, err
}

// storeToServe chooses the store and, if this binary lacks its backend,
// hands the run over to the companion that has it (it returns only if
// that failed). Both happen before the store is touched.
func storeToServe(c *cli.Context) (store, error) {
	s, err := chooseStore(c)
	if err != nil {
		return s, err
	}
	if s.handOver != nil {
		if err := s.handOver(c, storeConfig{Lock: c.String("lock"), Prefix: c.String("prefix")}); err != nil {
			return s, err
		}
	}
	// Here, not before the hand-over: the companion says it once.
	warnRisks(c, s)
	return s, nil
}
