package cmd

import (
	"fmt"
	"os"
	"path/filepath"
	"syscall"

	"github.com/urfave/cli/v2"

	"github.com/leaderrun/leaderrun/backends"
)

// A store whose client library would cost every leaderrun on a host more
// than it is worth (the AWS SDK's package init holds about 2 MiB in every
// process, leader and watchdog alike, whatever the store) lives in a
// companion binary: leaderrun with that backend linked in. leaderrun
// checks the store's flags, then replaces itself with the companion
// (execve, same arguments, same environment, same process), before it
// catches a signal or starts anything: what the user sees is one
// leaderrun process with the same flags, exit codes and output.

// companionPath is where the companion called name must be: beside the
// running binary, and nowhere else (not $PATH: a root leaderrun must not
// run whatever a user put first there).
func companionPath(name string) (string, error) {
	self, err := os.Executable()
	if err != nil {
		return "", err
	}
	if resolved, err := filepath.EvalSymlinks(self); err == nil {
		self = resolved
	}
	path := filepath.Join(filepath.Dir(self), name)
	fi, err := os.Stat(path)
	if err != nil {
		return "", fmt.Errorf("%s is not installed beside %s: install it from the same release as leaderrun "+
			"(go install github.com/leaderrun/leaderrun/cmd/%s@<version>)", name, self, name)
	}
	if me, err := os.Stat(self); err == nil && os.SameFile(me, fi) {
		// A leaderrun installed under the companion's name would hand
		// over to itself for ever.
		return "", fmt.Errorf("%s is a leaderrun without that backend, not the companion binary", path)
	}
	return path, nil
}

// handOver replaces this process with the companion called name, which
// serves the store; it returns only on failure, with exit 69.
func handOver(c *cli.Context, name, storeName string) error {
	path, err := companionPath(name)
	if err == nil {
		args, _ := c.App.Metadata[argsKey].([]string)
		argv := append([]string{path}, args[1:]...)
		err = syscall.Exec(path, argv, os.Environ())
	}
	return &companionError{store: storeName, name: name, err: err}
}

// companionError is a companion that could not be started: exit 69, as
// for a store that cannot be reached (sysexits: "a support program does
// not exist").
type companionError struct {
	store, name string
	err         error
}

func (e *companionError) Error() string {
	return fmt.Sprintf("the %s store is served by %s: %v", e.store, e.name, e.err)
}

func (e *companionError) Unwrap() []error { return []error{backends.ErrUnavailable, e.err} }
