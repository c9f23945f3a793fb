package cmd

import (
	"context"
	"errors"
	"io/fs"
	"os"
	"strings"
	"syscall"
	"time"

	"github.com/urfave/cli/v2"

	"github.com/leaderrun/leaderrun/backends"
)

// defaultStateDirRule says how the default --state-dir is chosen, for
// the messages that name a directory that is not there.
const defaultStateDirRule = "the default is /var/lib/leaderrun as root, else $XDG_STATE_HOME/leaderrun, else ~/.local/state/leaderrun"

// checkStateDir checks the local store's directory before the store is
// opened, in the CLI's own words: it must be a directory this user or
// root owns, writable by its owner alone. A missing one is an error for
// status and history (they create nothing: the lock was never taken
// there, or it is another user's default), and is created by run's store.
// The store checks it again, and the directories above it, as it opens it.
func checkStateDir(dir string, mustExist bool) error {
	fi, err := os.Stat(dir)
	switch {
	case errors.Is(err, fs.ErrNotExist) && mustExist:
		return usageErrorf("--state-dir %s does not exist: no lock was taken with it on this host (%s; the lock may be another user's: give its --state-dir)",
			dir, defaultStateDirRule)
	case errors.Is(err, fs.ErrNotExist):
		return nil
	case err != nil:
		return usageErrorf("--state-dir %s: %v", dir, plainErrno(err))
	case !fi.IsDir():
		return usageErrorf("--state-dir %s is not a directory", dir)
	}
	if st, ok := fi.Sys().(*syscall.Stat_t); ok && st.Uid != 0 && int(st.Uid) != os.Geteuid() {
		return usageErrorf("--state-dir %s is owned by uid %d, not by this user (%d) or root", dir, st.Uid, os.Geteuid())
	}
	mode := fi.Mode()
	var who, notSticky string
	switch {
	case mode&0o002 != 0:
		who = "others"
		if mode&fs.ModeSticky == 0 {
			notSticky = " and not sticky"
		}
	case mode&0o020 != 0:
		who = "its group"
	default:
		return nil
	}
	return usageErrorf("--state-dir %s is writable by %s (mode %04o)%s: the local store needs a directory writable by its owner alone (mkdir -m 700 DIR)",
		dir, who, uint32(mode.Perm())|sticky(mode), notSticky)
}

func sticky(m fs.FileMode) uint32 {
	if m&fs.ModeSticky != 0 {
		return 0o1000
	}
	return 0
}

// plainErrno is the system's words for err ("permission denied"), without
// the operation and path that the message names already.
func plainErrno(err error) string {
	var errno syscall.Errno
	if errors.As(err, &errno) {
		return errno.Error()
	}
	return err.Error()
}

// stateDirError turns the local store's refusal to open or create its
// directory, found before the campaign (probeLocal), into a usage error.
func stateDirError(dir string, err error) error {
	var errno syscall.Errno
	if errors.As(err, &errno) {
		return usageErrorf("--state-dir %s: cannot use it: %v", dir, errno)
	}
	msg := strings.TrimPrefix(plainMessage(err), "local: ")
	msg = strings.TrimSuffix(msg, ": refusing to use it: "+strings.TrimPrefix(backends.ErrUnsafeState.Error(), "backends: "))
	return usageErrorf("--state-dir %s: cannot use it: %s", dir, msg)
}

// probeLocal opens the local store's directory before the campaign, as
// the first campaign would, so that a directory the store refuses or
// cannot create is a usage error in the CLI's words rather than a failed
// campaign.
func probeLocal(c *cli.Context, chosen store, s backends.Store, lock string) error {
	if chosen.name != "local" {
		return nil
	}
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	_, err := backends.ReadStatus(ctx, s, lock)
	if errors.Is(err, backends.ErrUnsafeState) || errors.Is(err, backends.ErrUnavailable) {
		return stateDirError(c.String("state-dir"), err)
	}
	return nil
}
