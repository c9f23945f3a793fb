package signals

import (
	"errors"
	"syscall"
	"time"

	"golang.org/x/sys/unix"
)

// The command's start, in the watchdog.

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
			d.cg, d.guard, d.detail = nil, guardSubreaper, "clone3 into "+d.detail+" refused"
		}
	}
	if err != nil {
		var errno syscall.Errno
		if !errors.As(err, &errno) {
			errno = syscall.EINVAL
		}
		if d.cg != nil {
			d.cg.remove(d.logger())
			d.cg = nil
		}
		d.send(newFrame(msgFailed).u32(uint32(errno)))
		return
	}
	d.started, d.pid, d.pidfd = true, pid, pidfd
	d.t = newTree(d.cg, pid)
	d.log = d.log.With("pid", pid)
	d.send(newFrame(msgStarted).u32(uint32(pid)).str(d.guard).str(d.detail))
}
