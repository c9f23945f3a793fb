package cmd

import (
	"context"
	"log/slog"
	"os"

	"github.com/urfave/cli/v2"

	"github.com/leaderrun/leaderrun/backends"
	"github.com/leaderrun/leaderrun/observers/control"
	"github.com/leaderrun/leaderrun/observers/metrics"
	"github.com/leaderrun/leaderrun/observers/notify"
	"github.com/leaderrun/leaderrun/runner"
)

// observers builds what watches a run: the check socket, the memory
// keeper, sd_notify when under systemd, and metrics when --metrics-addr is
// set. cleanup stops them all; call it after the runner's Run returns.
func observers(c *cli.Context, cfg *runner.Config, s backends.Store, log *slog.Logger) (runner.Observer, func(), error) {
	var (
		obs     runner.Observers
		closers []func()
		cleanup = func() {
			for i := len(closers) - 1; i >= 0; i-- {
				closers[i]()
			}
		}
	)
	state := &control.State{}
	if cfg.ProgressTimeout != 0 {
		// `leaderrun check --progress` reports through the check socket.
		cfg.Progress = runner.NewProgress()
		state.Progress = cfg.Progress
	}
	// The socket's directory goes in $XDG_RUNTIME_DIR (per user, cleared
	// at logout) if there is one, else in $TMPDIR or /tmp.
	srv, err := control.Listen(os.Getenv("XDG_RUNTIME_DIR"), state, log)
	if err != nil {
		return nil, nil, err
	}
	closers = append(closers, func() { srv.Close() })
	obs = append(obs, state)
	cfg.Socket = srv.Path()

	mem := &memoryKeeper{}
	closers = append(closers, mem.close)
	obs = append(obs, mem)

	if addr := c.String("metrics-addr"); addr != "" {
		m := metrics.New(cfg.Lock, s.Name())
		ms, err := metrics.Serve(addr, m, metrics.Limits{})
		if err != nil {
			cleanup()
			return nil, nil, usageErrorf("--metrics-addr %q: %v", addr, err)
		}
		log.Info("serving metrics", "addr", ms.Addr())
		closers = append(closers, func() { ms.Close() })
		obs = append(obs, m)
	}

	status := func(ctx context.Context) (backends.Status, error) { return backends.ReadStatus(ctx, s, cfg.Lock) }
	if n := notify.New(cfg.Lock, status, log); n != nil {
		if iv := n.WatchdogInterval(); iv > 0 && iv < cfg.Timings.RetryPeriod {
			log.Warn("systemd's WatchdogSec is shorter than two --retry-period; the watchdog may fire while renewals are healthy",
				"watchdog_half", iv, "retry_period", cfg.Timings.RetryPeriod)
		}
		closers = append(closers, n.Close)
		obs = append(obs, n)
	}
	return obs, cleanup, nil
}
