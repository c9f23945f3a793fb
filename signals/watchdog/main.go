package watchdog

import (
	"fmt"
	"os"
	"os/signal"
	"runtime"
	"syscall"

	"github.com/leaderrun/leaderrun/signals/stop"
	"golang.org/x/sys/unix"
)

// Arg, as the first argument, makes this binary the watchdog (see
// package takeover); ProcessName is then its argv[0] and its name in ps.
const (
	Arg         = "_leaderrun_watchdog"
	ProcessName = "leaderrun-dog"
)

// Installed is set by package takeover, whose init makes a binary its own
// watchdog: a binary without it cannot be re-executed as one.
var Installed bool

// IsWatchdog reports whether args (os.Args) start this process as a
// watchdog.
func IsWatchdog(args []string) bool { return len(args) > 1 && args[1] == Arg }

// dog is the watchdog's state, by concept: the link to leaderrun, the
// command and its guard, the stop sequence and what it is fed, the
// keeper, the log.
type dog struct {
	link     link
	guard    guard
	cmd      command
	seq      stop.Sequence
	deadline stop.Instant
	stops    []syscall.Signal
	members  func() []stop.Member // d.cmd.members, bound once
	// orphaned: leaderrun went away while the tree ran.
	orphaned bool
	keeper   keeper
	alarm    *alarm
	log      *logger
	absorb   chan os.Signal // the signals caught and dropped
	pfds     []unix.PollFd  // reused: an idle watchdog allocates little
}

// Main runs this process as a command's watchdog and returns its exit
// code. Its socket to leaderrun is fd 3.
func Main() int {
	runtime.LockOSThread() // the command's parent-death signal is this thread's
	d := &dog{link: link{sock: 3}, cmd: command{pidfd: -1}, log: newLogger(false, levelError).with("watchdog", os.Getpid()), absorb: make(chan os.Signal, 1)}
	// Not ignored (a child would inherit SIG_IGN): caught and dropped.
	// These could reach the watchdog by mistake: a unit's KillMode=
	// control-group sends SIGTERM to every process of the unit. The kill
	// signal joins them with the start.
	signal.Notify(d.absorb, append([]os.Signal{syscall.SIGPIPE}, Forwarded...)...)
	_ = os.WriteFile("/proc/self/comm", []byte(ProcessName), 0)
	var st unix.Stat_t
	if err := unix.Fstat(d.link.sock, &st); err != nil || st.Mode&unix.S_IFMT != unix.S_IFSOCK {
		fmt.Fprintln(os.Stderr, "leaderrun: "+Arg+" is leaderrun's own watchdog, not a command to run")
		return 64
	}
	unix.CloseOnExec(d.link.sock)
	if err := unix.SetNonblock(d.link.sock, true); err != nil {
		return 70
	}
	al, err := newAlarm()
	if err != nil {
		d.log.Error("the watchdog has no timer", "error", err)
		return 70
	}
	d.alarm = al
	// Prepared while leaderrun campaigns: the lock won, only a fork is left.
	d.guard = prepareGuard()
	return d.run()
}

// run is the loop: feed the stop sequence and do what it says, then wait
// for the socket, the alarm or the tree, until nothing is left to guard.
func (d *dog) run() int {
	for {
		d.reap()
		wake, over := d.step()
		if over || !d.cmd.started && d.link.gone {
			d.finish()
			return 0
		}
		d.link.flush()
		if err := d.alarm.wait(d.pollSet(wake)); err != nil {
			// Nothing could be guarded any more: end it all.
			d.log.Error("the watchdog cannot wait; killing the command's tree", "error", err)
			d.link.gone = true
			d.step()
			d.finish()
			return 70
		}
		if err := d.link.receive(d.handle); err != nil {
			d.log.Error("the watchdog cannot read leaderrun's order; taking it for leaderrun's death", "error", err)
		}
		if d.link.gone && d.cmd.started && !d.cmd.over {
			d.orphaned = true
		}
	}
}

