package signals

import (
	"syscall"

	"github.com/leaderrun/leaderrun/signals/watchdog"
)

// Parse reads a signal as SIGTERM, TERM, term or 15.
func Parse(s string) (syscall.Signal, error) { return watchdog.Parse(s) }

// Name is a signal's conventional name, SIGTERM rather than "terminated".
func Name(sig syscall.Signal) string { return watchdog.Name(sig) }

// Forwarded are the signals that leaderrun passes on to the command's
// process group as they are (S6). SIGTERM and SIGINT also start the stop
// sequence in the runner. The watchdog catches and drops them.
var Forwarded = watchdog.Forwarded
