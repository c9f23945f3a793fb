package watchdog

import (
	"errors"
	"fmt"
	"os"
	"os/signal"
	"runtime"
	"syscall"
	"time"

	"golang.org/x/sys/unix"
)

// Arg, as the first argument, makes this binary the watchdog. What it
// needs to know before the command starts comes in a MsgConfig.
const Arg = "_leaderrun_watchdog"

// ProcessName is the watchdog's argv[0] and its name in ps.
const ProcessName = "leaderrun-dog"

// init makes any binary that links this package its own watchdog when it
// is re-executed as one (Launch): leaderrun, and every test binary that
// starts a command, with no TestMain to remember. It runs before main and
// before the packages that import this one are initialised, and early
// among the rest: see doc.go. In any other process whose arguments look
// like a run, it launches the watchdog (launchEarly).
func init() {
	if isWatchdog(os.Args) {
		os.Exit(watchdog())
	}
	launchEarly(os.Args)
}

// isWatchdog reports whether args (os.Args) start this process as a
// watchdog.
func isWatchdog(args []string) bool { return len(args) > 1 && args[1] == Arg }

// survivalBound is how long the stop sequence waits for processes that
// SIGKILL has not ended (stuck in uninterruptible sleep) before it gives up
// on them and says so.
const survivalBound = 5 * time.Second

// dog is the watchdog's state.
type dog struct {
	sock int    // the socket to leaderrun
	in   []byte // what was read of it, not yet a whole frame
	out  []byte // what is still to be written to it
	// The loop's buffers, reused: an idle watchdog allocates nothing, so
	// that its collector never runs and its heap stays what package
	// initialisation left.
	rbuf [4096]byte
	oob  [64]byte
	pfds []unix.PollFd
	held []int // descriptors held until the tree is gone
	al   *alarm
	log  *logger
	// format and level of leaderrun's log, which the watchdog's follows
	// (MsgConfig).
	format string
	level  int
	absorb chan os.Signal // the signals caught and dropped

	guard  string // the guard, for MsgStarted
	detail string
	cg     *cgroupTree // nil without a cgroup
	t      tree        // the tree, once started

	started, reaped bool
	pid, pidfd      int
	sig             syscall.Signal
	grace           time.Duration
	deadline        Instant // 0: none

	// The stop sequence: killAt is 0 until it starts.
	killAt    Instant
	stopSig   syscall.Signal
	killed    bool
	gaveUp    bool // SIGKILL did not end some processes within survivalBound
	signalled map[int]bool
	last      []member // the tree as the sequence last saw it
	gone      bool

	peerGone  bool // leaderrun's end closed without MsgDone
	dismissed bool // MsgDone
}

// watchdog runs this process as a command's watchdog and returns its exit
// code.
func watchdog() int {
	runtime.LockOSThread() // the command's parent-death signal is this thread's
	d := &dog{sock: 3, pidfd: -1, format: "text", level: levelError, absorb: make(chan os.Signal, 1), signalled: map[int]bool{}}
	// Not ignored (a child would inherit SIG_IGN): caught and dropped.
	// These could reach the watchdog by mistake: a unit's KillMode=
	// control-group sends SIGTERM to every process of the unit. The kill
	// signal joins them with MsgConfig.
	signal.Notify(d.absorb, append([]os.Signal{syscall.SIGPIPE}, Forwarded...)...)
	_ = os.WriteFile("/proc/self/comm", []byte(ProcessName), 0)
	var st unix.Stat_t
	if err := unix.Fstat(d.sock, &st); err != nil || st.Mode&unix.S_IFMT != unix.S_IFSOCK {
		fmt.Fprintln(os.Stderr, "leaderrun: "+Arg+" is leaderrun's own watchdog, not a command to run")
		return 64
	}
	unix.CloseOnExec(d.sock)
	if err := unix.SetNonblock(d.sock, true); err != nil {
		return 70
	}
	al, err := newAlarm()
	if err != nil {
		d.logger().Error("the watchdog has no timer", "error", err)
		return 70
	}
	d.al = al
	// Prepared now, while leaderrun connects and campaigns: winning the
	// lock is then followed by nothing but the command's fork and exec.
	d.guard, d.detail, d.cg = prepareGuard()
	return d.run()
}

