package watchdog

import (
	"fmt"
	"os"
	"strconv"
	"strings"
	"syscall"
)

var byName = map[string]syscall.Signal{
	"HUP": syscall.SIGHUP, "INT": syscall.SIGINT, "QUIT": syscall.SIGQUIT,
	"KILL": syscall.SIGKILL, "USR1": syscall.SIGUSR1, "USR2": syscall.SIGUSR2,
	"TERM": syscall.SIGTERM, "ALRM": syscall.SIGALRM, "WINCH": syscall.SIGWINCH,
	"CONT": syscall.SIGCONT, "STOP": syscall.SIGSTOP,
}

// Parse reads a signal as SIGTERM, TERM, term or 15.
func Parse(s string) (syscall.Signal, error) {
	if n, err := strconv.Atoi(s); err == nil {
		if n <= 0 || n > 64 {
			return 0, fmt.Errorf("invalid signal %q: number out of range 1-64", s)
		}
		return syscall.Signal(n), nil
	}
	name := strings.TrimPrefix(strings.ToUpper(s), "SIG")
	if sig, ok := byName[name]; ok {
		return sig, nil
	}
	return 0, fmt.Errorf("invalid signal %q: want a name such as SIGTERM, or a number", s)
}

// Name is a signal's conventional name, SIGTERM rather than "terminated".
func Name(sig syscall.Signal) string {
	for name, s := range byName {
		if s == sig {
			return "SIG" + name
		}
	}
	return strconv.Itoa(int(sig))
}

// Forwarded are the signals that leaderrun passes on to the command's
// process group as they are (S6). SIGTERM and SIGINT also start the stop
// sequence in the runner. The watchdog catches and drops them.
var Forwarded = []os.Signal{
	syscall.SIGHUP, syscall.SIGINT, syscall.SIGQUIT, syscall.SIGTERM,
	syscall.SIGUSR1, syscall.SIGUSR2, syscall.SIGWINCH,
}
