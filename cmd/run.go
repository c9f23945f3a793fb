package cmd

import (
	"context"
	"errors"
	"fmt"
	"os"
	"os/signal"
	"strings"
	"syscall"
	"time"

	"github.com/urfave/cli/v2"

	"github.com/leaderrun/leaderrun/runner"
	"github.com/leaderrun/leaderrun/signals"
)

func runFlags() []cli.Flag {
	flags := []cli.Flag{
		&cli.StringFlag{Name: "identity", Category: categoryLock, EnvVars: []string{"LEADERRUN_IDENTITY"},
			Usage: "`ID` stored with the lock and shown by status and history (default: hostname:pid)"},
		&cli.BoolFlag{Name: "try", Category: categoryLock,
			Usage: "do not wait: exit with --conflict-exit-code at once if the lock is held"},
		&cli.DurationFlag{Name: "wait", Category: categoryLock, EnvVars: []string{"LEADERRUN_WAIT"},
			Usage: "give up waiting for the lock after `D` (0: wait forever)"},
		&cli.IntFlag{Name: "conflict-exit-code", Category: categoryLock, EnvVars: []string{"LEADERRUN_CONFLICT_EXIT_CODE"}, Value: ExitConflict,
			Usage: "exit `CODE` when the lock was not acquired (--try, --wait)"},
		&cli.DurationFlag{Name: "min-hold", Category: categoryLock, EnvVars: []string{"LEADERRUN_MIN_HOLD"},
			Usage: "keep leadership at least `D` after the command starts, so that a late cron run elsewhere finds it held"},
		&cli.DurationFlag{Name: "once-per", Category: categoryLock, EnvVars: []string{"LEADERRUN_ONCE_PER"},
			Usage: "at most one successful run per period of length `D` (UTC-aligned: floor(unix time / D)); a leader that finds it done exits --done-exit-code"},
		&cli.StringFlag{Name: "once-key", Category: categoryLock, EnvVars: []string{"LEADERRUN_ONCE_KEY"},
			Usage: "at most one successful run per `KEY` (e.g. $(date +%F)); excludes --once-per"},
		&cli.IntFlag{Name: "done-exit-code", Category: categoryLock, EnvVars: []string{"LEADERRUN_DONE_EXIT_CODE"}, Value: 0,
			Usage: "exit `CODE` when the run for this period or key was already completed"},
		&cli.DurationFlag{Name: "lease-duration", Category: categoryTiming, EnvVars: []string{"LEADERRUN_LEASE_DURATION"}, Value: runner.DefaultLeaseDuration,
			Usage: "lease TTL `D` asked of the store; must exceed --renew-deadline + --kill-grace"},
		&cli.DurationFlag{Name: "renew-deadline", Category: categoryTiming, EnvVars: []string{"LEADERRUN_RENEW_DEADLINE"}, Value: runner.DefaultRenewDeadline,
			Usage: "stop the command when no renewal was acknowledged for `D`, counted from the renewal's send time"},
		&cli.DurationFlag{Name: "retry-period", Category: categoryTiming, EnvVars: []string{"LEADERRUN_RETRY_PERIOD"}, Value: runner.DefaultRetryPeriod,
			Usage: "renew (and retry a failed renewal) every `D`"},
		&cli.DurationFlag{Name: "kill-grace", Category: categoryChild, EnvVars: []string{"LEADERRUN_KILL_GRACE"}, Value: runner.DefaultKillGrace,
			Usage: "time `D` between the kill signal and SIGKILL"},
		&cli.StringFlag{Name: "kill-signal", Category: categoryChild, EnvVars: []string{"LEADERRUN_KILL_SIGNAL"}, Value: "SIGTERM",
			Usage: "first `SIGNAL` sent to stop the command"},
		&cli.BoolFlag{Name: "shell", Category: categoryChild,
			Usage: `run sh -c "COMMAND ARG..." instead of executing COMMAND`},
		&cli.BoolFlag{Name: "pass-credentials", Category: categoryChild, EnvVars: []string{"LEADERRUN_PASS_CREDENTIALS"},
			Usage: "leave the store's credential variables (ETCDCTL_PASSWORD, CONSUL_HTTP_TOKEN, ...) in the command's environment; by default they are removed"},
		&cli.StringFlag{Name: "metrics-addr", Category: categoryLogging, EnvVars: []string{"LEADERRUN_METRICS_ADDR"},
			Usage: "serve Prometheus /metrics and /healthz on `HOST:PORT`, bound as given: :PORT is every interface; 127.0.0.1:PORT keeps it to this host (default: off)"},
	}
	return append(flags, storeFlags()...)
}

