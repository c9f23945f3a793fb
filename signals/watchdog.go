package signals

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"os"
	"os/signal"
	"runtime"
	"strconv"
	"strings"
	"syscall"
	"time"

	"golang.org/x/sys/unix"
)

// The watchdog is this binary re-executed (the same file, so the same
// pages in memory) with watchdogArg as its first argument. leaderrun
// starts it while it campaigns; once it leads, the watchdog forks and
// execs the command, as its parent, and from then on it holds what must
// hold even if leaderrun is frozen, starved or killed (docs/safety.md,
// S10):
//
//   - the renew deadline: leaderrun sends it after every acknowledged
//     renewal; if it passes with no newer one, the watchdog starts the stop
//     sequence itself;
//   - the stop sequence: kill signal to the whole tree, SIGKILL at the
//     SIGKILL instant, whoever asked first (S9): it runs here, once;
//   - the tree: in a cgroup of its own where the kernel allows it, else
//     below the watchdog, a child subreaper, which every orphan of the tree
//     is re-parented to; when leaderrun dies, the whole tree gets SIGKILL at
//     once;
//   - a descriptor leaderrun hands it (the local backend's lock file),
//     until the tree is gone.
//
// It runs one loop on one locked OS thread (the command's parent-death
// signal belongs to the thread that forks it), polling its socket, a
// timerfd and the tree's descriptors. See wire.go for the protocol.

// watchdogArg, as the first argument, makes this binary the watchdog.
// The arguments after it are the log format, the log level and the kill
// signal.
const watchdogArg = "_leaderrun_watchdog"

// watchdogName is the watchdog's argv[0] and its name in ps.
const watchdogName = "leaderrun-dog"

// IsWatchdog reports whether args (os.Args) start this process as a
// watchdog. main must then call Watchdog, and nothing else.
func IsWatchdog(args []string) bool { return len(args) > 1 && args[1] == watchdogArg }

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
	log  *slog.Logger
	// format and level of the log; attrs, what every line says.
	format string
	level  slog.Level

	guard  string // the guard, for msgReady
	detail string
	cg     *cgroupTree // nil without a cgroup
	t      tree        // the tree, once started

	started, reaped bool
	pid, pidfd      int
	status          Status
	sig             syscall.Signal
	grace           time.Duration
	deadline        instant // 0: none

	// The stop sequence: killAt is 0 until it starts.
	killAt    instant
	stopSig   syscall.Signal
	killed    bool
	gaveUp    bool // SIGKILL did not end some processes within survivalBound
	signalled map[int]bool
	last      []member // the tree as the sequence last saw it
	gone      bool

	peerGone  bool // leaderrun's end closed without msgDone
	dismissed bool // msgDone
}

