package watchdog

import (
	"bytes"
	"encoding/json"
	"errors"

	"github.com/leaderrun/leaderrun/signals/stop"
	"golang.org/x/sys/unix"
)

// link is the watchdog's end of leaderrun's socket (wire.go): the orders
// read from it, the reports still to write, the descriptors that came
// with the start, and whether leaderrun's end has closed.
type link struct {
	sock int
	in   []byte // read, not yet a whole line
	out  []byte // still to write
	rbuf [4096]byte
	oob  [64]byte
	held []int // descriptors to hold until the tree is gone
	lost bool  // a descriptor that came with the start was lost
	// gone: leaderrun's end closed (or its orders make no sense):
	// nothing it sends will come any more.
	gone    bool
	started bool // the start was read
}

// receive reads what leaderrun sent and hands each order to handle. It
// returns an error for a line that is not an order; the link is then
// gone.
func (l *link) receive(handle func(Order)) error {
	for !l.gone {
		n, err := l.read()
		if errors.Is(err, unix.EINTR) {
			continue
		}
		if errors.Is(err, unix.EAGAIN) {
			return nil
		}
		if err != nil || n == 0 {
			l.gone = true
			return nil
		}
		buf := append(l.in, l.rbuf[:n]...)
		rest := buf
		for {
			i := bytes.IndexByte(rest, '\n')
			if i < 0 && len(rest) > MaxOrder {
				l.gone = true
				return errors.New("an order longer than the longest start")
			}
			if i < 0 {
				break
			}
			var o Order
			if o.Deadline = deadlineOrder(rest[:i]); o.Deadline == 0 {
				if err := json.Unmarshal(rest[:i], &o); err != nil {
					l.gone = true
					return err
				}
			}
			rest = rest[i+1:]
			l.started = l.started || o.Start != nil
			handle(o)
		}
		// The rest of a line moves to the front of the kept buffer.
		l.in = buf[:copy(buf, rest)]
		if len(l.in) == 0 && cap(l.in) > 4096 {
			l.in = nil
		}
	}
	return nil
}

// read reads what the socket has: until the start with recvmsg (the lock
// file may come with it), then with read, which allocates nothing.
func (l *link) read() (int, error) {
	if l.started {
		return unix.Read(l.sock, l.rbuf[:])
	}
	n, oobn, flags, _, err := unix.Recvmsg(l.sock, l.rbuf[:], l.oob[:], unix.MSG_DONTWAIT|recvCloexec)
	if oobn > 0 {
		l.hold(l.oob[:oobn], flags)
	}
	return n, err
}

// deadlineOrder reads {"deadline":N}, the order sent at every renewal,
// without allocating (zero for any other line): json.Unmarshal allocates
// four times a line, and an idle watchdog would grow to the collector's
// 4 MiB minimum heap (measured: +218 KB anonymous in 600 renewals).
func deadlineOrder(line []byte) stop.Instant {
	digits, ok := bytes.CutPrefix(line, []byte(`{"deadline":`))
	if !ok || len(digits) < 2 || len(digits) > 19 || digits[len(digits)-1] != '}' {
		return 0
	}
	var n stop.Instant
	for _, c := range digits[:len(digits)-1] {
		if c < '0' || c > '9' {
			return 0
		}
		n = n*10 + stop.Instant(c-'0')
	}
	return n
}

// hold keeps the descriptors that came with a message.
func (l *link) hold(oob []byte, flags int) {
	msgs, _ := unix.ParseSocketControlMessage(oob)
	for _, m := range msgs {
		fds, _ := unix.ParseUnixRights(&m)
		for _, fd := range fds {
			unix.CloseOnExec(fd) // where MSG_CMSG_CLOEXEC is unknown
			l.held = append(l.held, fd)
		}
	}
	if flags&unix.MSG_CTRUNC != 0 {
		l.lost = true
	}
}

// send queues a report; flush writes what the socket takes without
// blocking: the watchdog never waits on a frozen leaderrun.
func (l *link) send(r Report) {
	b, err := json.Marshal(r)
	if err != nil || l.gone {
		return
	}
	l.out = append(append(l.out, b...), '\n')
	l.flush()
}

func (l *link) flush() {
	for len(l.out) > 0 && !l.gone {
		n, err := unix.SendmsgN(l.sock, l.out, nil, nil, unix.MSG_DONTWAIT|SendNoSignal)
		if errors.Is(err, unix.EINTR) {
			continue
		}
		if err != nil {
			if !errors.Is(err, unix.EAGAIN) {
				l.out = nil // leaderrun is gone; receive will see it
			}
			return
		}
		l.out = l.out[n:]
	}
	if len(l.out) == 0 {
		l.out = nil
	}
}

// pollFd is what to wait for on the socket (nothing once it is gone).
func (l *link) pollFd() unix.PollFd {
	if l.gone {
		return unix.PollFd{Fd: -1}
	}
	events := int16(unix.POLLIN)
	if len(l.out) > 0 {
		events |= unix.POLLOUT
	}
	return unix.PollFd{Fd: int32(l.sock), Events: events}
}
