package watchdog

import (
	"errors"
	"os"
	"os/signal"
	"syscall"
	"time"

	"github.com/leaderrun/leaderrun/signals/stop"
	"golang.org/x/sys/unix"
)

// guard is what keeps the command's tree together, decided before the
// start (docs/safety.md, "Which guarantee where").
type guard struct {
	kind    string      // GuardCgroup, GuardSubreaper or GuardGroup
	detail  string      // the cgroup's path, or why there is none
	cg      *cgroupTree // nil without a cgroup
	removed bool
}

// remove removes the command's cgroup, or says why it cannot.
func (g *guard) remove(log *logger) {
	if g.cg == nil || g.removed {
		return
	}
	g.removed = true
	if err := g.cg.remove(); err != nil {
		log.Warn("cannot remove the command's cgroup", "cgroup", g.cg.dir, "error", err)
	}
}

// command is the command once started: its pid (and process group), a
// pidfd that says when it exits, and its tree.
type command struct {
	pid, pidfd int
	started    bool
	reaped     bool // its status was collected (and reported)
	over       bool // nothing left to guard: the tree is gone, or the start failed
	tree       tree
	last       []stop.Member // the tree as last seen
}

// members reads the tree, for the stop sequence.
func (c *command) members() []stop.Member {
	c.last = c.tree.members()
	return c.last
}

// pollFds appends what says the command exited and, while the stop
// sequence runs, that its tree may have shrunk; limit is how soon to look
// again regardless (negative: no limit).
func (c *command) pollFds(fds []unix.PollFd, stopping bool) ([]unix.PollFd, time.Duration) {
	limit := time.Duration(-1)
	if !c.started || c.over {
		return fds, limit
	}
	if !c.reaped {
		if c.pidfd < 0 {
			limit = 10 * time.Millisecond
		} else {
			fds = append(fds, unix.PollFd{Fd: int32(c.pidfd), Events: unix.POLLIN})
		}
	}
	if stopping {
		tfds, tlimit := c.tree.fds(c.last)
		fds = append(fds, tfds...)
		if tlimit >= 0 && (limit < 0 || tlimit < limit) {
			limit = tlimit
		}
	}
	return fds, limit
}

// start forks and execs the command, in its cgroup if it has one, starts
// its keeper, and reports it started (or why not).
func (d *dog) start(s *Start) {
	d.log = newLogger(s.LogJSON, s.LogLevel).with(append([]any{"watchdog", os.Getpid()}, logAttrs(s.Env)...)...)
	if s.Signal > 0 {
		signal.Notify(d.absorb, s.Signal)
	}
	d.seq, d.deadline = stop.Sequence{Signal: s.Signal, Grace: s.Grace}, s.Deadline
	pid, pidfd, err := forkCommand(s, d.guard.cg)
	if err != nil && d.guard.cg != nil {
		// clone3 into the cgroup may be refused where the cgroup was
		// made (seccomp filters clone3 in some container runtimes):
		// the command runs without it if it runs at all.
		if pid, pidfd, err = forkCommand(s, nil); err == nil {
			d.log.Warn("the command could not be started in its cgroup; the watchdog guards it as a subreaper", "cgroup", d.guard.detail)
			d.guard.remove(d.log)
			d.guard = guard{kind: GuardSubreaper, detail: "clone3 into " + d.guard.detail + " refused"}
		}
	}
	if err != nil {
		var errno syscall.Errno
		if !errors.As(err, &errno) {
			errno = syscall.EINVAL
		}
		d.cmd.over = true
		d.link.send(Report{Failed: errno})
		return
	}
	d.cmd = command{pid: pid, pidfd: pidfd, started: true, tree: newTree(d.guard.cg, pid, d.keeper.is)}
	d.seq.Group, d.members = pid, d.cmd.members
	d.log = d.log.with("pid", pid)
	// Right after the command's fork: until then, its parent-death
	// signal is all the tree needs.
	d.keeper.start(d.guard.cg, pid, d.link.held, d.log)
	d.link.send(Report{Started: &Started{Pid: pid, Guard: d.guard.kind, Detail: d.guard.detail}})
}

// reap collects the watchdog's exited children: the command, whose
// status it reports, the orphans of its tree, and the keeper.
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
		switch {
		case d.cmd.started && pid == d.cmd.pid && !d.cmd.reaped:
			d.cmd.reaped = true
			if d.cmd.pidfd >= 0 {
				unix.Close(d.cmd.pidfd)
				d.cmd.pidfd = -1
			}
			exit := &Exit{Code: ws.ExitStatus()}
			if ws.Signaled() {
				exit = &Exit{Signal: ws.Signal()}
			}
			d.link.send(Report{Exited: exit})
		case d.keeper.is(pid):
			d.keeper.pid = 0
			d.log.Error("the command's keeper died", "keeper", pid)
		}
	}
}