// run is the loop: look at the tree, then wait for the socket, the
// alarm or the tree, until there is nothing left to guard.
func (d *dog) run() int {
	for {
		d.reap()
		d.step(Now())
		if d.finished() {
			d.finish()
			return 0
		}
		d.flush()
		fds, due := d.pollSet()
		if err := d.al.wait(fds, due); err != nil {
			// Nothing could be guarded any more: end it all.
			d.logger().Error("the watchdog cannot wait; killing the command's tree", "error", err)
			d.orphaned()
			d.finish()
			return 70
		}
		d.receive()
	}
}

// finished reports whether there is nothing left to guard, or nobody to
// guard it for.
func (d *dog) finished() bool {
	return (!d.started || d.gone) && (d.dismissed || d.peerGone)
}

// finish lets go of the held descriptors. After leaderrun's death they
// are the last of their open files: their locks are dropped explicitly
// first (a flock goes with the last descriptor, and a waiter woken by the
// close must find the lock free). Dismissed, leaderrun still holds the
// lock and releases it itself.
func (d *dog) finish() {
	for _, fd := range d.held {
		if !d.dismissed {
			_ = unix.Flock(fd, unix.LOCK_UN)
		}
		unix.Close(fd)
	}
	if d.cg != nil && !d.gone {
		d.removeCgroup()
	}
	d.flush()
}

// reap collects the watchdog's exited children: the command, whose status
// it reports, and the orphans of its tree.
func (d *dog) reap() {
	for {
		var ws unix.WaitStatus
		pid, err := unix.Wait4(-1, &ws, unix.WNOHANG, nil)
		if errors.Is(err, unix.EINTR) {
			continue
		}
		if err != nil || pid <= 0 {
			return
		}
		if d.started && pid == d.pid && !d.reaped {
			d.reaped = true
			code, sig := ws.ExitStatus(), syscall.Signal(0)
			if ws.Signaled() {
				code, sig = 0, ws.Signal()
			}
			if d.pidfd >= 0 {
				unix.Close(d.pidfd)
				d.pidfd = -1
			}
			d.send(NewFrame(MsgExited).U32(uint32(code)).U32(uint32(sig)))
		}
	}
}

// pollSet is what to wait for: the socket, the command's exit, the tree
// during the stop sequence, and the instant of the next step.
func (d *dog) pollSet() ([]unix.PollFd, Instant) {
	events := int16(unix.POLLIN)
	if len(d.out) > 0 {
		events |= unix.POLLOUT
	}
	fds := append(d.pfds[:0], unix.PollFd{Fd: int32(d.sock), Events: events})
	d.pfds = fds
	if d.peerGone {
		fds[0].Fd = -1 // it would be ready for ever
	}
	if !d.started || d.gone {
		return fds, 0
	}
	var due Instant
	limit := time.Duration(-1)
	if !d.reaped {
		if d.pidfd >= 0 {
			fds = append(fds, unix.PollFd{Fd: int32(d.pidfd), Events: unix.POLLIN})
		} else {
			limit = 10 * time.Millisecond
		}
	}
	switch {
	case d.gaveUp:
	case d.killAt == 0:
		due = d.deadline
	default:
		due = d.killAt
		if d.killed {
			due += Instant(survivalBound)
		}
		tfds, tlimit := d.t.fds(d.last)
		fds = append(fds, tfds...)
		if tlimit >= 0 && (limit < 0 || tlimit < limit) {
			limit = tlimit
		}
	}
	if limit >= 0 {
		if soon := Now() + Instant(limit); due == 0 || soon < due {
			due = max(soon, 1)
		}
	}
	d.pfds = fds
	return fds, due
}