// handle acts on one order from leaderrun.
func (d *dog) handle(o Order) {
	switch {
	case o.Start != nil && !d.cmd.started && !d.cmd.over:
		d.start(o.Start)
	case o.Deadline > d.deadline:
		d.deadline = o.Deadline
	case o.Stop > 0 && d.cmd.started:
		d.stops = append(d.stops, o.Stop)
	}
}

// step does what the stop sequence says now, and returns when to ask
// again, and whether the watchdog's work is over.
func (d *dog) step() (stop.Instant, bool) {
	if !d.cmd.started {
		return 0, d.cmd.over
	}
	acts, wake := d.seq.Next(stop.Input{Now: Now(), Deadline: d.deadline, Stops: d.stops,
		Orphaned: d.link.gone, Exited: d.cmd.reaped, Members: d.members})
	d.stops = d.stops[:0]
	for _, a := range acts {
		d.act(a)
	}
	return wake, d.cmd.over
}

// act does one action of the stop sequence, logs and reports it.
func (d *dog) act(a stop.Action) {
	t := d.cmd.tree
	switch a.Kind {
	case stop.Signal:
		if a.Reason == stop.Deadline {
			d.log.Error("renew deadline passed and leaderrun sent no newer one; the watchdog stops the child", "signal", Name(a.Signal))
		}
		if a.Group && SignalGroup(d.cmd.pid, a.Signal) == nil {
			d.log.Info("signalled child", "signal", Name(a.Signal))
		}
		for _, pid := range a.Pids {
			_ = syscall.Kill(pid, a.Signal)
			_ = syscall.Kill(pid, syscall.SIGCONT)
			d.log.Info("signalled a process that left the command's group", "process", pid, "signal", Name(a.Signal))
		}
		if a.Reason != 0 {
			d.link.send(Report{Stopping: &Stopping{KillAt: a.KillAt, Reason: a.Reason}})
		}
	case stop.Kill:
		t.kill(a.Pids)
		switch a.Reason {
		case stop.Orphaned:
			d.log.Error("leaderrun is gone; the watchdog killed the command's tree", "pids", a.Pids, "guard", d.guard.kind)
		case 0:
		default:
			d.link.send(Report{Killed: Now()})
			d.log.Warn("still running at the end of --kill-grace; sent SIGKILL", "pgid", d.cmd.pid, "pids", a.Pids, "grace", d.seq.Grace)
		}
	case stop.GiveUp:
		d.log.Error("processes of the command survived SIGKILL; giving up on them", "pgid", d.cmd.pid, "pids", a.Pids)
	case stop.Done:
		d.cmd.over = true
		d.guard.remove(d.log)
		d.link.send(Report{Gone: true})
	}
}

// finish lets go of the keeper, the cgroup and the held descriptors.
// After leaderrun's death these are the last of their open files: their
// locks are dropped first (a waiter woken by the close must find the lock
// free); otherwise leaderrun still holds the lock and releases it itself.
func (d *dog) finish() {
	d.keeper.dismiss()
	d.guard.remove(d.log)
	if d.link.lost {
		d.log.Error("a descriptor from leaderrun was lost")
	}
	for _, fd := range d.link.held {
		if d.orphaned {
			_ = unix.Flock(fd, unix.LOCK_UN)
		}
		unix.Close(fd)
	}
	d.link.flush()
}

// pollSet is what to wait for: the socket, the command's exit, and while
// the sequence runs, the tree; and until when.
func (d *dog) pollSet(due stop.Instant) ([]unix.PollFd, stop.Instant) {
	_, stopping := d.seq.Started()
	fds, limit := d.cmd.pollFds(append(d.pfds[:0], d.link.pollFd()), stopping)
	d.pfds = fds
	if limit >= 0 {
		if soon := Now().Add(limit); due == 0 || soon < due {
			due = max(soon, 1)
		}
	}
	return fds, due
}
