package watchdog

import (
	"bytes"
	"errors"
	"syscall"
	"time"

	"github.com/leaderrun/leaderrun/signals/stop"
)

// The protocol between leaderrun and its watchdog: JSON lines on a stream
// socket (the watchdog's fd 3). leaderrun sends Orders: the start, newer
// deadlines, a stop request. The watchdog sends Reports: the command's
// start or why it failed, and then what the stop sequence did (its first
// signal, its SIGKILL, its end) and how the command exited. Closing the
// socket is the last word either way: the watchdog's exit, or leaderrun's
// (which, while the tree runs, the watchdog takes for leaderrun's death).
// Instants are on the clock both processes share (Now).

// Order is one line from leaderrun; one field is set.
type Order struct {
	Start *Start `json:"start,omitempty"`
	// Deadline is a newer deadline: the command must have had the kill
	// signal by then, unless a still newer one comes (S2, S10).
	Deadline stop.Instant `json:"deadline,omitempty"`
	// Stop starts the stop sequence with this signal; a sequence that
	// runs already keeps its SIGKILL instant (S9).
	Stop syscall.Signal `json:"stop,omitempty"`
}

// Start has the watchdog fork and exec the command. A descriptor for the
// watchdog to hold until the tree is gone may come with it (SCM_RIGHTS):
// the local backend's lock file.
type Start struct {
	Path     string         `json:"path"`
	Args     []string       `json:"args"`
	Env      []string       `json:"env"`
	Signal   syscall.Signal `json:"signal"`
	Grace    time.Duration  `json:"grace"`
	Deadline stop.Instant   `json:"deadline,omitempty"` // zero: none
	// The watchdog's log follows leaderrun's: slog's JSON or text
	// format, at its level.
	LogJSON  bool `json:"log_json,omitempty"`
	LogLevel int  `json:"log_level"`
}

// Report is one line from the watchdog; one field is set.
type Report struct {
	Started *Started `json:"started,omitempty"`
	// Failed: the fork or the exec failed with this errno; the watchdog
	// exits.
	Failed   syscall.Errno `json:"failed,omitempty"`
	Stopping *Stopping     `json:"stopping,omitempty"`
	// Killed: the watchdog sent SIGKILL to the tree at its instant.
	Killed bool  `json:"killed,omitempty"`
	Exited *Exit `json:"exited,omitempty"`
	// Gone: every process of the tree is gone (or was given up on); the
	// watchdog exits.
	Gone bool `json:"gone,omitempty"`
}

// Started: the command runs with this pid, under this guard (see
// GuardCgroup), whose detail is the cgroup's path or why there is none.
type Started struct {
	Pid    int    `json:"pid"`
	Guard  string `json:"guard"`
	Detail string `json:"detail"`
}

// Stopping: the stop sequence runs, for this reason, with SIGKILL at
// this instant.
type Stopping struct {
	KillAt stop.Instant `json:"kill_at"`
	Reason stop.Reason  `json:"reason"`
}

// Exit is how the command ended: its exit code, or the signal that
// killed it.
type Exit struct {
	Code   int            `json:"code,omitempty"`
	Signal syscall.Signal `json:"signal,omitempty"`
}

// Line length bounds: a start carries the command's argv and environment
// (the kernel takes at most a few MiB of them for an exec); everything
// else is a few bytes.
const (
	MaxOrder  = 16 << 20
	MaxReport = 64 << 10
)

var errLine = errors.New("watchdog: protocol line too long")

// NextLine splits the first whole line off buf. ok is false while the
// line is incomplete; err is set once it cannot end within limit.
func NextLine(buf []byte, limit int) (line, rest []byte, ok bool, err error) {
	i := bytes.IndexByte(buf, '\n')
	switch {
	case i >= 0 && i <= limit:
		return buf[:i], buf[i+1:], true, nil
	case i > limit || len(buf) > limit:
		return nil, buf, false, errLine
	}
	return nil, buf, false, nil
}
