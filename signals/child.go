package signals

import (
	"errors"
	"log/slog"
	"sync"
	"syscall"
	"time"

	"github.com/leaderrun/leaderrun/signals/watchdog"
)

// Child is a running command, as leaderrun sees it: the leader of its own
// process group (whose id is its pid), forked by its watchdog.
//
// Stopping it is one sequence on one clock (docs/safety.md, S9), and it
// runs in the watchdog: the first kill signal, whether leaderrun asked for
// it (Stop), the deadline passed in the watchdog (SetDeadline), or the
// command exited and left processes behind, is sent there and fixes the
// SIGKILL Instant for the whole tree, KillGrace later; a later request
// changes neither. Done closes only once every process of the tree is
// gone.
type Child struct {
	s   *Supervisor
	pid int
	log *slog.Logger

	// exited is closed once the command has been reaped; status is then
	// set.
	exited chan struct{}
	status Status

	mu sync.Mutex
	// killAt is the SIGKILL Instant of the stop sequence, zero until the
	// watchdog says it started; asked is set once leaderrun asked for it;
	// expired, if the watchdog started it because the deadline passed.
	killAt         time.Time
	asked, expired bool
	deadline       time.Time // the last deadline sent
	backstop       *time.Timer
	sigkilled      bool // the watchdog sent SIGKILL to the tree
	isDone         bool

	// done is closed once the tree is gone and the watchdog was told to
	// stand down; the watchdog is reaped once Wait returns.
	done chan struct{}
}

// Pid is the command's pid, which is also its process group id.
func (c *Child) Pid() int { return c.pid }

// Guard says what keeps the command's tree together in this run (see
// docs/safety.md): "cgroup" and its path, "subreaper" and why there is no
// cgroup, or "process group".
func (c *Child) Guard() string {
	c.s.mu.Lock()
	defer c.s.mu.Unlock()
	return c.s.guard + " (" + c.s.detail + ")"
}

// cgroupDir is the command's cgroup's path, "" without one.
func (c *Child) cgroupDir() string {
	c.s.mu.Lock()
	defer c.s.mu.Unlock()
	if c.s.guard != watchdog.GuardCgroup {
		return ""
	}
	return c.s.detail
}

// exit records how the command ended.
func (c *Child) exit(st Status) {
	select {
	case <-c.exited:
	default:
		c.status = st
		close(c.exited)
	}
}

// gone is the watchdog's word that the whole tree is gone: it is told to
// stand down, and Done closes.
func (c *Child) gone() {
	c.mu.Lock()
	if c.isDone {
		c.mu.Unlock()
		return
	}
	c.isDone = true
	if c.backstop != nil {
		c.backstop.Stop()
	}
	c.mu.Unlock()
	c.exit(Status{Code: 70}) // only if the watchdog said nothing of it
	c.s.standDown()
	untrack(c.pid)
	close(c.done)
}

// Done is closed once the command and everything it started are gone (S8)
// and the watchdog has been told to stand down; the watchdog may still be
// exiting (see Wait).
func (c *Child) Done() <-chan struct{} { return c.done }

// Status is how the command ended; call it after Done.
func (c *Child) Status() Status {
	<-c.done
	return c.status
}

// Wait blocks until Done and the watchdog has exited and been reaped, and
// returns how the command ended. Call it before returning, so that no
// process or goroutine of this package outlives the caller.
func (c *Child) Wait() Status {
	<-c.done
	<-c.s.reaped
	return c.status
}

// Signal sends sig to the command's whole process group, as it is: the
// signals leaderrun forwards (HUP, USR1, ...). To stop the command, use Stop.
func (c *Child) Signal(sig syscall.Signal) error {
	select {
	case <-c.done:
		return nil
	default:
	}
	err := syscall.Kill(-c.pid, sig)
	if sig != syscall.SIGKILL && sig != syscall.SIGCONT && err == nil {
		// A stopped group (SIGSTOP, or SIGTTIN from reading a terminal it
		// does not own) would sit on the signal until SIGKILL: wake it,
		// as systemd does.
		_ = syscall.Kill(-c.pid, syscall.SIGCONT)
	}
	c.log.Info("signalled child", "pid", c.pid, "signal", Name(sig))
	if errors.Is(err, syscall.ESRCH) {
		return nil
	}
	return err
}
