package signals

import (
	"bufio"
	"encoding/json"
	"errors"
	"os"
	"sync"
	"syscall"
	"time"

	"github.com/leaderrun/leaderrun/signals/watchdog"
	"golang.org/x/sys/unix"
)

// link is leaderrun's end of its watchdog (protocol: signals/watchdog/wire.go):
// the process, and its socket. The Supervisor and the Child share it.
type link struct {
	proc *os.Process
	conn *os.File
	wmu  sync.Mutex // one order at a time
	// reports are the watchdog's, in order; closed once its socket closed
	// and it was reaped (a command it forked is then re-parented here).
	reports chan watchdog.Report
	reaped  chan struct{} // closed with reports
}

// newLink adopts w and reads its reports until its socket closes.
func newLink(w *launched) *link {
	l := &link{proc: w.proc, conn: w.conn, reports: make(chan watchdog.Report, 8), reaped: make(chan struct{})}
	go l.read()
	return l
}

// read hands on the watchdog's reports until its socket closes (or says
// something else), then reaps it.
func (l *link) read() {
	r := bufio.NewReaderSize(l.conn, watchdog.MaxReport)
	for {
		line, err := r.ReadSlice('\n')
		var rep watchdog.Report
		if err != nil || json.Unmarshal(line, &rep) != nil {
			break
		}
		l.reports <- rep
	}
	// Make sure it is gone, and reap it.
	_ = l.proc.Kill()
	_, _ = l.proc.Wait()
	untrack(l.proc.Pid)
	l.conn.Close()
	close(l.reports)
	close(l.reaped)
}

// sendTimeout bounds the write of an order: a frozen watchdog must not
// hold up leaderrun's loop. A deadline not delivered leaves it an earlier
// one; a stop, leaderrun's backstop.
const sendTimeout = time.Second

// send writes one order to the watchdog, with a descriptor for it to hold
// if hold is not nil, waiting at most timeout for the socket to take it.
func (l *link) send(o watchdog.Order, hold *os.File, timeout time.Duration) error {
	b, err := json.Marshal(o)
	if err != nil {
		return err
	}
	b = append(b, '\n')
	if len(b) > watchdog.MaxOrder {
		return syscall.E2BIG
	}
	l.wmu.Lock()
	defer l.wmu.Unlock()
	_ = l.conn.SetWriteDeadline(time.Now().Add(timeout))
	defer l.conn.SetWriteDeadline(time.Time{})
	rc, err := l.conn.SyscallConn()
	if err != nil {
		return err
	}
	var oob []byte
	if hold != nil {
		oob = unix.UnixRights(int(hold.Fd()))
	}
	for whole := len(b); len(b) > 0; {
		var n int
		var serr error
		werr := rc.Write(func(fd uintptr) bool {
			n, serr = unix.SendmsgN(int(fd), b, oob, nil, watchdog.SendNoSignal)
			return !errors.Is(serr, unix.EAGAIN)
		})
		if err := errors.Join(werr, serr); err != nil {
			if len(b) < whole {
				// Half an order is on its way: the protocol is broken,
				// and a watchdog that cannot be told anything guards
				// nothing. Its death ends the tree (see watchdogGone).
				_ = l.proc.Kill()
			}
			return err
		}
		b, oob = b[n:], nil
	}
	return nil
}

// wake sends SIGCONT to the watchdog: one that is stopped (a SIGSTOP of
// its group) would sit on what it was just sent.
func (l *link) wake() { _ = l.proc.Signal(syscall.SIGCONT) }

// dismissTimeout bounds the wait for a dismissed watchdog to go.
const dismissTimeout = 2 * time.Second

// dismiss tells the watchdog that nothing more will come (before the
// start: that it is not needed; it removes its cgroup and exits), and
// waits until it is reaped; one that does not go at once is killed.
func (l *link) dismiss() {
	if rc, err := l.conn.SyscallConn(); err == nil {
		_ = rc.Control(func(fd uintptr) { _ = unix.Shutdown(int(fd), unix.SHUT_WR) })
	}
	l.wake()
	timeout := time.After(dismissTimeout)
	for {
		select {
		case _, ok := <-l.reports: // none is expected any more
			if !ok {
				<-l.reaped
				return
			}
		case <-timeout:
			_ = l.proc.Kill()
			timeout = nil
		}
	}
}
