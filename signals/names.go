package signals

import (
	"fmt"
	"strconv"
	"strings"
	"syscall"

	"github.com/leaderrun/leaderrun/signals/watchdog"
)

// Parse reads a signal as SIGTERM, TERM, term or 15.
func Parse(s string) (syscall.Signal, error) {
	if n, err := strconv.Atoi(s); err == nil {
		if n <= 0 || n > 64 {
			return 0, fmt.Errorf("invalid signal %q: number out of range 1-64", s)
		}
		return syscall.Signal(n), nil
	}
	name := "SIG" + strings.TrimPrefix(strings.ToUpper(s), "SIG")
	for sig := syscall.Signal(1); sig <= 64; sig++ {
		if Name(sig) == name {
			return sig, nil
		}
	}
	return 0, fmt.Errorf("invalid signal %q: want a name such as SIGTERM, or a number", s)
}

// Name is a signal's conventional name, SIGTERM rather than "terminated".
func Name(sig syscall.Signal) string { return watchdog.Name(sig) }

// Forwarded are the signals that leaderrun passes on to the command's
// process group as they are (S6). SIGTERM and SIGINT also start the stop
// sequence in the runner. The watchdog catches and drops them.
var Forwarded = watchdog.Forwarded