func runCommand(st *state) *cli.Command {
	return &cli.Command{
		Name:      "run",
		Usage:     "run COMMAND while holding the lock (the default command)",
		UsageText: "leaderrun [run] --lock NAME [flags] -- COMMAND [ARG...]",
		Flags:     runFlags(),
		OnUsageError: func(c *cli.Context, err error, sub bool) error {
			st.command = "run "
			return onUsageError(c, err, sub)
		},
		Action: func(c *cli.Context) error { return runAction(c, st) },
	}
}

func runAction(c *cli.Context, st *state) error {
	st.command = "run "
	for _, f := range []struct {
		name string
		code *int
	}{{"conflict-exit-code", &st.codes.conflict}, {"done-exit-code", &st.codes.done}} {
		code := c.Int(f.name)
		if code < 0 || code > 255 {
			return usageErrorf("--%s %d: want 0-255", f.name, code)
		}
		*f.code = code
	}
	log, err := newLogger(c, os.Stderr)
	if err != nil {
		return err
	}
	cfg, err := runConfig(c, time.Now())
	if err != nil {
		return err
	}
	if _, err := chooseStore(c); err != nil {
		return err
	}
	// Catching signals costs the runtime a thread round trip per signal, a
	// millisecond or more in all: let that overlap with connecting, and
	// wait for it before campaigning.
	caught := make(chan struct{})
	sigs := make(chan os.Signal, 8)
	// A closed stderr (leaderrun ... 2>&1 | head) must fail writes, not
	// kill leaderrun with SIGPIPE while it holds a child and a lease.
	// Notify, not Ignore, so that the child does not inherit SIG_IGN.
	pipes := make(chan os.Signal, 1)
	var reaperErr error
	go func() {
		defer close(caught)
		reaperErr = signals.BecomeSubreaper()
		signal.Notify(sigs, signals.Forwarded...)
		signal.Notify(pipes, syscall.SIGPIPE)
	}()
	defer func() {
		<-caught
		signal.Stop(sigs)
		signal.Stop(pipes)
	}()
	// Resolve before campaigning: a typo must never take leadership.
	path, err := signals.Resolve(cfg.Args[0])
	if err != nil {
		return err
	}
	cfg.Path = path
	cfg.Log = log
	cfg.Lock = c.String("lock")
	backend, store, err := openBackend(c)
	if err != nil {
		return err
	}
	defer backend.Close()
	cfg.Backend = backend
	cfg.Lock = store.Lock
	if s, _ := chooseStore(c); !c.Bool("pass-credentials") {
		cfg.Unset = s.credentials
	}
	if err := cfg.Validate(); err != nil {
		return err
	}
	// The command's watchdog starts while we connect and campaign.
	// runner.Run starts the command or aborts the watchdog; until it has
	// it, an early return aborts it here.
	sup, err := signals.Prepare(runner.SupervisorSpec(cfg))
	if err != nil {
		return err
	}
	defer func() {
		if sup != nil {
			sup.Abort()
		}
	}()

	obs, cleanup, err := observers(c, &cfg, backend, log)
	if err != nil {
		return err
	}
	defer cleanup()
	cfg.Observer = obs

	<-caught
	if reaperErr != nil {
		log.Warn("cannot become child subreaper; orphaned grandchildren go to init", "error", reaperErr)
	}
	cfg.Signals = sigs
	cfg.Supervisor, sup = sup, nil
	status, err := runner.Run(context.Background(), cfg)
	switch {
	case err == nil:
		return &childExit{status: status}
	case errors.Is(err, runner.ErrNotAcquired):
		// The normal outcome for all but one host of a cron job: one line
		// at info level, nothing at all with --quiet.
		log.Info("not acquired; not running the command", "lock", cfg.Lock, "identity", cfg.Identity,
			"backend", backend.Name(), "reason", err)
	case errors.As(err, new(*runner.DoneError)):
		// Logged by the runner, with who completed it.
	case errors.As(err, new(*runner.InterruptedError)):
		// A standby stopped by systemctl stop: nothing went wrong. The
		// runner logged the withdrawal.
	case errors.Is(err, runner.ErrLeadershipLost):
		// The runner logged the loss, with its reason, where it happened.
	default:
		log.Error("leaderrun failed", "lock", cfg.Lock, "identity", cfg.Identity, "backend", backend.Name(), "error", err)
	}
	st.logged = true
	return err
}

