// Package takeover makes this process its command's watchdog when
// leaderrun re-executed itself as one (signals/watchdog), before the rest
// of the program is initialised.
//
// Import it, for its init alone, in every binary that runs commands:
// leaderrun and its companion, and the test binaries that start commands
// through package signals (which refuses to launch a watchdog from a
// binary without it). Its init runs as soon as its own few imports are
// initialised, before the stores' clients, whose package init the
// watchdog would otherwise pay for in every leading instance (see
// signals/watchdog's doc). In any other process it does nothing.
package takeover

import (
	"os"

	"github.com/leaderrun/leaderrun/signals/watchdog"
)

func init() {
	if watchdog.IsWatchdog(os.Args) {
		os.Exit(watchdog.Main())
	}
	watchdog.Installed = true
}
