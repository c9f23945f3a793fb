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

// MaxDuration bounds every lease-related duration (--lease-duration,
// --renew-deadline, --retry-period, --kill-grace): a day is longer than
// any store's lease needs to be, and with every term bounded the sums below
// cannot overflow.
const MaxDuration = 24 * time.Hour

// MaxWait bounds --wait, --min-hold and --once-per, so that no deadline
// computed from them can overflow.
const MaxWait = 366 * 24 * time.Hour

// validate checks everything Run depends on, once, before anything
// starts: the timings and how they relate, the lease duration against
// what the store accepts, the waits, the kill signal and the once-key.
func (c *Config) validate() error {
	if c.Backend == nil {
		return configErrorf("no store to campaign in")
	}
	if c.Child.Path == "" || len(c.Child.Args) == 0 {
		return configErrorf("no command given")
	}
	if err := validateTimings(c.LeaseDuration, c.RenewDeadline, c.RetryPeriod, c.Child.KillGrace); err != nil {
		return err
	}
	if chk, ok := c.Backend.(backends.LeaseDurationChecker); ok {
		if err := chk.CheckLeaseDuration(c.LeaseDuration); err != nil {
			return configErrorf("--lease-duration %v: %v", c.LeaseDuration, err)
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

// validateTimings checks how the timings relate, as client-go's elector
// does.
func validateTimings(lease, deadline, retry, grace time.Duration) error {
	for _, d := range []struct {
		name string
		v    time.Duration
	}{{"--lease-duration", lease}, {"--renew-deadline", deadline}, {"--retry-period", retry}, {"--kill-grace", grace}} {
		if d.v <= 0 {
			return configErrorf("%s must be greater than 0, got %v", d.name, d.v)
		}
		if d.v > MaxDuration {
			return configErrorf("%s %v is longer than the %v this tool accepts", d.name, d.v, MaxDuration)
		}
	}
	// Each term is at most a day, so these sums and products are far from
	// overflowing an int64 of nanoseconds.
	if lease <= deadline+grace {
		return configErrorf("--lease-duration (%v) must be greater than --renew-deadline (%v) + --kill-grace (%v), "+
			"or the child could outlive the lease", lease, deadline, grace)
	}
	if 5*deadline <= 6*retry {
		return configErrorf("--renew-deadline (%v) must be greater than 1.2 × --retry-period (%v)", deadline, retry)
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

// validateGrantedTTL checks the TTL the store actually granted for the
// lease duration asked, which may differ from it (etcd rounds to whole
// seconds; ZooKeeper's TTL leaves out how much earlier than its session
// timeout an ensemble may expire a session). Zero means the lease never
// expires by itself. The message says which lease duration would do, on
// the assumption that the store grants what is asked less the same
// amount, as it does unless it caps the TTL.
func validateGrantedTTL(ttl, asked, deadline, grace time.Duration) error {
	if ttl > 0 && ttl <= deadline+grace {
		return configErrorf("the store granted a lease of %v for --lease-duration %v, not more than --renew-deadline (%v) + --kill-grace (%v): "+
			"raise --lease-duration above %v, or lower --renew-deadline or --kill-grace", ttl, asked, deadline, grace, asked+deadline+grace-ttl)
	}
	return nil
}
