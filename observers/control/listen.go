package control

import (
	"errors"
	"fmt"
	"io/fs"
	"net"
	"os"
	"path/filepath"
	"strings"
	"syscall"
	"time"
)

// The socket's file: socketName in a new directory dirPrefix* of its own.
const (
	dirPrefix  = "leaderrun-check-"
	socketName = "check.sock"
)

// listen creates the socket as check.sock in a new directory of mode 0700
// under base (os.TempDir if empty), and returns the listener, the
// socket's path and the directory. Only this user and root can enter the
// directory, so another user's connect fails there with EACCES, before it
// reaches the listener: a connection that reaches the backlog takes a
// place there until it is accepted, even one that allowed refuses at
// once, and a flood of them makes the job's own connects fail with
// EAGAIN. base must not let anyone else replace that directory (checkBase).
func listen(base string) (net.Listener, string, string, error) {
	if base == "" {
		base = os.TempDir()
	}
	if err := checkBase(base); err != nil {
		return nil, "", "", err
	}
	sweep(base, time.Now())
	d, err := os.MkdirTemp(base, dirPrefix)
	if err != nil {
		return nil, "", "", fmt.Errorf("create control socket directory: %w", err)
	}
	path := filepath.Join(d, socketName)
	ln, err := net.Listen("unix", path)
	if err != nil {
		os.RemoveAll(d)
		return nil, "", "", fmt.Errorf("listen on %s: %w", path, err)
	}
	return ln, path, d, nil
}

// checkBase refuses a directory in which another user could rename the
// socket's directory away and put one of theirs in its place, to answer
// the job's checks: it must be this user's or root's, and writable by
// nobody else unless it is sticky (like /tmp), as the local backend asks
// of the directories above its state directory.
func checkBase(base string) error {
	fi, err := os.Stat(base)
	if err != nil {
		return fmt.Errorf("control socket directory: %w", err)
	}
	st, ok := fi.Sys().(*syscall.Stat_t)
	switch {
	case !fi.IsDir():
		return fmt.Errorf("control socket directory %s: not a directory", base)
	case ok && st.Uid != 0 && int(st.Uid) != os.Geteuid():
		return fmt.Errorf("control socket directory %s: owned by uid %d, not by this user (%d) or root", base, st.Uid, os.Geteuid())
	case fi.Mode().Perm()&0o022 != 0 && fi.Mode()&os.ModeSticky == 0:
		return fmt.Errorf("control socket directory %s: writable by others (mode %v) and not sticky", base, fi.Mode())
	}
	return nil
}

// staleAfter is how old a socket directory must be before sweep may
// remove it: a directory is made, and its socket bound and listened on,
// within microseconds.
const staleAfter = time.Minute

// sweep removes what runs of leaderrun killed with SIGKILL (which runs no
// Close) left in base: directories of this user named dirPrefix*, older
// than staleAfter, whose socket nobody listens on any more (a connect is
// refused) or that hold none. It removes the socket and the directory and
// nothing else: a directory that holds more is left as it is.
func sweep(base string, now time.Time) {
	entries, err := os.ReadDir(base)
	if err != nil {
		return
	}
	for _, e := range entries {
		if !e.IsDir() || !strings.HasPrefix(e.Name(), dirPrefix) {
			continue
		}
		d := filepath.Join(base, e.Name())
		fi, err := os.Lstat(d)
		if err != nil || !fi.IsDir() || now.Sub(fi.ModTime()) < staleAfter {
			continue
		}
		if st, ok := fi.Sys().(*syscall.Stat_t); !ok || int(st.Uid) != os.Geteuid() {
			continue
		}
		sock := filepath.Join(d, socketName)
		c, err := net.DialTimeout("unix", sock, 100*time.Millisecond)
		if err == nil {
			c.Close()
			continue
		}
		if !errors.Is(err, syscall.ECONNREFUSED) && !errors.Is(err, fs.ErrNotExist) {
			continue
		}
		_ = os.Remove(sock)
		_ = os.Remove(d)
	}
}
