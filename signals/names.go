package signals

import (
	"fmt"
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
