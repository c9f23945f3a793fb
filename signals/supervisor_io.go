package signals

import (
	"errors"
	"os"
	"syscall"
	"time"

	"github.com/leaderrun/leaderrun/signals/watchdog"
	"golang.org/x/sys/unix"
)

// leaderrun's side of the protocol with its watchdog (signals/watchdog/wire.go).

// reply is the watchdog's answer to MsgStart.
type reply struct {
	kind  byte // watchdog.MsgStarted, watchdog.MsgFailed, or 0: the socket closed
	value uint32
}

// read handles the watchdog's frames until its socket closes, then reaps
// it, and if a command still ran, ends the command's tree.
func (s *Supervisor) read() {
	var buf []byte
	tmp := make([]byte, 512)
	for {
		n, err := s.conn.Read(tmp)
		buf = append(buf, tmp[:n]...)
		for {
			kind, f, rest, ok, ferr := watchdog.NextFrame(buf, watchdog.MaxReplyFrame)
			if ferr != nil {
				err = ferr
				break
			}
			if !ok {
				break
			}
			buf = rest
			s.handle(kind, &f)
		}
		if err != nil {
			break
		}
	}
	s.reply(reply{})
	// The socket closes when the watchdog exits (or we killed it): make
	// sure, and reap it, so that a command it forked is re-parented to
	// this process before we look for it.
	_ = s.dog.Kill()
	_, _ = s.dog.Wait()
	untrack(s.dog.Pid)
	s.conn.Close()
	s.mu.Lock()
	c := s.child
	s.mu.Unlock()
	if c != nil {
		c.watchdogGone()
	}
}

// handle acts on one Frame from the watchdog.
func (s *Supervisor) handle(kind byte, f *watchdog.Fields) {
	s.mu.Lock()
	c := s.child
	s.mu.Unlock()
	switch kind {
	case watchdog.MsgStarted:
		pid, guard, detail := int(f.U32()), f.Str(), f.Str()
		s.mu.Lock()
		s.guard, s.detail = guard, detail
		s.mu.Unlock()
		if c != nil {
			// Tracked at once: should the watchdog die, the command is
			// re-parented to us, and waited for here, not by the
			// orphan reaper.
			track(pid)
			c.pid = pid
		}
		s.reply(reply{kind: kind, value: uint32(pid)})
	case watchdog.MsgFailed:
		s.reply(reply{kind: kind, value: f.U32()})
	case watchdog.MsgStopping:
		sig, at, why := syscall.Signal(f.U32()), watchdog.Instant(f.I64()), watchdog.StopReason(f.U32())
		if c != nil && !f.Bad() {
			c.stopping(sig, at, why)
		}
	case watchdog.MsgKilled:
		if c != nil {
			c.killed()
		}
	case watchdog.MsgExited:
		code, sig := int(f.U32()), syscall.Signal(f.U32())
		if c != nil && !f.Bad() {
			c.exit(Status{Code: code, Signal: sig})
		}
	case watchdog.MsgGone:
		if c != nil {
			c.gone()
		}
	}
}

// reply hands Start the watchdog's answer; there is one answer per
// start, and Start may have given up waiting.
func (s *Supervisor) reply(r reply) {
	select {
	case s.replies <- r:
	default:
	}
}

// sendTimeout bounds the write of a Frame: the watchdog reads all the
// time, and one that has not read for this long (frozen) must not hold
// up leaderrun's own loop. A deadline that is not delivered leaves the
// watchdog an earlier one; a stop, leaderrun's backstop SIGKILL.
const sendTimeout = time.Second

// send writes one Frame to the watchdog, with a descriptor for it to hold
// if hold is not nil, waiting at most timeout for the socket to take it.
func (s *Supervisor) send(f watchdog.Frame, hold *os.File, timeout time.Duration) error {
	s.wmu.Lock()
	defer s.wmu.Unlock()
	_ = s.conn.SetWriteDeadline(time.Now().Add(timeout))
	defer s.conn.SetWriteDeadline(time.Time{})
	rc, err := s.conn.SyscallConn()
	if err != nil {
		return err
	}
	b := f.Bytes()
	var oob []byte
	if hold != nil {
		oob = unix.UnixRights(int(hold.Fd()))
	}
	whole := len(b)
	for len(b) > 0 {
		var n int
		var serr error
		werr := rc.Write(func(fd uintptr) bool {
			n, serr = unix.SendmsgN(int(fd), b, oob, nil, watchdog.SendNoSignal)
			return !errors.Is(serr, unix.EAGAIN)
		})
		if err := errors.Join(werr, serr); err != nil {
			if len(b) < whole {
				// Half a Frame is on its way: the protocol is broken,
				// and a watchdog that cannot be told anything guards
				// nothing. Its death ends the tree (see read).
				_ = s.dog.Kill()
			}
			return err
		}
		b, oob = b[n:], nil
	}
	return nil
}