// Watchdog runs this process as a command's watchdog (see IsWatchdog) and
// returns its exit code.
func Watchdog(args []string) int {
	runtime.LockOSThread() // the command's parent-death signal is this thread's
	d := &dog{sock: 3, pidfd: -1, format: "text", signalled: map[int]bool{}}
	if len(args) >= 5 {
		d.format = args[2]
		_ = d.level.UnmarshalText([]byte(args[3]))
	}
	// Not ignored (a child would inherit SIG_IGN): caught and dropped.
	// These could reach the watchdog by mistake: a unit's KillMode=
	// control-group sends SIGTERM to every process of the unit.
	absorb := append([]os.Signal{syscall.SIGPIPE}, Forwarded...)
	if len(args) >= 5 {
		if n, err := strconv.Atoi(args[4]); err == nil {
			absorb = append(absorb, syscall.Signal(n))
		}
	}
	signal.Notify(make(chan os.Signal, 1), absorb...)
	_ = os.WriteFile("/proc/self/comm", []byte(watchdogName), 0)
	var st unix.Stat_t
	if err := unix.Fstat(d.sock, &st); err != nil || st.Mode&unix.S_IFMT != unix.S_IFSOCK {
		fmt.Fprintln(os.Stderr, "leaderrun: "+watchdogArg+" is leaderrun's own watchdog, not a command to run")
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
	d.guard, d.detail, d.cg = prepareGuard()
	d.send(newFrame(msgReady).str(d.guard).str(d.detail))
	return d.run()
}

// run is the loop: look at the tree, then wait for the socket, the
// alarm or the tree, until there is nothing left to guard.
func (d *dog) run() int {
	for {
		d.reap()
		d.step(clockNow())
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

// step advances the command's life from what the clock and the tree say.
func (d *dog) step(now instant) {
	if !d.started || d.gone {
		return
	}
	if d.gaveUp {
		if d.reaped {
			d.setGone()
		}
		return
	}
	if d.killAt == 0 {
		if d.deadline != 0 && now >= d.deadline {
			d.startStop(d.sig, now+instant(d.grace), stopDeadline)
		} else if !d.reaped {
			return
		} else if d.last = d.t.members(); len(d.last) == 0 {
			d.setGone()
			return
		} else {
			d.startStop(d.sig, now+instant(d.grace), stopLeftovers)
		}
	}
	d.last = d.t.members()
	if len(d.last) == 0 {
		if d.reaped {
			d.setGone()
		}
		return
	}
	switch {
	case !d.killed && now >= d.killAt:
		d.killed = true
		d.t.kill(d.last)
		d.send(newFrame(msgKilled))
		d.logger().Warn("still running at the end of --kill-grace; sent SIGKILL", "pgid", d.pid, "pids", pidsOf(d.last), "grace", d.grace)
	case d.killed && now >= d.killAt+instant(survivalBound):
		d.logger().Error("processes of the command survived SIGKILL; giving up on them", "pgid", d.pid, "pids", pidsOf(d.last))
		d.gaveUp = true
		if d.reaped {
			d.setGone()
		}
	case d.killed:
		// Whatever appeared since (a fork racing with the SIGKILL) goes
		// the same way at once.
		d.t.kill(d.last)
	default:
		d.signalEscapees(d.last)
	}
}

// startStop begins the stop sequence with sig, SIGKILL at killAt.
func (d *dog) startStop(sig syscall.Signal, killAt instant, why stopReason) {
	d.killAt, d.stopSig = killAt, sig
	if why == stopDeadline {
		d.logger().Error("renew deadline passed and leaderrun sent no newer one; the watchdog stops the child", "signal", Name(sig))
	}
	d.signalGroup(sig)
	d.last = d.t.members()
	d.signalEscapees(d.last)
	d.send(newFrame(msgStopping).u32(uint32(sig)).i64(int64(killAt)).u32(uint32(why)))
}

// signalGroup sends sig to the command's group, then SIGCONT so that a
// stopped group does not sit on it.
func (d *dog) signalGroup(sig syscall.Signal) {
	err := syscall.Kill(-d.pid, sig)
	if err == nil && sig != syscall.SIGKILL && sig != syscall.SIGCONT {
		_ = syscall.Kill(-d.pid, syscall.SIGCONT)
	}
	if err == nil {
		d.logger().Info("signalled child", "signal", Name(sig))
	}
}

// signalEscapees sends the sequence's signal to the members outside the
// command's group that have not had it yet: the group got it as a whole.
func (d *dog) signalEscapees(ms []member) {
	if d.killed {
		return
	}
	for _, m := range ms {
		if m.pgid == d.pid || d.signalled[m.pid] {
			continue
		}
		d.signalled[m.pid] = true
		_ = syscall.Kill(m.pid, d.stopSig)
		_ = syscall.Kill(m.pid, syscall.SIGCONT)
		d.logger().Info("signalled a process that left the command's group", "process", m.pid, "signal", Name(d.stopSig))
	}
}

// orphaned is leaderrun gone without a word: the whole tree gets SIGKILL
// at once (S4, S10).
func (d *dog) orphaned() {
	d.peerGone = true
	if !d.started || d.gone {
		return
	}
	ms := d.t.members()
	d.t.kill(ms)
	if d.killAt == 0 || d.killAt > clockNow() {
		d.killAt, d.stopSig = clockNow(), syscall.SIGKILL
	}
	d.killed = true
	d.logger().Error("leaderrun is gone; the watchdog killed the command's tree", "pids", pidsOf(ms), "guard", d.guard)
}

func (d *dog) setGone() {
	d.gone = true
	if d.cg != nil {
		d.cg.remove(d.logger())
	}
	d.send(newFrame(msgGone))
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
		d.cg.remove(d.logger())
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
			d.status = statusOf(syscall.WaitStatus(ws))
			if d.pidfd >= 0 {
				unix.Close(d.pidfd)
				d.pidfd = -1
			}
			d.send(newFrame(msgExited).u32(uint32(d.status.Code)).u32(uint32(d.status.Signal)))
		}
	}
}

// pollSet is what to wait for: the socket, the command's exit, the tree
// during the stop sequence, and the instant of the next step.
func (d *dog) pollSet() ([]unix.PollFd, instant) {
	events := int16(unix.POLLIN)
	if len(d.out) > 0 {
		events |= unix.POLLOUT
	}
	fds := append(d.pfds[:0], unix.PollFd{Fd: int32(d.sock), Events: events})
	if d.peerGone {
		fds[0].Fd = -1 // it would be ready for ever
	}
	if !d.started || d.gone {
		return fds, 0
	}
	var due instant
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
			due += instant(survivalBound)
		}
		tfds, tlimit := d.t.fds(d.last)
		fds = append(fds, tfds...)
		if tlimit >= 0 && (limit < 0 || tlimit < limit) {
			limit = tlimit
		}
	}
	if limit >= 0 {
		if soon := clockNow() + instant(limit); due == 0 || soon < due {
			due = max(soon, 1)
		}
	}
	d.pfds = fds
	return fds, due
}

