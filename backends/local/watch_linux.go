//go:build linux

package local

import (
	"bufio"
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"strings"
	"time"

	"golang.org/x/sys/unix"
)

var errEOF = io.EOF

// watcher is an inotify instance watching one file. Its descriptor is
// non-blocking, so os.File puts it on the runtime poller and a read can be
// cut short with a deadline when the caller's context ends.
type watcher struct {
	f *os.File
}

// Waiters wake when a holder closes the lock file (release or death) and
// holders notice when their file is unlinked, renamed or replaced.
// IN_DONT_FOLLOW: a symlink planted at the path is watched, not its target.
const watchMask = unix.IN_CLOSE_WRITE | unix.IN_DELETE_SELF | unix.IN_MOVE_SELF | unix.IN_ATTRIB | unix.IN_DONT_FOLLOW

func newWatcher(path string) (*watcher, error) {
	fd, err := unix.InotifyInit1(unix.IN_NONBLOCK | unix.IN_CLOEXEC)
	if err != nil {
		return nil, fmt.Errorf("inotify_init1: %w", err)
	}
	if _, err := unix.InotifyAddWatch(fd, path, watchMask); err != nil {
		unix.Close(fd)
		return nil, fmt.Errorf("inotify_add_watch %s: %w", path, err)
	}
	return &watcher{f: os.NewFile(uintptr(fd), "inotify:"+path)}, nil
}

// wait blocks until at least one event arrives or ctx ends.
func (w *watcher) wait(ctx context.Context) error {
	if err := w.f.SetReadDeadline(time.Time{}); err != nil {
		return err
	}
	stop := context.AfterFunc(ctx, func() { _ = w.f.SetReadDeadline(time.Now()) })
	defer stop()
	var buf [4096]byte
	_, err := w.f.Read(buf[:])
	if ctx.Err() != nil {
		return ctx.Err()
	}
	return err
}

func (w *watcher) close() { w.f.Close() }

// watchLoss closes Lost() as soon as the lock file is unlinked, renamed or
// replaced (S3); Renew runs the same check as a backstop.
func (l *lease) watchLoss() error {
	w, err := newWatcher(l.b.lockPath())
	if err != nil {
		return err
	}
	ctx, cancel := context.WithCancel(context.Background())
	l.stopWatch = cancel
	l.watchWG.Add(1)
	go func() {
		defer l.watchWG.Done()
		defer w.close()
		for {
			if err := w.wait(ctx); err != nil {
				return
			}
			if l.check() != nil {
				return
			}
		}
	}()
	return nil
}

// isHeld asks the kernel, through /proc/locks, whether any process holds a
// flock on f's inode. Unlike a probing flock it cannot disturb a candidate
// that is trying the lock at the same moment.
func isHeld(f *os.File, _ map[string]string) (bool, error) {
	n, err := flockCount(f)
	return n > 0, err
}

// countWaiters counts shared flocks on the queue file, one per waiting
// candidate.
func countWaiters(d *dir, name string) int {
	f, err := d.open(name, unix.O_RDONLY)
	if errors.Is(err, os.ErrNotExist) {
		return 0
	}
	if err != nil {
		return -1
	}
	defer f.Close()
	n, err := flockCount(f)
	if err != nil {
		return -1
	}
	return n
}

// flockCount counts the flocks held on f's inode, from /proc/locks;
// blocked requests (lines with "->") are not counted.
func flockCount(f *os.File) (int, error) {
	var st unix.Stat_t
	if err := unix.Fstat(int(f.Fd()), &st); err != nil {
		return 0, err
	}
	id := fmt.Sprintf("%02x:%02x:%d", unix.Major(st.Dev), unix.Minor(st.Dev), st.Ino)
	pl, err := os.Open("/proc/locks")
	if err != nil {
		return 0, err
	}
	defer pl.Close()
	n := 0
	sc := bufio.NewScanner(pl)
	for sc.Scan() {
		fields := strings.Fields(sc.Text())
		if len(fields) < 6 {
			continue
		}
		// fields: "N:" "FLOCK" "ADVISORY" "WRITE" pid dev:ino start end
		if fields[1] == "FLOCK" && fields[5] == id {
			n++
		}
	}
	return n, sc.Err()
}
