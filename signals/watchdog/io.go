package watchdog

import (
	"errors"
	"os/signal"
	"syscall"

	"golang.org/x/sys/unix"
)

// The watchdog's side of the protocol (wire.go).

// receive reads what leaderrun sent and acts on every whole frame; the
// socket closing without MsgDone is leaderrun's death.
func (d *dog) receive() {
	if d.peerGone {
		return
	}
	for {
		n, err := d.read()
		if errors.Is(err, unix.EINTR) {
			continue
		}
		if errors.Is(err, unix.EAGAIN) {
			return
		}
		if err != nil || n == 0 {
			if !d.dismissed {
				d.orphaned()
			}
			d.peerGone = true
			return
		}
		buf := append(d.in, d.rbuf[:n]...)
		rest := buf
		for {
			kind, f, tail, ok, ferr := NextFrame(rest, MaxStartFrame)
			if ferr != nil {
				d.logger().Error("the watchdog cannot read leaderrun's message", "error", ferr)
				d.orphaned()
				return
			}
			if !ok {
				break
			}
			rest = tail
			d.handle(kind, &f)
		}
		// What is left of a frame moves to the front of the buffer,
		// which is kept, unless a start frame made it large.
		d.in = buf[:copy(buf, rest)]
		if len(d.in) == 0 && cap(d.in) > 4096 {
			d.in = nil
		}
	}
}

// read reads what the socket has. Until the command started, a
// descriptor may come with it (the lock file: see hold), so it is a
// recvmsg; then a plain read, which allocates nothing.
func (d *dog) read() (int, error) {
	if d.started {
		return unix.Read(d.sock, d.rbuf[:])
	}
	n, oobn, flags, _, err := unix.Recvmsg(d.sock, d.rbuf[:], d.oob[:], unix.MSG_DONTWAIT|recvCloexec)
	if oobn > 0 {
		d.hold(d.oob[:oobn], flags)
	}
	return n, err
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
func (d *dog) handle(kind byte, f *Fields) {
	switch kind {
	case MsgConfig:
		format, level, sig := f.Str(), f.Str(), syscall.Signal(f.U32())
		if f.bad || d.started {
			return
		}
		d.format, d.level, d.log = format, parseLevel(level), nil
		if sig > 0 {
			signal.Notify(d.absorb, sig)
		}
	case MsgStart:
		if !d.started {
			d.start(f)
		}
	case MsgDeadline:
		if at := Instant(f.I64()); !f.bad && d.killAt == 0 {
			d.deadline = at
		}
	case MsgStop:
		sig := syscall.Signal(f.U32())
		if f.bad || !d.started || d.gone {
			return
		}
		if d.killAt == 0 {
			d.startStop(sig, Now()+Instant(d.grace), StopAsked)
			return
		}
		// The sequence runs already (the deadline passed here first):
		// its SIGKILL instant stands; another signal is forwarded to the
		// group as leaderrun would forward it.
		if sig != d.stopSig && !d.killed {
			d.signalGroup(sig)
		}
		d.send(NewFrame(MsgStopping).U32(uint32(d.stopSig)).I64(int64(d.killAt)).U32(uint32(StopAsked)))
	case MsgDone:
		d.dismissed = true
	}
}

// send queues a frame for leaderrun; flush writes what the socket takes
// without blocking (the loop must never wait on a frozen leaderrun).
func (d *dog) send(f Frame) {
	d.out = append(d.out, f.Bytes()...)
	d.flush()
}

func (d *dog) flush() {
	for len(d.out) > 0 && !d.peerGone {
		n, err := unix.SendmsgN(d.sock, d.out, nil, nil, unix.MSG_DONTWAIT|SendNoSignal)
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
