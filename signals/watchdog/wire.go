package watchdog

import (
	"encoding/binary"
	"errors"
	"math"
)

// The protocol between leaderrun and its watchdog: frames on a stream
// socket (the watchdog's fd 3). A frame is a little-endian uint32 n, then
// n bytes: a kind and its fields, each a little-endian uint32, an int64,
// or a string (a uint32 length and its bytes). Instants are nanoseconds
// on the clock both processes share (see Now).
const (
	// leaderrun → watchdog.

	// MsgConfig, the first frame: the log's format (str: "text" or
	// "json") and level (str, as slog.Level.String writes it), and the
	// kill signal (u32), which the watchdog catches and drops as it does
	// the forwarded signals.
	MsgConfig = 'C'
	// MsgStart: fork and exec the command. Kill signal (u32), kill grace
	// in ns (i64), the first deadline (i64 instant, 0: none), path (str),
	// argc (u32) and argv (str...), envc (u32) and env (str...). A
	// descriptor for the watchdog to hold until the tree is gone may come
	// with it (SCM_RIGHTS): the local backend's lock file.
	MsgStart = 'S'
	// MsgDeadline: a newer deadline (i64 instant): the child must have had
	// the kill signal by then, unless a still newer one comes.
	MsgDeadline = 'D'
	// MsgStop: start the stop sequence with a signal (u32), SIGKILL the
	// grace after it; a sequence already running keeps its instant.
	MsgStop = 'K'
	// MsgDone: stand down; nothing of the tree runs any more, or nothing
	// was started.
	MsgDone = 'Q'

	// watchdog → leaderrun.

	// MsgStarted: the command runs, with this pid (u32), under this guard
	// (str) and its detail (str: the cgroup's path, or why there is
	// none).
	MsgStarted = 'P'
	// MsgFailed: the fork or the exec failed with this errno (u32).
	MsgFailed = 'E'
	// MsgStopping: the stop sequence runs: its signal (u32), the SIGKILL
	// instant (i64), and who started it (u32, a StopReason).
	MsgStopping = 'T'
	// MsgKilled: the watchdog sent SIGKILL to the tree at the end of the
	// grace.
	MsgKilled = 'Z'
	// MsgExited: the command was reaped: exit code (u32), signal (u32).
	MsgExited = 'X'
	// MsgGone: every process of the tree is gone.
	MsgGone = 'G'
)

// StopReason says what started a stop sequence.
type StopReason uint32

const (
	// StopAsked: leaderrun asked for it (MsgStop).
	StopAsked StopReason = iota
	// StopDeadline: the deadline passed with no newer one from leaderrun.
	StopDeadline
	// StopLeftovers: the command exited and left processes behind.
	StopLeftovers
)

// frame size bounds: a start frame carries the command's argv and
// environment (the kernel takes at most a few MiB of them for an exec);
// the watchdog's frames are a few bytes.
const (
	MaxStartFrame = 16 << 20
	MaxReplyFrame = 64 << 10
)

var errFrame = errors.New("signals: malformed watchdog Frame")

// Frame builds one frame.
type Frame []byte

// NewFrame begins a frame of this kind; U32, I64, Str and Strs append its
// fields.
func NewFrame(kind byte) Frame { return Frame{0, 0, 0, 0, kind} }

func (f Frame) U32(v uint32) Frame { return binary.LittleEndian.AppendUint32(f, v) }

func (f Frame) I64(v int64) Frame { return binary.LittleEndian.AppendUint64(f, uint64(v)) }

func (f Frame) Str(s string) Frame { return append(f.U32(uint32(len(s))), s...) }

func (f Frame) Strs(ss []string) Frame {
	f = f.U32(uint32(len(ss)))
	for _, s := range ss {
		f = f.Str(s)
	}
	return f
}

// Bytes fills in the length and returns the frame to send.
func (f Frame) Bytes() []byte {
	binary.LittleEndian.PutUint32(f[:4], uint32(len(f)-4))
	return f
}

// NextFrame splits the first whole frame off buf: its kind and fields,
// and the rest of buf. ok is false while the frame is incomplete; err is
// set for a frame longer than limit or without a kind.
func NextFrame(buf []byte, limit int) (kind byte, f Fields, rest []byte, ok bool, err error) {
	if len(buf) < 4 {
		return 0, Fields{}, buf, false, nil
	}
	n := binary.LittleEndian.Uint32(buf)
	if n == 0 || uint64(n) > uint64(limit) {
		return 0, Fields{}, buf, false, errFrame
	}
	if uint64(len(buf)-4) < uint64(n) {
		return 0, Fields{}, buf, false, nil
	}
	body := buf[4 : 4+n]
	return body[0], Fields{b: body[1:]}, buf[4+n:], true, nil
}

// Fields reads a frame's fields in order; a short frame makes Bad true
// and yields zeros.
type Fields struct {
	b   []byte
	bad bool
}

// Bad reports whether a field was missing or malformed.
func (d *Fields) Bad() bool { return d.bad }

func (d *Fields) U32() uint32 {
	if len(d.b) < 4 {
		d.bad = true
		return 0
	}
	v := binary.LittleEndian.Uint32(d.b)
	d.b = d.b[4:]
	return v
}

func (d *Fields) I64() int64 {
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

func (d *Fields) Str() string {
	n := d.U32()
	if d.bad || uint64(n) > uint64(len(d.b)) {
		d.bad = true
		return ""
	}
	s := string(d.b[:n])
	d.b = d.b[n:]
	return s
}

func (d *Fields) Strs() []string {
	n := d.U32()
	// Each string takes at least its length: a count beyond that is a lie.
	if d.bad || uint64(n) > uint64(len(d.b)/4) {
		d.bad = true
		return nil
	}
	ss := make([]string, n)
	for i := range ss {
		ss[i] = d.Str()
	}
	return ss
}
