// Package command finds the command leaderrun is to run, as a shell would,
// and checks that it can be started, as the kernel would, before anything
// campaigns: a command that cannot start never takes the lock. Its errors
// say what a shell would say, and cmd maps them to exit 127 and 126.
package command

import (
	"errors"
	"fmt"
	"os"
	"os/exec"
	"strings"
	"syscall"
)

// Errors for a command that cannot be started. cmd maps them to 127 and 126
// as shells do.
var (
	ErrNotFound      = errors.New("command not found")
	ErrNotExecutable = errors.New("command not executable")
)

// StartError turns a failed fork and exec of path into what a shell would say.
func StartError(path string, err error) error {
	switch {
	case errors.Is(err, syscall.ENOENT):
		return &ExecError{Command: path, Reason: err.Error(), Err: ErrNotFound}
	case errors.Is(err, syscall.EACCES), errors.Is(err, syscall.EPERM),
		errors.Is(err, syscall.ENOEXEC), errors.Is(err, syscall.EISDIR):
		return &ExecError{Command: path, Reason: err.Error(), Err: ErrNotExecutable}
	}
	return fmt.Errorf("start %s: %w", path, err)
}

// ExecError is a command that cannot be run. It unwraps to ErrNotFound or
// ErrNotExecutable.
type ExecError struct {
	Command string
	Reason  string // as a shell would say it: "command not found", "permission denied"
	Err     error
}

func (e *ExecError) Error() string { return e.Command + ": " + e.Reason }
func (e *ExecError) Unwrap() error { return e.Err }

// Resolve finds the executable for name the way a shell would, and reports
// ErrNotFound (exit 127) or ErrNotExecutable (exit 126) before anything is
// started, so that a typo in a crontab line never takes leadership. An
// executable file is checked as the kernel would start it (checkImage): a
// binary it knows, or a script whose #! interpreter exists.
func Resolve(name string) (string, error) {
	notFound := &ExecError{Command: name, Reason: "command not found", Err: ErrNotFound}
	if name == "" {
		return "", notFound
	}
	path, err := exec.LookPath(name)
	if err == nil {
		return path, checkImage(path, 0)
	}
	if strings.Contains(name, "/") {
		fi, serr := os.Stat(name)
		switch {
		case serr != nil:
			return "", &ExecError{Command: name, Reason: "no such file", Err: ErrNotFound}
		case fi.IsDir():
			return "", &ExecError{Command: name, Reason: "is a directory", Err: ErrNotExecutable}
		default:
			return "", &ExecError{Command: name, Reason: "permission denied", Err: ErrNotExecutable}
		}
	}
	if errors.Is(err, exec.ErrNotFound) {
		// A match in PATH without the execute bit is "permission denied" to
		// a shell, not "not found".
		for _, dir := range strings.Split(os.Getenv("PATH"), ":") {
			if dir == "" {
				dir = "."
			}
			if fi, serr := os.Stat(dir + "/" + name); serr == nil && !fi.IsDir() {
				return "", &ExecError{Command: dir + "/" + name, Reason: "permission denied", Err: ErrNotExecutable}
			}
		}
	}
	return "", notFound
}
