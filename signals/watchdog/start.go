package watchdog

import (
	"errors"
	"syscall"
	"time"

	"golang.org/x/sys/unix"
)

// The command's start, in the watchdog.

// start forks and execs the command that the frame describes.
func (d *dog) start(f *Fields) {
	d.sig = syscall.Signal(f.U32())
	d.grace = time.Duration(f.I64())
	d.deadline = Instant(f.I64())
	path, argv, env := f.Str(), f.Strs(), f.Strs()
	if f.bad {
		d.send(NewFrame(MsgFailed).U32(uint32(unix.EINVAL)))
		return
	}
	d.log = d.logger().with(logAttrs(env)...)
	pid, pidfd, err := forkCommand(path, argv, env, d.cg)
	if err != nil && d.cg != nil {
		// clone3 into the cgroup may be refused where the cgroup was
		// made (seccomp filters clone3 in some container runtimes):
		// the command runs without it if it runs at all.
		if pid, pidfd, err = forkCommand(path, argv, env, nil); err == nil {
			d.logger().Warn("the command could not be started in its cgroup; the watchdog guards it as a subreaper", "cgroup", d.cg.dir)
			d.removeCgroup()
			d.cg, d.guard, d.detail = nil, GuardSubreaper, "clone3 into "+d.detail+" refused"
		}
	}
	if err != nil {
		var errno syscall.Errno
		if !errors.As(err, &errno) {
			errno = syscall.EINVAL
		}
		if d.cg != nil {
			d.removeCgroup()
			d.cg = nil
		}
		d.send(NewFrame(MsgFailed).U32(uint32(errno)))
		return
	}
	d.started, d.pid, d.pidfd = true, pid, pidfd
	d.t = newTree(d.cg, pid)
	d.log = d.log.with("pid", pid)
	d.send(NewFrame(MsgStarted).U32(uint32(pid)).Str(d.guard).Str(d.detail))
}
