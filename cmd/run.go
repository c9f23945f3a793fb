package cmd

import (
	"context"
	"fmt"
	"log/slog"
	"os"
	"os/signal"
	"strings"
	"syscall"
	"time"

	"github.com/urfave/cli/v2"

	"github.com/leaderrun/leaderrun/backends"
	"github.com/leaderrun/leaderrun/command"
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
		holdersFlag("up to `N` holders of the lock at once, each in a slot 0..N-1 ($LEADERRUN_SLOT) with a fencing token of its own; every candidate must use the same N"),
		&cli.BoolFlag{Name: "once-per-slot", Category: categoryLock, EnvVars: []string{"LEADERRUN_ONCE_PER_SLOT"},
			Usage: "with --holders, a completed run counts in its own slot only (default: a run completed in any slot counts for the pool)"},
		&cli.IntFlag{Name: "done-exit-code", Category: categoryLock, EnvVars: []string{"LEADERRUN_DONE_EXIT_CODE"}, Value: 0,
			Usage: "exit `CODE` when the run for this period or key was already completed"},
		&cli.DurationFlag{Name: "lease-duration", Category: categoryTiming, EnvVars: []string{"LEADERRUN_LEASE_DURATION"}, Value: backends.DefaultLeaseDuration,
			Usage: "lease TTL `D` asked of the store; must exceed --renew-deadline + --kill-grace"},
		&cli.DurationFlag{Name: "renew-deadline", Category: categoryTiming, EnvVars: []string{"LEADERRUN_RENEW_DEADLINE"}, Value: backends.DefaultRenewDeadline,
			Usage: "stop the command when no renewal was acknowledged for `D`, counted from the renewal's send time"},
		&cli.DurationFlag{Name: "retry-period", Category: categoryTiming, EnvVars: []string{"LEADERRUN_RETRY_PERIOD"}, Value: backends.DefaultRetryPeriod,
			Usage: "renew (and retry a failed renewal) every `D`"},
		&cli.DurationFlag{Name: "kill-grace", Category: categoryChild, EnvVars: []string{"LEADERRUN_KILL_GRACE"}, Value: backends.DefaultKillGrace,
			Usage: "time `D` between the kill signal and SIGKILL"},
		&cli.StringFlag{Name: "kill-signal", Category: categoryChild, EnvVars: []string{"LEADERRUN_KILL_SIGNAL"}, Value: "SIGTERM",
			Usage: "first `SIGNAL` sent to stop the command"},
		&cli.DurationFlag{Name: "progress-timeout", Category: categoryChild, EnvVars: []string{"LEADERRUN_PROGRESS_TIMEOUT"},
			Usage: "stop the command, release the lock and exit 124 when it reports no progress (leaderrun check --progress) for `D`, at least 1s (0: off)"},
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

// runAction runs the command under the lock: read the flags into the
// runner's configuration, catch signals, open the store, set up what
// observes the run, start the runner (and with it the command's
// watchdog), run, and say how it ended.
func runAction(c *cli.Context, st *state) error {
	st.command = "run "
	log, cfg, chosen, err := readRun(c, st)
	if err != nil {
		return err
	}
	sigs := catchSignals()
	defer sigs.stop()
	cfg.Signals = sigs.ch
	s, err := chosen.open(c, storeConfig{Lock: cfg.Lock, Prefix: c.String("prefix")})
	if err != nil {
		return err
	}
	defer s.Close()
	if err := probeLocal(c, chosen, s, cfg.Lock); err != nil {
		return err
	}
	cfg.Store = s
	obs, cleanup, err := observers(c, &cfg, s, log)
	if err != nil {
		return err
	}
	defer cleanup()
	cfg.Observer = obs
	r, err := runner.New(cfg)
	if err != nil {
		return err
	}
	defer r.Close()
	sigs.ready(log)
	status, err := r.Run(context.Background())
	if err != nil {
		st.logged = true // by the runner, with its reason
		return err
	}
	return &childExit{status: status}
}

// readRun reads what the user chose for the run, touching nothing: the
// exit codes, the log, the runner's configuration, the store and the
// command, resolved as a shell would (a typo must never take leadership).
// Everything that depends on how the values relate is the runner's to
// validate (runner.New).
func readRun(c *cli.Context, st *state) (*slog.Logger, runner.Config, store, error) {
	var cfg runner.Config
	if err := misreadLine(c); err != nil {
		return nil, cfg, store{}, err
	}
	if err := flagAsValue(c); err != nil {
		return nil, cfg, store{}, err
	}
	if err := readExitCodes(c, &st.codes); err != nil {
		return nil, cfg, store{}, err
	}
	log, err := newLogger(c, os.Stderr)
	if err != nil {
		return nil, cfg, store{}, err
	}
	if cfg, err = runConfig(c, time.Now()); err != nil {
		return nil, cfg, store{}, err
	}
	chosen, err := storeToServe(c)
	if err != nil {
		return nil, cfg, store{}, err
	}
	if !c.Bool("pass-credentials") {
		cfg.Unset = chosen.credentials
	}
	if cfg.Child.Path, err = command.Resolve(cfg.Child.Args[0]); err != nil {
		return nil, cfg, store{}, err
	}
	cfg.Log = log
	return log, cfg, chosen, nil
}

// readExitCodes reads --conflict-exit-code and --done-exit-code.
func readExitCodes(c *cli.Context, codes *codes) error {
	for _, f := range []struct {
		name string
		code *int
	}{{"conflict-exit-code", &codes.conflict}, {"done-exit-code", &codes.done}} {
		code := c.Int(f.name)
		if code < 0 || code > 255 {
			return usageErrorf("--%s %d: want 0-255", f.name, code)
		}
		*f.code = code
	}
	return nil
}

// caught are the signals leaderrun passes on to the runner.
type caught struct {
	ch    chan os.Signal
	pipes chan os.Signal
	done  chan struct{}
	// reaperErr says why leaderrun could not become a child subreaper.
	reaperErr error
}

// catchSignals starts catching the signals that the runner handles (S6),
// and SIGPIPE. Catching signals costs the runtime a thread round trip per
// signal, a millisecond or more in all: it overlaps with opening the store
// and starting the runner, and ready waits for it before the campaign.
func catchSignals() *caught {
	s := &caught{ch: make(chan os.Signal, 8), pipes: make(chan os.Signal, 1), done: make(chan struct{})}
	go func() {
		defer close(s.done)
		s.reaperErr = signals.BecomeSubreaper()
		signal.Notify(s.ch, signals.Forwarded...)
		// A closed stderr (leaderrun ... 2>&1 | head) must fail writes,
		// not kill leaderrun with SIGPIPE while it holds a child and a
		// lease. Notify, not Ignore, so that the child does not inherit
		// SIG_IGN.
		signal.Notify(s.pipes, syscall.SIGPIPE)
	}()
	return s
}

// ready waits until the signals are caught.
func (s *caught) ready(log *slog.Logger) {
	<-s.done
	if s.reaperErr != nil {
		log.Warn("cannot become child subreaper; orphaned grandchildren go to init", "error", s.reaperErr)
	}
}

func (s *caught) stop() {
	<-s.done
	signal.Stop(s.ch)
	signal.Stop(s.pipes)
}

// runConfig reads the flags of run that do not depend on the store into
// the runner's configuration; now fixes the period of --once-per. It
// parses and checks each flag's own syntax; how the values relate is the
// runner's to check.
func runConfig(c *cli.Context, now time.Time) (runner.Config, error) {
	cfg := runner.Config{
		Lock:     c.String("lock"),
		Identity: c.String("identity"),
		Timings: backends.Timings{
			LeaseDuration: c.Duration("lease-duration"),
			RenewDeadline: c.Duration("renew-deadline"),
			RetryPeriod:   c.Duration("retry-period"),
			KillGrace:     c.Duration("kill-grace"),
		},
		Try:     c.Bool("try"),
		Wait:    c.Duration("wait"),
		MinHold: c.Duration("min-hold"),

		ProgressTimeout: c.Duration("progress-timeout"),
	}
	key, keep, err := onceKey(c, now)
	if err != nil {
		return cfg, err
	}
	cfg.OnceKey, cfg.OnceKeep = key, keep
	if cfg.Holders, cfg.OncePerSlot, err = readPool(c, key); err != nil {
		return cfg, err
	}
	if cfg.Child.KillSignal, err = signals.Parse(c.String("kill-signal")); err != nil {
		return cfg, usageErrorf("--kill-signal: %v", err)
	}
	if err := validIdentity(cfg.Identity); err != nil {
		return cfg, err
	}
	args := c.Args().Slice()
	if len(args) == 0 {
		return cfg, usageErrorf("no command given: leaderrun --lock NAME [flags] -- COMMAND [ARG...]")
	}
	if c.Bool("shell") {
		args = []string{"sh", "-c", strings.Join(args, " ")}
	}
	cfg.Child.Args = args
	return cfg, nil
}

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
		if per > runner.MaxWait {
			return "", 0, usageErrorf("--once-per %v is longer than the %v this tool accepts", per, runner.MaxWait)
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
