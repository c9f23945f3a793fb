//go:build linux

package local

import (
	"bufio"
	"context"
	"errors"
	"fmt"
	"os"
	"strings"
	"time"

	"golang.org/x/sys/unix"

	"github.com/leaderrun/leaderrun/backends"
)

// Follow watches the lock file with inotify. A waiter also holds a shared
// flock on <lock>.queue, which counts it for status; the kernel drops it
// if the waiter dies.
func (l *lock) Follow(_ context.Context, _ backends.Claim, h *backends.Record) (backends.Follower, error) {
	d, err := l.s.dir()
	if err != nil {
		return nil, err
	}
	w, err := newWatcher(l.Key())
	if err != nil {
		return nil, unavailable(l.s.path, "watch lock file", err)
	}
	f := &follower{Wake: backends.NewWake(), w: w, done: make(chan struct{})}
	if h == nil {
		q, err := d.open(l.queueName(), unix.O_RDONLY|unix.O_CREAT)
		if err == nil {
			if err = flockFd(int(q.Fd()), unix.LOCK_SH); err != nil {
				q.Close()
			}
		}
		if err != nil {
			w.close()
			return nil, unavailable(l.s.path, "join the queue", err)
		}
		f.queue = q
	}
	var ctx context.Context
	ctx, f.cancel = context.WithCancel(context.Background())
	go f.run(ctx, h == nil)
	return f, nil
}

// follower is an inotify watch of a lock file.
type follower struct {
	backends.Wake
	w      *watcher
	queue  *os.File // a waiter's shared flock on the queue file
	cancel context.CancelFunc
	done   chan struct{}
}

func (f *follower) Behind() bool { return false }

func (f *follower) Close() {
	f.cancel()
	<-f.done
	f.w.close()
	if f.queue != nil {
		f.queue.Close()
	}
}

// run pokes on every event, and a waiter again a few times within some
// 20 ms of each: the kernel reports a close before it drops the flock that
// goes with it (docs/backends/local.md).
func (f *follower) run(ctx context.Context, waiter bool) {
	defer close(f.done)
	for {
		if err := f.w.wait(ctx); err != nil {
			return
		}
		f.Poke()
		for delay := time.Millisecond; waiter && delay <= 16*time.Millisecond; delay *= 4 {
			select {
			case <-ctx.Done():
				return
			case <-time.After(delay):
			}
			f.Poke()
		}
	}
}

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

// isHeld asks the kernel, through /proc/locks, whether any process holds a
// flock on f's inode: a probing flock could disturb a candidate that is
// trying the lock at the same moment.
func isHeld(f *os.File, _ int) (bool, error) {
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
	major, minor := lockDevice(f, &st)
	id := fmt.Sprintf("%02x:%02x:%d", major, minor, st.Ino)
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

// lockDevice is the device /proc/locks names f's inode by: its
// superblock's, read from /proc/self/mountinfo for f's mount, which is not
// stat's on btrfs (docs/backends/local.md); stat's is the fallback.
func lockDevice(f *os.File, st *unix.Stat_t) (major, minor uint32) {
	major, minor = unix.Major(st.Dev), unix.Minor(st.Dev)
	var sx unix.Statx_t
	if unix.Statx(int(f.Fd()), "", unix.AT_EMPTY_PATH, unix.STATX_MNT_ID, &sx) != nil || sx.Mask&unix.STATX_MNT_ID == 0 {
		return major, minor
	}
	mi, err := os.Open("/proc/self/mountinfo")
	if err != nil {
		return major, minor
	}
	defer mi.Close()
	id := fmt.Sprint(sx.Mnt_id)
	sc := bufio.NewScanner(mi)
	for sc.Scan() {
		// fields: mount ID, parent ID, major:minor, root, mount point, ...
		fields := strings.Fields(sc.Text())
		if len(fields) < 3 || fields[0] != id {
			continue
		}
		var ma, mi uint32
		if _, err := fmt.Sscanf(fields[2], "%d:%d", &ma, &mi); err == nil {
			return ma, mi
		}
	}
	return major, minor
}
