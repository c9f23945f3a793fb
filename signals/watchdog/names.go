package watchdog

import (
	"os"
	"strconv"
	"syscall"
)

// byName are the signals with names leaderrun knows.
var byName = map[string]syscall.Signal{
	"HUP": syscall.SIGHUP, "INT": syscall.SIGINT, "QUIT": syscall.SIGQUIT,
	"KILL": syscall.SIGKILL, "USR1": syscall.SIGUSR1, "USR2": syscall.SIGUSR2,
	"TERM": syscall.SIGTERM, "ALRM": syscall.SIGALRM, "WINCH": syscall.SIGWINCH,
	"CONT": syscall.SIGCONT, "STOP": syscall.SIGSTOP,
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

// Forwarded are the signals leaderrun passes on to the command's group
// (signals.Forwarded); the watchdog catches and drops them.
var Forwarded = []os.Signal{
	syscall.SIGHUP, syscall.SIGINT, syscall.SIGQUIT, syscall.SIGTERM,
	syscall.SIGUSR1, syscall.SIGUSR2, syscall.SIGWINCH,
}
