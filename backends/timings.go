package backends

import (
	"fmt"
	"time"
)

// Timings are how a lease is timed: one value, built from the command
// line, validated once (runner.New calls Validate) and handed to the
// runner, the driver and, in every Claim, the store.
type Timings struct {
	// LeaseDuration is the TTL asked of the store: how long after the
	// last acknowledged renewal another candidate may take over. Longer
	// means slower failover after a crash; shorter means a slow store or
	// a pause can cost leadership. It must exceed RenewDeadline +
	// KillGrace, so that the child is dead before the store lets the
	// lease go. Command line default: 15 s.
	LeaseDuration time.Duration
	// RenewDeadline is how long the runner tolerates no acknowledged
	// renewal, counted from the send time of the last one, before it
	// stops the child. Too short stops healthy jobs on a brief store
	// hiccup; too long leaves too little of the lease for the kill
	// grace. Command line default: 10 s.
	RenewDeadline time.Duration
	// RetryPeriod is the interval between renewals and between retries
	// of a failed one, and the pace at which a waiter looks at a store
	// that cannot tell it of changes. It must be well under RenewDeadline
	// (RenewDeadline > 1.2 × RetryPeriod) so that several attempts fit.
	// Command line default: 2 s.
	RetryPeriod time.Duration
	// KillGrace is the time from the kill signal to SIGKILL of the
	// child's whole tree; it counts against LeaseDuration. Command line
	// default: 3 s.
	KillGrace time.Duration
}

// The command line's defaults (README, "Flags of run").
const (
	DefaultLeaseDuration = 15 * time.Second
	DefaultRenewDeadline = 10 * time.Second
	DefaultRetryPeriod   = 2 * time.Second
	DefaultKillGrace     = 3 * time.Second
)

// DefaultTimings are the command line's defaults.
var DefaultTimings = Timings{DefaultLeaseDuration, DefaultRenewDeadline, DefaultRetryPeriod, DefaultKillGrace}

// MaxDuration bounds every timing: a day is longer than any store's
// lease needs to be, and with every term bounded the sums below cannot
// overflow.
const MaxDuration = 24 * time.Hour

// Validate checks each timing and how they relate, as client-go's elector
// does; its messages name the flags, since that is what a user fixes.
func (t Timings) Validate() error {
	for _, d := range []struct {
		name string
		v    time.Duration
	}{{"--lease-duration", t.LeaseDuration}, {"--renew-deadline", t.RenewDeadline},
		{"--retry-period", t.RetryPeriod}, {"--kill-grace", t.KillGrace}} {
		if d.v <= 0 {
			return fmt.Errorf("%s must be greater than 0, got %v", d.name, d.v)
		}
		if d.v > MaxDuration {
			return fmt.Errorf("%s %v is longer than the %v this tool accepts", d.name, d.v, MaxDuration)
		}
	}
	if t.LeaseDuration <= t.RenewDeadline+t.KillGrace {
		return fmt.Errorf("--lease-duration (%v) must be greater than --renew-deadline (%v) + --kill-grace (%v), "+
			"or the child could outlive the lease", t.LeaseDuration, t.RenewDeadline, t.KillGrace)
	}
	if 5*t.RenewDeadline <= 6*t.RetryPeriod {
		return fmt.Errorf("--renew-deadline (%v) must be greater than 1.2 × --retry-period (%v)", t.RenewDeadline, t.RetryPeriod)
	}
	return nil
}

// AttemptTimeout bounds one renewal, and every other single request of a
// campaign: max(RetryPeriod, RenewDeadline/3). A request stuck on a dead
// connection or a store that is electing a new leader must not use up the
// whole deadline: a retry over a fresh connection, or to another member,
// may well succeed. A store whose client retries within a request bounds
// each try to half of it, so that two fit.
func (t Timings) AttemptTimeout() time.Duration {
	return max(t.RetryPeriod, t.RenewDeadline/3)
}

// CheckGranted checks the TTL a store granted, which may differ from the
// lease duration asked (etcd rounds to whole seconds; ZooKeeper's leaves
// out how much earlier than its session timeout an ensemble may expire a
// session); zero never expires by itself. The message says which lease
// duration would do, assuming the store grants what is asked less the
// same amount, as it does unless it caps the TTL.
func (t Timings) CheckGranted(ttl time.Duration) error {
	if ttl > 0 && ttl <= t.RenewDeadline+t.KillGrace {
		return fmt.Errorf("the store granted a lease of %v for --lease-duration %v, not more than --renew-deadline (%v) + --kill-grace (%v): "+
			"raise --lease-duration above %v, or lower --renew-deadline or --kill-grace",
			ttl, t.LeaseDuration, t.RenewDeadline, t.KillGrace, t.LeaseDuration+t.RenewDeadline+t.KillGrace-ttl)
	}
	return nil
}
