package watchdog

import (
	"syscall"
	"time"

	"github.com/leaderrun/leaderrun/signals/stop"
)

// The protocol between leaderrun and its watchdog: JSON lines on a stream
// socket (the watchdog's fd 3). leaderrun sends Orders; the watchdog sends
// Reports: the start, then what the stop sequence did and how the command
// exited. Closing the socket is the last word: the watchdog's exit, or
// leaderrun's (its death, while the tree runs). Instants are on the clock
// both share (Now).

// Order is one line from leaderrun; one field is set.
type Order struct {
	Start    *Start         `json:"start,omitempty"`
	Deadline stop.Instant   `json:"deadline,omitempty"` // a newer one (S2, S10)
	Stop     syscall.Signal `json:"stop,omitempty"`     // a stop request, with its signal (S9)
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
	Started  *Started      `json:"started,omitempty"`
	Failed   syscall.Errno `json:"failed,omitempty"` // the fork or exec failed; the watchdog exits
	Stopping *Stopping     `json:"stopping,omitempty"`
	Killed   stop.Instant  `json:"killed,omitempty"` // when it sent the tree SIGKILL
	Exited   *Exit         `json:"exited,omitempty"`
	Gone     bool          `json:"gone,omitempty"` // the tree is gone (or given up on); the watchdog exits
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
// (at most a few MiB for an exec); the rest are a few bytes.
const (
	MaxOrder  = 16 << 20
	MaxReport = 64 << 10
)