// logger is the watchdog's log: the format and level of leaderrun's, and
// the lock, identity, backend, token and pid of the command once known.
func (d *dog) logger() *slog.Logger {
	if d.log != nil {
		return d.log
	}
	opts := &slog.HandlerOptions{Level: d.level}
	var h slog.Handler = slog.NewTextHandler(os.Stderr, opts)
	if d.format == "json" {
		h = slog.NewJSONHandler(os.Stderr, opts)
	}
	d.log = slog.New(h).With("watchdog", os.Getpid())
	return d.log
}

// receive reads what leaderrun sent and acts on every whole frame; the
// socket closing without msgDone is leaderrun's death.
func (d *dog) receive() {
	if d.peerGone {
		return
	}
	for {
		n, oobn, flags, _, err := unix.Recvmsg(d.sock, d.rbuf[:], d.oob[:], unix.MSG_DONTWAIT|msgCmsgCloexec)
		if errors.Is(err, unix.EINTR) {
			continue
		}
		if errors.Is(err, unix.EAGAIN) {
			return
		}
		if oobn > 0 {
			d.hold(d.oob[:oobn], flags)
		}
		if err != nil || n == 0 {
			if !d.dismissed {
				d.orphaned()
			}
			d.peerGone = true
			return
		}
		d.in = append(d.in, d.rbuf[:n]...)
		for {
			kind, body, rest, ok, ferr := nextFrame(d.in, maxStartFrame)
			if ferr != nil {
				d.logger().Error("the watchdog cannot read leaderrun's message", "error", ferr)
				d.orphaned()
				return
			}
			if !ok {
				break
			}
			d.in = rest
			f := fields{b: body}
			d.handle(kind, &f)
		}
		if len(d.in) == 0 {
			// Keep a small buffer; let a start frame's go.
			if cap(d.in) > 256 {
				d.in = nil
			} else {
				d.in = d.in[:0]
			}
		}
	}
}

// hold keeps the descriptors that came with a message.
func (d *dog) hold(oob []byte, flags int) {
	msgs, err := unix.ParseSocketControlMessage(oob)
	if err != nil {
		return
	}
	for _, m := range msgs {
		fds, err := unix.ParseUnixRights(&m)
		if err == nil {
			for _, fd := range fds {
				unix.CloseOnExec(fd) // where MSG_CMSG_CLOEXEC is unknown
				d.held = append(d.held, fd)
			}
		}
	}
	if flags&unix.MSG_CTRUNC != 0 {
		d.logger().Error("a descriptor from leaderrun was lost")
	}
}

