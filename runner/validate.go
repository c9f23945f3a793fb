package runner

import (
	"fmt"
	"syscall"
	"time"

	"github.com/leaderrun/leaderrun/backends"
	"github.com/leaderrun/leaderrun/signals"
)

// ConfigError is a configuration that cannot be run safely. Its message
// names the flags involved, since that is what a user fixes.
type ConfigError struct{ msg string }

func (e *ConfigError) Error() string { return e.msg }

func configErrorf(format string, args ...any) error {
	return &ConfigError{msg: fmt.Sprintf(format, args...)}
}

// MaxWait bounds --wait, --min-hold and --once-per, so that no deadline
// computed from them can overflow.
const MaxWait = 366 * 24 * time.Hour

// validate checks everything Run depends on, once, before anything
// starts: the timings and how they relate, the lease duration against
// what the store accepts, the waits, the kill signal and the once-key.
func (c *Config) validate() error {
	if c.Store == nil {
		return configErrorf("no store to campaign in")
	}
	if c.Child.Path == "" || len(c.Child.Args) == 0 {
		return configErrorf("no command given")
	}
	if err := c.Timings.Validate(); err != nil {
		return &ConfigError{msg: err.Error()}
	}
	if chk, ok := c.Store.(backends.TimingsChecker); ok {
		if err := chk.CheckTimings(c.Timings); err != nil {
			return &ConfigError{msg: err.Error()}
		}
	}
	if err := c.validateWaits(); err != nil {
		return err
	}
	if sig := c.Child.KillSignal; sig == syscall.SIGSTOP || sig == syscall.SIGCONT {
		return configErrorf("--kill-signal %s: would not stop the command", signals.Name(sig))
	}
	if c.OnceKey != "" && c.OnceKeep <= 0 {
		return configErrorf("a once-key needs a marker lifetime")
	}
	if err := c.validateProgress(); err != nil {
		return err
	}
	return c.validatePool()
}

// validateProgress checks --progress-timeout.
func (c *Config) validateProgress() error {
	switch d := c.ProgressTimeout; {
	case d == 0:
		return nil
	case d < MinProgressTimeout:
		return configErrorf("--progress-timeout %v: want at least %v (0 turns it off): a report is a process start and a "+
			"round trip on the check socket, and a shorter timeout would stop a healthy job on a scheduling hiccup",
			d, MinProgressTimeout)
	case d > MaxWait:
		return configErrorf("--progress-timeout %v is longer than the %v this tool accepts", d, MaxWait)
	case c.Progress == nil:
		return configErrorf("--progress-timeout %v: no channel for the command's progress reports", d)
	}
	return nil
}

// validateWaits checks --wait and --min-hold.
func (c *Config) validateWaits() error {
	for _, d := range []struct {
		name string
		v    time.Duration
	}{{"--wait", c.Wait}, {"--min-hold", c.MinHold}} {
		if d.v < 0 {
			return configErrorf("%s %v: must not be negative", d.name, d.v)
		}
		if d.v > MaxWait {
			return configErrorf("%s %v is longer than the %v this tool accepts", d.name, d.v, MaxWait)
		}
	}
	if c.Try && c.Wait > 0 {
		return configErrorf("--try and --wait %v exclude each other", c.Wait)
	}
	return nil
}

// validatePool checks --holders and --once-per-slot.
func (c *Config) validatePool() error {
	if c.Holders < 1 || c.Holders > backends.MaxHolders {
		return configErrorf("--holders %d: want 1-%d", c.Holders, backends.MaxHolders)
	}
	if c.OncePerSlot && c.OnceKey == "" {
		return configErrorf("--once-per-slot needs --once-per or --once-key")
	}
	return nil
}
