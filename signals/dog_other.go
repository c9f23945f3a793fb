//go:build !linux

package signals

import (
	"errors"
	"os/exec"
)

// machineWatchdog: there is no built-in watchdog here; the shell serves.
func machineWatchdog() (string, error) {
	return "", errors.New("no built-in watchdog for this platform")
}

// builtinDog: there is none.
func builtinDog(*exec.Cmd) bool { return false }
