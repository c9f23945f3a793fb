package cmd

import (
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"syscall"

	"github.com/urfave/cli/v2"

	"github.com/leaderrun/leaderrun/backends"
	"github.com/leaderrun/leaderrun/signals"
)

// A store whose client library would cost every leaderrun on a host more
// than it is worth (the AWS SDK's package init holds 2.2 MiB in every
// leaderrun and 0.9 MiB in its watchdog, 3.1 MiB per leading instance,
// whatever the store) lives in a companion binary: leaderrun with that
// backend linked in. leaderrun checks the store's flags, then replaces
// itself with the companion (execve: same pid, arguments, argv[0] and
// environment, process name kept), before it catches a signal or starts
// anything: what the user sees is one leaderrun process with the same
// flags, exit codes and output.

// awsCompanion is the companion of the stores on the AWS SDK (DynamoDB,
// S3): cmd/leaderrun-aws.
const awsCompanion = "leaderrun-aws"

// handedOverVar tells a companion which release handed the run over to
// it. It is removed from the environment at once, so that the command
// never sees it; a companion of another release refuses the run, and a
// binary that would have to hand over again refuses it too (two plain
// leaderruns installed under each other's names would otherwise exec one
// another for ever).
const handedOverVar = "LEADERRUN_HANDED_OVER_BY"

// release names this build for handedOverVar.
func release() string { return Version() + " " + revision() }

// handedOverKey is where run keeps handedOverVar's value, if any, in the
// app's Metadata.
const handedOverKey = "handedOverBy"

// takeHandOver reads and removes handedOverVar, and refuses a hand-over
// from another release.
func takeHandOver() (string, error) {
	by, ok := os.LookupEnv(handedOverVar)
	if !ok {
		return "", nil
	}
	_ = os.Unsetenv(handedOverVar)
	if by != release() {
		self, _ := os.Executable()
		return by, &companionError{name: filepath.Base(self),
			err: fmt.Errorf("%s is release %q, but the leaderrun that handed over is %q: install both from the same release", self, release(), by)}
	}
	// The name of the process, as ps and killall show it, stays
	// leaderrun's (Linux; elsewhere the file does not exist).
	_ = os.WriteFile("/proc/self/comm", []byte("leaderrun"), 0)
	return by, nil
}

// companionPath is where the companion called name must be: beside the
// running binary (symbolic links resolved), and nowhere else (not $PATH:
// a root leaderrun must not run whatever a user put first there). The
// path returned has its symbolic links resolved too, and has passed
// checkCompanion: it is what is run.
func companionPath(name string) (string, error) {
	self, err := os.Executable()
	if err != nil {
		return "", err
	}
	if resolved, err := filepath.EvalSymlinks(self); err == nil {
		self = resolved
	}
	path, err := filepath.EvalSymlinks(filepath.Join(filepath.Dir(self), name))
	if err != nil {
		return "", fmt.Errorf("%s is not installed beside %s: install it from the same release as leaderrun "+
			"(go install github.com/leaderrun/leaderrun/cmd/%s@%s)", name, self, name, installVersion())
	}
	fi, err := os.Stat(path)
	if err != nil {
		return "", err
	}
	if !fi.Mode().IsRegular() || fi.Mode().Perm()&0o111 == 0 {
		return "", fmt.Errorf("%s is not an executable file (%v)", path, fi.Mode())
	}
	if err := checkCompanion(path, os.Geteuid()); err != nil {
		return "", err
	}
	if me, err := os.Stat(self); err == nil && os.SameFile(me, fi) {
		// A leaderrun installed under the companion's name would hand
		// over to itself for ever.
		return "", fmt.Errorf("%s is a leaderrun without that backend, not the companion binary", path)
	}
	return path, nil
}

// checkCompanion holds the companion at path (symbolic links resolved)
// to the rule of the local backend's state directory: a file of this user
// (euid) or root that no one else may write, in directories of this user
// or root, from its own up to /, that no one else may write unless they
// are sticky (like /tmp). Otherwise another user could edit it, or put a
// program of theirs in its place, and have leaderrun (often root) run it.
func checkCompanion(path string, euid int) error {
	owned := func(p string, st *syscall.Stat_t) error {
		if st.Uid != 0 && int(st.Uid) != euid {
			return fmt.Errorf("%s is owned by uid %d, not by this user (%d) or root: refusing to run %s", p, st.Uid, euid, path)
		}
		return nil
	}
	var st syscall.Stat_t
	if err := syscall.Lstat(path, &st); err != nil {
		return fmt.Errorf("inspect %s: %w", path, err)
	}
	if st.Mode&syscall.S_IFMT != syscall.S_IFREG {
		return fmt.Errorf("%s is not a regular file: refusing to run it", path)
	}
	if err := owned(path, &st); err != nil {
		return err
	}
	if st.Mode&0o022 != 0 {
		return fmt.Errorf("%s is writable by others (mode %04o): refusing to run it", path, st.Mode&0o7777)
	}
	for d := filepath.Dir(path); ; d = filepath.Dir(d) {
		if err := syscall.Lstat(d, &st); err != nil {
			return fmt.Errorf("inspect %s: %w", d, err)
		}
		if err := owned(d, &st); err != nil {
			return err
		}
		switch {
		case st.Mode&syscall.S_IFMT != syscall.S_IFDIR:
			return fmt.Errorf("%s is not a directory: refusing to run %s", d, path)
		case st.Mode&0o022 != 0 && st.Mode&syscall.S_ISVTX == 0:
			return fmt.Errorf("%s is writable by others (mode %04o) and not sticky: refusing to run %s", d, st.Mode&0o7777, path)
		}
		if d == filepath.Dir(d) {
			return nil
		}
	}
}

// handOver replaces this process with the companion called name, which
// serves the store; it returns only on failure, with exit 69.
func handOver(c *cli.Context, name, storeName string) error {
	if by, _ := c.App.Metadata[handedOverKey].(string); by != "" {
		self, _ := os.Executable()
		return &companionError{store: storeName, name: name,
			err: fmt.Errorf("%s was started by another leaderrun to serve it, but has no %s backend either", self, storeName)}
	}
	path, err := companionPath(name)
	if err == nil {
		args, _ := c.App.Metadata[argsKey].([]string)
		env := append(os.Environ(), handedOverVar+"="+release())
		signals.DismissEarly()
		err = fmt.Errorf("exec %s: %w", path, syscall.Exec(path, args, env))
	}
	return &companionError{store: storeName, name: name, err: err}
}

// companionError is a companion that could not be started, or one that
// refuses the run: exit 69, as for a store that cannot be reached
// (sysexits: "a support program does not exist").
type companionError struct {
	store string // "": the companion refuses the run (takeHandOver)
	name  string
	err   error
}

func (e *companionError) Error() string {
	if e.store == "" {
		return e.err.Error()
	}
	return fmt.Sprintf("the %s store is served by %s: %v", e.store, e.name, e.err)
}

func (e *companionError) Unwrap() []error { return []error{backends.ErrUnavailable, e.err} }

// errNoBackend is a store whose backend this binary lacks, met past the
// hand-over: a bug, never a user's error.
var errNoBackend = errors.New("the store's backend is not linked into this binary, and the run was not handed over")

// installVersion is the version go install needs for the companion of
// this build: its module version, else its revision, else "latest".
func installVersion() string {
	if v := Version(); v != "devel" {
		return v
	}
	if r := strings.TrimSuffix(revision(), "-dirty"); r != "" {
		return r
	}
	return "latest"
}