// runConfig reads and validates the flags of run that do not depend on the
// store; now fixes the period of --once-per.
func runConfig(c *cli.Context, now time.Time) (runner.Config, error) {
	cfg := runner.Config{
		Identity:      c.String("identity"),
		LeaseDuration: c.Duration("lease-duration"),
		RenewDeadline: c.Duration("renew-deadline"),
		RetryPeriod:   c.Duration("retry-period"),
		KillGrace:     c.Duration("kill-grace"),
		Try:           c.Bool("try"),
		Wait:          c.Duration("wait"),
		MinHold:       c.Duration("min-hold"),
	}
	if err := runner.ValidateTimings(cfg.LeaseDuration, cfg.RenewDeadline, cfg.RetryPeriod, cfg.KillGrace); err != nil {
		return cfg, usageErrorf("%v", err)
	}
	if cfg.Wait < 0 {
		return cfg, usageErrorf("--wait %v: must not be negative", cfg.Wait)
	}
	if cfg.MinHold < 0 {
		return cfg, usageErrorf("--min-hold %v: must not be negative", cfg.MinHold)
	}
	if cfg.Try && cfg.Wait > 0 {
		return cfg, usageErrorf("--try and --wait %v exclude each other", cfg.Wait)
	}
	for _, d := range []struct {
		name string
		v    time.Duration
	}{{"--wait", cfg.Wait}, {"--min-hold", cfg.MinHold}} {
		if d.v > maxWait {
			return cfg, usageErrorf("%s %v is longer than the %v this tool accepts", d.name, d.v, maxWait)
		}
	}
	key, keep, err := onceKey(c, now)
	if err != nil {
		return cfg, err
	}
	cfg.OnceKey, cfg.OnceKeep = key, keep
	sig, err := signals.Parse(c.String("kill-signal"))
	if err != nil {
		return cfg, usageErrorf("--kill-signal: %v", err)
	}
	if sig == syscall.SIGSTOP || sig == syscall.SIGCONT {
		return cfg, usageErrorf("--kill-signal %s: would not stop the command", c.String("kill-signal"))
	}
	cfg.KillSignal = sig
	if err := validIdentity(cfg.Identity); err != nil {
		return cfg, err
	}
	if cfg.Identity == "" {
		host, err := os.Hostname()
		if err != nil {
			host = "unknown"
		}
		cfg.Identity = fmt.Sprintf("%s:%d", host, os.Getpid())
	}
	args := c.Args().Slice()
	if len(args) == 0 {
		return cfg, usageErrorf("no command given: leaderrun --lock NAME [flags] -- COMMAND [ARG...]")
	}
	if c.Bool("shell") {
		args = []string{"sh", "-c", strings.Join(args, " ")}
	}
	cfg.Args = args
	return cfg, nil
}

// maxWait bounds --wait and --min-hold, so that no deadline computed from
// them can overflow.
const maxWait = 366 * 24 * time.Hour

// Marker lifetimes: about seven periods for --once-per, a week at least
// for --once-key (markers expire on their own; README, "Once per period").
const (
	markerPeriods = 7
	minMarkerKeep = 7 * 24 * time.Hour
)

// onceKey derives the once-key from --once-per or --once-key, and how long
// its marker is kept. With --once-per D the key names the period:
// floor(unix time / D), UTC-aligned, so every host computes the same key
// for the same moment whatever its time zone.
func onceKey(c *cli.Context, now time.Time) (string, time.Duration, error) {
	per, key := c.Duration("once-per"), c.String("once-key")
	perSet := c.IsSet("once-per")
	switch {
	case perSet && key != "":
		return "", 0, usageErrorf("--once-per and --once-key exclude each other")
	case perSet:
		if per < time.Second || per%time.Second != 0 {
			return "", 0, usageErrorf("--once-per %v: want a whole number of seconds, at least 1s", per)
		}
		if per > maxWait {
			return "", 0, usageErrorf("--once-per %v is longer than the %v this tool accepts", per, maxWait)
		}
		return periodKey(per, now), markerPeriods * per, nil
	case key != "":
		if err := validOnceKey(key); err != nil {
			return "", 0, err
		}
		return key, minMarkerKeep, nil
	}
	return "", 0, nil
}

// periodKey names the period of length per that now falls in.
func periodKey(per time.Duration, now time.Time) string {
	n := now.UnixNano() / per.Nanoseconds()
	if now.UnixNano() < 0 && now.UnixNano()%per.Nanoseconds() != 0 {
		n-- // floor, not truncation, before 1970
	}
	return fmt.Sprintf("every-%ds-%d", int64(per/time.Second), n)
}

// validOnceKey keeps once-keys to what every store takes as part of a key
// or a name.
func validOnceKey(key string) error {
	ok := len(key) >= 1 && len(key) <= 128
	for i := 0; ok && i < len(key); i++ {
		c := key[i]
		ok = c >= 'a' && c <= 'z' || c >= 'A' && c <= 'Z' || c >= '0' && c <= '9' || strings.IndexByte("._-:+", c) >= 0
	}
	if !ok {
		return usageErrorf("--once-key %q: want 1-128 characters from [A-Za-z0-9._:+-]", key)
	}
	return nil
}

// validIdentity keeps identities printable and short: they are stored in
// the lock's record and printed by status.
func validIdentity(id string) error {
	if len(id) > 256 {
		return usageErrorf("--identity: longer than 256 bytes")
	}
	for _, r := range id {
		if r < ' ' || r == 0x7f {
			return usageErrorf("--identity %q: control characters are not allowed", id)
		}
	}
	return nil
}
