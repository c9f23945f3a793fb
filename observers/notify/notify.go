// Package notify tells systemd what leaderrun is doing, through sd_notify:
// READY=1 once it is connected and campaigning, a STATUS= line that follows
// every leadership change, WATCHDOG=1 while things are healthy and
// STOPPING=1, once, when it begins to stop. Without NOTIFY_SOCKET it does
// nothing.
package notify

import (
	"context"
	"fmt"
	"log/slog"
	"os"
	"sync"
	"time"

	"github.com/coreos/go-systemd/v22/daemon"

	"github.com/leaderrun/leaderrun/backends"
	"github.com/leaderrun/leaderrun/runner"
)

// Notifier is a runner.Observer that speaks sd_notify.
type Notifier struct {
	lock   string
	status func(context.Context) (backends.Status, error)
	log    *slog.Logger
	// watchdog is half of WatchdogSec, zero when systemd does not watch.
	watchdog time.Duration

	mu       sync.Mutex
	led      bool          // Acquired was seen: a standby STATUS would be stale
	stopSent bool          // STOPPING=1 went out
	stop     chan struct{} // ends the standby heartbeat; nil when none runs
	wg       sync.WaitGroup

	// ctx ends the status query of describeLeader when Close is called.
	ctx    context.Context
	cancel context.CancelFunc
}

// New returns a Notifier, or nil when leaderrun does not run under systemd
// with Type=notify (no NOTIFY_SOCKET). status, if not nil, is asked once
// when campaigning starts so that STATUS names the current leader.
func New(lock string, status func(context.Context) (backends.Status, error), log *slog.Logger) *Notifier {
	if os.Getenv("NOTIFY_SOCKET") == "" {
		return nil
	}
	n := &Notifier{lock: lock, status: status, log: log}
	n.ctx, n.cancel = context.WithCancel(context.Background())
	if iv, err := daemon.SdWatchdogEnabled(false); err == nil && iv > 0 {
		n.watchdog = iv / 2
	}
	return n
}

// WatchdogInterval is how often WATCHDOG=1 is due, zero if systemd does not
// watch this service.
func (n *Notifier) WatchdogInterval() time.Duration { return n.watchdog }

func (n *Notifier) send(state string) {
	if _, err := daemon.SdNotify(false, state); err != nil {
		n.log.Warn("sd_notify failed", "state", state, "error", err)
	}
}

// Observe implements runner.Observer.
func (n *Notifier) Observe(e runner.Event) {
	switch e.Kind {
	case runner.Campaigning:
		n.send("READY=1\nSTATUS=standby; waiting for lock " + n.lock)
		n.startHeartbeat()
		n.describeLeader()
	case runner.Acquired:
		n.stopHeartbeat()
		n.mu.Lock()
		n.led = true
		n.mu.Unlock()
		n.send(fmt.Sprintf("STATUS=leading with token %d", e.Token))
	case runner.ChildStarted:
		n.send(fmt.Sprintf("STATUS=leading with token %d; command running as pid %d", e.Token, e.Pid))
	case runner.Renewed:
		if n.watchdog > 0 {
			// Only an acknowledged renewal feeds the watchdog: a leader
			// that cannot reach its store is not healthy.
			n.send("WATCHDOG=1")
		}
	case runner.Lost:
		n.send(n.stopping() + fmt.Sprintf("STATUS=leadership lost (token %d): %v; stopping the command", e.Token, e.Err))
	case runner.Stopping:
		n.send(n.stopping() + "STATUS=stopping the command")
	case runner.Stalled:
		n.send(n.stopping() + fmt.Sprintf("STATUS=%v; stopping the command", e.Err))
	case runner.ChildExited:
		n.send(fmt.Sprintf("STATUS=command exited (%v); releasing lock %s", e.Status, n.lock))
	case runner.Released:
		n.send(n.stopping() + "STATUS=released lock " + n.lock)
	}
}

// stopping returns "STOPPING=1\n" the first time it is called and "" after:
// systemd is told once that leaderrun is shutting down, at the first of
// leadership lost, the stop of the command on a signal or for want of
// progress, or the lock released (after the command exited by itself);
// each of these ends the run.
func (n *Notifier) stopping() string {
	n.mu.Lock()
	defer n.mu.Unlock()
	if n.stopSent {
		return ""
	}
	n.stopSent = true
	return "STOPPING=1\n"
}

// describeLeader puts the current leader into STATUS, in the background:
// a slow store must not hold up the campaign.
func (n *Notifier) describeLeader() {
	if n.status == nil {
		return
	}
	n.wg.Add(1)
	go func() {
		defer n.wg.Done()
		ctx, cancel := context.WithTimeout(n.ctx, 5*time.Second)
		defer cancel()
		st, err := n.status(ctx)
		// A lock held with no holder recorded yet is a grant in progress,
		// often our own: nothing to name.
		if err != nil || !st.Held || st.Identity == "" {
			return
		}
		// Under mu, which Acquired takes before it says "leading": this
		// line cannot come after that one (or after a loss) and leave
		// systemctl status showing a leader as a standby.
		n.mu.Lock()
		defer n.mu.Unlock()
		if !n.led {
			n.send(fmt.Sprintf("STATUS=standby; leader is %s (token %d)", st.Identity, st.Token))
		}
	}()
}

// startHeartbeat feeds the watchdog while waiting: a standby has no
// renewals, but a live campaign is healthy.
func (n *Notifier) startHeartbeat() {
	if n.watchdog == 0 {
		return
	}
	n.mu.Lock()
	defer n.mu.Unlock()
	if n.stop != nil {
		return
	}
	stop := make(chan struct{})
	n.stop = stop
	n.wg.Add(1)
	go func() {
		defer n.wg.Done()
		t := time.NewTicker(n.watchdog)
		defer t.Stop()
		n.send("WATCHDOG=1")
		for {
			select {
			case <-stop:
				return
			case <-t.C:
				n.send("WATCHDOG=1")
			}
		}
	}()
}

func (n *Notifier) stopHeartbeat() {
	n.mu.Lock()
	defer n.mu.Unlock()
	if n.stop != nil {
		close(n.stop)
		n.stop = nil
	}
}

// Close stops the background work and waits for it.
func (n *Notifier) Close() {
	n.cancel()
	n.stopHeartbeat()
	n.wg.Wait()
}
