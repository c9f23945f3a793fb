package signals

import (
	"encoding/binary"
	"errors"
	"math"
)

// The protocol between leaderrun and its watchdog: frames on a stream
// socket (the watchdog's fd 3). A frame is a little-endian uint32 n, then
// n bytes: a kind and its fields, each a little-endian uint32, an int64,
// or a string (a uint32 length and its bytes). Instants are nanoseconds
// on the clock both processes share (see clockNow).
const (
	// leaderrun → watchdog.

	// msgStart: fork and exec the command. Kill signal (u32), kill grace
	// in ns (i64), the first deadline (i64 instant, 0: none), path (str),
	// argc (u32) and argv (str...), envc (u32) and env (str...). A
	// descriptor for the watchdog to hold until the tree is gone may come
	// with it (SCM_RIGHTS): the local backend's lock file.
	msgStart = 'S'
	// msgDeadline: a newer deadline (i64 instant): the child must have had
	// the kill signal by then, unless a still newer one comes.
	msgDeadline = 'D'
	// msgStop: start the stop sequence with a signal (u32), SIGKILL the
	// grace after it; a sequence already running keeps its instant.
	msgStop = 'K'
	// msgDone: stand down; nothing of the tree runs any more, or nothing
	// was started.
	msgDone = 'Q'

	// watchdog → leaderrun.

	// msgStarted: the command runs, with this pid (u32), under this guard
	// (str) and its detail (str: the cgroup's path, or why there is
	// none).
	msgStarted = 'P'
	// msgFailed: the fork or the exec failed with this errno (u32).
	msgFailed = 'E'
	// msgStopping: the stop sequence runs: its signal (u32), the SIGKILL
	// instant (i64), and who started it (u32, a stopReason).
	msgStopping = 'T'
	// msgKilled: the watchdog sent SIGKILL to the tree at the end of the
	// grace.
	msgKilled = 'Z'
	// msgExited: the command was reaped: exit code (u32), signal (u32).
	msgExited = 'X'
	// msgGone: every process of the tree is gone.
	msgGone = 'G'
)

// stopReason says what started a stop sequence.
type stopReason uint32

const (
	// stopAsked: leaderrun asked for it (msgStop).
	stopAsked stopReason = iota
	// stopDeadline: the deadline passed with no newer one from leaderrun.
	stopDeadline
	// stopLeftovers: the command exited and left processes behind.
	stopLeftovers
)

// Frame size bounds: a start frame carries the command's argv and
// environment (the kernel takes at most a few MiB of them for an exec);
// the watchdog's frames are a few bytes.
const (
	maxStartFrame = 16 << 20
	maxReplyFrame = 64 << 10
)

var errFrame = errors.New("signals: malformed watchdog frame")

// frame builds one frame.
type frame []byte

func newFrame(kind byte) frame { return frame{0, 0, 0, 0, kind} }

func (f frame) u32(v uint32) frame { return binary.LittleEndian.AppendUint32(f, v) }

func (f frame) i64(v int64) frame { return binary.LittleEndian.AppendUint64(f, uint64(v)) }

func (f frame) str(s string) frame { return append(f.u32(uint32(len(s))), s...) }

func (f frame) strs(ss []string) frame {
	f = f.u32(uint32(len(ss)))
	for _, s := range ss {
		f = f.str(s)
	}
	return f
}

// bytes fills in the length and returns the frame to send.
func (f frame) bytes() []byte {
	binary.LittleEndian.PutUint32(f[:4], uint32(len(f)-4))
	return f
}

// nextFrame splits the first whole frame off buf: its kind and fields,
// and the rest of buf. ok is false while the frame is incomplete; err is
// set for a frame longer than limit or without a kind.
func nextFrame(buf []byte, limit int) (kind byte, fields, rest []byte, ok bool, err error) {
	if len(buf) < 4 {
		return 0, nil, buf, false, nil
	}
	n := binary.LittleEndian.Uint32(buf)
	if n == 0 || uint64(n) > uint64(limit) {
		return 0, nil, buf, false, errFrame
	}
	if uint64(len(buf)-4) < uint64(n) {
		return 0, nil, buf, false, nil
	}
	body := buf[4 : 4+n]
	return body[0], body[1:], buf[4+n:], true, nil
}

// fields reads a frame's fields in order; a short frame sets bad and
// yields zeros.
type fields struct {
	b   []byte
	bad bool
}

func (d *fields) u32() uint32 {
	if len(d.b) < 4 {
		d.bad = true
		return 0
	}
	v := binary.LittleEndian.Uint32(d.b)
	d.b = d.b[4:]
	return v
}

func (d *fields) i64() int64 {
	if len(d.b) < 8 {
		d.bad = true
		return 0
	}
	v := binary.LittleEndian.Uint64(d.b)
	d.b = d.b[8:]
	if v > math.MaxInt64 {
		// Instants and durations are never negative.
		d.bad = true
		return 0
	}
	return int64(v)
}

func (d *fields) str() string {
	n := d.u32()
	if d.bad || uint64(n) > uint64(len(d.b)) {
		d.bad = true
		return ""
	}
	s := string(d.b[:n])
	d.b = d.b[n:]
	return s
}

func (d *fields) strs() []string {
	n := d.u32()
	// Each string takes at least its length: a count beyond that is a lie.
	if d.bad || uint64(n) > uint64(len(d.b)/4) {
		d.bad = true
		return nil
	}
	ss := make([]string, n)
	for i := range ss {
		ss[i] = d.str()
	}
	return ss
}