// handle acts on one frame from leaderrun.
func (d *dog) handle(kind byte, f *fields) {
	switch kind {
	case msgStart:
		if !d.started {
			d.start(f)
		}
	case msgDeadline:
		if at := instant(f.i64()); !f.bad && d.killAt == 0 {
			d.deadline = at
		}
	case msgStop:
		sig := syscall.Signal(f.u32())
		if f.bad || !d.started || d.gone {
			return
		}
		if d.killAt == 0 {
			d.startStop(sig, clockNow()+instant(d.grace), stopAsked)
			return
		}
		// The sequence runs already (the deadline passed here first):
		// its SIGKILL instant stands; another signal is forwarded to the
		// group as leaderrun would forward it.
		if sig != d.stopSig && !d.killed {
			d.signalGroup(sig)
		}
		d.send(newFrame(msgStopping).u32(uint32(d.stopSig)).i64(int64(d.killAt)).u32(uint32(stopAsked)))
	case msgDone:
		d.dismissed = true
	}
}

// start forks and execs the command that the frame describes.
func (d *dog) start(f *fields) {
	d.sig = syscall.Signal(f.u32())
	d.grace = time.Duration(f.i64())
	d.deadline = instant(f.i64())
	path, argv, env := f.str(), f.strs(), f.strs()
	if f.bad {
		d.send(newFrame(msgFailed).u32(uint32(unix.EINVAL)))
		return
	}
	d.log = d.logger().With(logAttrs(env)...)
	pid, pidfd, err := forkCommand(path, argv, env, d.cg)
	if err != nil && d.cg != nil {
		// clone3 into the cgroup may be refused where the cgroup was
		// made (seccomp filters clone3 in some container runtimes):
		// the command runs without it if it runs at all.
		if pid, pidfd, err = forkCommand(path, argv, env, nil); err == nil {
			d.logger().Warn("the command could not be started in its cgroup; the watchdog guards it as a subreaper", "cgroup", d.cg.dir)
			d.cg.remove(d.logger())
			d.cg, d.guard = nil, guardSubreaper
		}
	}
	if err != nil {
		var errno syscall.Errno
		if !errors.As(err, &errno) {
			errno = syscall.EINVAL
		}
		d.send(newFrame(msgFailed).u32(uint32(errno)))
		return
	}
	d.started, d.pid, d.pidfd = true, pid, pidfd
	d.t = newTree(d.cg, pid)
	d.log = d.log.With("pid", pid)
	d.send(newFrame(msgStarted).u32(uint32(pid)))
}

// logAttrs are the log attributes that leaderrun's own lines carry,
// taken from the command's environment (see runner.childEnv).
func logAttrs(env []string) []any {
	var attrs []any
	for _, kv := range env {
		name, value, _ := strings.Cut(kv, "=")
		switch name {
		case "LEADERRUN_LOCK":
			attrs = append(attrs, "lock", value)
		case "LEADERRUN_IDENTITY":
			attrs = append(attrs, "identity", value)
		case "LEADERRUN_BACKEND":
			attrs = append(attrs, "backend", value)
		case "FENCE_TOKEN":
			if t, err := strconv.ParseUint(value, 10, 64); err == nil {
				attrs = append(attrs, "token", t)
			}
		}
	}
	return attrs
}

// send queues a frame for leaderrun; flush writes what the socket takes
// without blocking (the loop must never wait on a frozen leaderrun).
func (d *dog) send(f frame) {
	d.out = append(d.out, f.bytes()...)
	d.flush()
}

func (d *dog) flush() {
	for len(d.out) > 0 && !d.peerGone {
		n, err := unix.SendmsgN(d.sock, d.out, nil, nil, unix.MSG_DONTWAIT|msgNoSignal)
		if errors.Is(err, unix.EINTR) {
			continue
		}
		if err != nil {
			if !errors.Is(err, unix.EAGAIN) {
				d.out = nil // leaderrun is gone; receive will see it
			}
			return
		}
		d.out = d.out[n:]
	}
	if len(d.out) == 0 {
		d.out = nil
	}
}

// levelOf is the lowest level at which log writes, for the watchdog's
// own log.
func levelOf(log *slog.Logger) slog.Level {
	for _, l := range []slog.Level{slog.LevelDebug, slog.LevelInfo, slog.LevelWarn, slog.LevelError} {
		if log.Enabled(context.Background(), l) {
			return l
		}
	}
	return slog.LevelError + 4
}

// formatOf is "json" for a log that writes JSON, else "text".
func formatOf(log *slog.Logger) string {
	if _, ok := log.Handler().(*slog.JSONHandler); ok {
		return "json"
	}
	return "text"
}
