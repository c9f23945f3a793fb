package signals

import (
	"log/slog"
	"os"
	"syscall"
	"time"
)

// Spec describes a command to run.
type Spec struct {
	// Path is the resolved executable (see Resolve); Args is the full argv,
	// Args[0] included.
	Path string
	Args []string
	// KillSignal is sent first when the command is stopped. Zero: SIGTERM.
	KillSignal syscall.Signal
	// KillGrace is how long the command's whole tree (its process group
	// and every descendant that left it) gets between the first kill signal
	// and SIGKILL: one deadline for all of them. Zero: 3 s.
	KillGrace time.Duration
	// Stdin, Stdout, Stderr default to leaderrun's own. The watchdog is
	// started with them, and gives them to the command; it writes its
	// own log lines to Stderr. A watchdog launched early (LaunchWatchdog)
	// has leaderrun's own, and is adopted only if they are these.
	Stdin          *os.File
	Stdout, Stderr *os.File
	// Log receives one line per signal sent; the watchdog writes its own
	// lines in the same format (JSON if Log's handler is slog's JSON
	// handler, else text) at the same level. Zero: slog.Default().
	Log *slog.Logger
}
