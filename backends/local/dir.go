package local

import (
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"strings"
	"sync"

	"golang.org/x/sys/unix"

	"github.com/leaderrun/leaderrun/backends"
)

// dir is the state directory, treated as hostile until proven otherwise:
// others who may write to it could plant symlinks or files under the
// names leaderrun uses, and make it (often as root) overwrite, truncate or
// disclose other files, or reset the token counter. The directory and
// those above it are checked by openDir, every file by open; whatever
// fails is refused with backends.ErrUnsafeState, naming the path and the
// reason (docs/backends/local.md gives every rule and why).
type dir struct {
	path string
	f    *os.File // O_DIRECTORY
	euid int
	// mu serialises this process's state updates: a flock on one open
	// file does not exclude its other users in the same process.
	mu sync.Mutex
}

// openDir opens the state directory at path, creating what is missing
// (0700), by walking the path from "/" one name at a time with
// openat(O_NOFOLLOW): each directory is checked (checkDir) through the
// descriptor the walk holds, before anything is looked up or created in
// it, and a symbolic link is followed only if this user or root owns it,
// by walking its target the same way. So what is checked is what is
// opened, whichever way the path reaches it. The state directory itself
// must be this user's alone (checkStateDir).
func openDir(path string) (*dir, error) {
	abs, err := filepath.Abs(path)
	if err != nil {
		return nil, err
	}
	euid := os.Geteuid()
	w, err := newWalk(euid)
	if err != nil {
		return nil, err
	}
	defer w.close()
	if err := w.walk(abs); err != nil {
		return nil, err
	}
	top := w.stack[len(w.stack)-1]
	// The walk's descriptors may be O_PATH ones (walkFlag); flock and
	// fsync need one opened for reading, of the same directory (".": no
	// name to swap).
	fd, err := unix.Openat(top.fd, ".", unix.O_RDONLY|unix.O_DIRECTORY|unix.O_CLOEXEC, 0)
	if err != nil {
		return nil, fmt.Errorf("open state directory %s: %w", top.path, err)
	}
	f := os.NewFile(uintptr(fd), abs)
	var st unix.Stat_t
	if err = unix.Fstat(fd, &st); err == nil {
		err = checkStateDir(top.path, &st, euid)
	}
	if err != nil {
		f.Close()
		return nil, err
	}
	return &dir{path: abs, f: f, euid: euid}, nil
}

// maxLinks bounds the symbolic links one walk follows, as the kernel's
// own lookup does (40), so that a loop of them is an error.
const maxLinks = 40

// walk is the walk of openDir: the directories from "/" down to where it
// has got, each held open (walkFlag) and checked.
type walk struct {
	euid  int
	stack []walked // stack[0] is "/"
	links int
}

type walked struct {
	fd   int
	path string // as resolved, for messages
}

func newWalk(euid int) (*walk, error) {
	w := &walk{euid: euid}
	if err := w.push(unix.AT_FDCWD, "/", "/"); err != nil {
		return nil, err
	}
	return w, nil
}

// push opens name in the directory dirfd (never through a symlink),
// checks it and makes it the walk's current directory.
func (w *walk) push(dirfd int, name, path string) error {
	fd, err := unix.Openat(dirfd, name, walkFlag|unix.O_DIRECTORY|unix.O_NOFOLLOW|unix.O_CLOEXEC, 0)
	if err != nil {
		return err
	}
	var st unix.Stat_t
	if err := unix.Fstat(fd, &st); err != nil {
		unix.Close(fd)
		return fmt.Errorf("local: inspect %s: %w", path, err)
	}
	if err := checkDir(path, &st, w.euid); err != nil {
		unix.Close(fd)
		return err
	}
	w.stack = append(w.stack, walked{fd: fd, path: path})
	return nil
}

// walk follows the absolute path p from where the walk is.
func (w *walk) walk(p string) error {
	names := strings.Split(p, "/")
	for len(names) > 0 {
		name := names[0]
		names = names[1:]
		switch name {
		case "", ".":
			continue
		case "..":
			if len(w.stack) > 1 {
				w.pop()
			}
			continue
		}
		target, err := w.step(name)
		if err != nil {
			return err
		}
		if target != "" {
			names = append(strings.Split(target, "/"), names...)
		}
	}
	return nil
}

// step enters the directory name in the current one, making it (0700) if
// it is missing: only inside a directory found safe, and checked like any
// other once made (someone may have made it first). If name is a symbolic
// link the walk may follow, step returns its target, to be walked next.
func (w *walk) step(name string) (target string, err error) {
	cur := w.stack[len(w.stack)-1]
	path := filepath.Join(cur.path, name)
	err = w.push(cur.fd, name, path)
	if errors.Is(err, unix.ENOENT) {
		if err = unix.Mkdirat(cur.fd, name, 0o700); err != nil && !errors.Is(err, unix.EEXIST) {
			return "", fmt.Errorf("create state directory %s: %w", path, err)
		}
		err = w.push(cur.fd, name, path)
	}
	switch {
	case err == nil:
		return "", nil
	case errors.Is(err, backends.ErrUnsafeState):
		return "", err
	case errors.Is(err, unix.ELOOP), errors.Is(err, unix.ENOTDIR):
		// Not a directory: a symbolic link, or refused.
		return w.follow(cur, name, path)
	}
	return "", fmt.Errorf("local: open %s: %w", path, err)
}

// follow returns the target of the symbolic link name in the directory
// cur, if this user or root owns it, and goes back to "/" first if the
// target is absolute; anything else that is not a directory is refused.
func (w *walk) follow(cur walked, name, path string) (string, error) {
	var lst unix.Stat_t
	if err := unix.Fstatat(cur.fd, name, &lst, unix.AT_SYMLINK_NOFOLLOW); err != nil {
		return "", fmt.Errorf("local: inspect %s: %w", path, err)
	}
	if lst.Mode&unix.S_IFMT != unix.S_IFLNK {
		return "", unsafeErr(path, "is not a directory")
	}
	if !owned(lst.Uid, w.euid) {
		return "", unsafeErr(path, fmt.Sprintf("is a symbolic link owned by uid %d", lst.Uid))
	}
	if w.links++; w.links > maxLinks {
		return "", fmt.Errorf("local: %s: more than %d symbolic links: %w", path, maxLinks, unix.ELOOP)
	}
	target, err := readlinkat(cur.fd, name)
	if err != nil {
		return "", fmt.Errorf("local: read symbolic link %s: %w", path, err)
	}
	if filepath.IsAbs(target) {
		for len(w.stack) > 1 {
			w.pop()
		}
	}
	return target, nil
}

func (w *walk) pop() {
	unix.Close(w.stack[len(w.stack)-1].fd)
	w.stack = w.stack[:len(w.stack)-1]
}

func (w *walk) close() {
	for len(w.stack) > 0 {
		w.pop()
	}
}

// readlinkat reads the target of the symbolic link name in dirfd.
func readlinkat(dirfd int, name string) (string, error) {
	buf := make([]byte, unix.PathMax)
	n, err := unix.Readlinkat(dirfd, name, buf)
	if err != nil {
		return "", err
	}
	if n == len(buf) {
		return "", unix.ENAMETOOLONG
	}
	return string(buf[:n]), nil
}

// checkStateDir checks the state directory as any above it, and writable
// by its owner alone even if sticky: in a directory like /tmp another
// user could create the files leaderrun uses before it does.
func checkStateDir(p string, st *unix.Stat_t, euid int) error {
	if err := checkDir(p, st, euid); err != nil {
		return err
	}
	if st.Mode&0o022 != 0 {
		return unsafeErr(p, fmt.Sprintf("is %s: a state directory must be writable by its owner alone", writable(uint32(st.Mode))))
	}
	return nil
}

func (d *dir) close() error { return d.f.Close() }

func (d *dir) fd() int { return int(d.f.Fd()) }

// join is the path of name in the directory, for messages and inotify.
func (d *dir) join(name string) string { return filepath.Join(d.path, name) }

// writable names who besides the owner may write, by mode (one of 0o022).
func writable(mode uint32) string {
	who := "others"
	if mode&0o002 == 0 {
		who = "its group"
	}
	return fmt.Sprintf("writable by %s (mode %04o)", who, mode&0o7777)
}

func unsafeErr(path, why string) error {
	return fmt.Errorf("local: %s %s: refusing to use it: %w", path, why, backends.ErrUnsafeState)
}

// owned reports whether uid may own leaderrun's files when euid runs it.
func owned(uid uint32, euid int) bool { return uid == 0 || int(uid) == euid }

func checkDir(p string, st *unix.Stat_t, euid int) error {
	switch {
	case st.Mode&unix.S_IFMT != unix.S_IFDIR:
		return unsafeErr(p, "is not a directory")
	case !owned(st.Uid, euid):
		return unsafeErr(p, fmt.Sprintf("is owned by uid %d, not by this user (%d) or root", st.Uid, euid))
	case st.Mode&0o022 != 0 && st.Mode&unix.S_ISVTX == 0:
		return unsafeErr(p, fmt.Sprintf("is %s and not sticky", writable(uint32(st.Mode))))
	}
	return nil
}

// checkFile checks an opened file of the directory.
func (d *dir) checkFile(name string, st *unix.Stat_t) error {
	p := d.join(name)
	switch {
	case st.Mode&unix.S_IFMT != unix.S_IFREG:
		return unsafeErr(p, "is not a regular file")
	case !owned(st.Uid, d.euid):
		return unsafeErr(p, fmt.Sprintf("is owned by uid %d, not by this user (%d) or root", st.Uid, d.euid))
	case st.Nlink != 1:
		return unsafeErr(p, fmt.Sprintf("has %d hard links", st.Nlink))
	case st.Mode&0o022 != 0:
		return unsafeErr(p, "is "+writable(uint32(st.Mode)))
	}
	return nil
}

// open opens name in the directory without following a symlink, creating
// it (0600) if flags say so, and checks what it opened.
func (d *dir) open(name string, flags int) (*os.File, error) {
	fd, err := unix.Openat(d.fd(), name, flags|unix.O_NOFOLLOW|unix.O_CLOEXEC, 0o600)
	if err != nil {
		// Say what is wrong with what lies there, if anything: the kernel
		// answers a planted symlink with ELOOP, or EACCES where it
		// protects sticky directories.
		var st unix.Stat_t
		if !errors.Is(err, unix.ENOENT) && unix.Fstatat(d.fd(), name, &st, unix.AT_SYMLINK_NOFOLLOW) == nil {
			if st.Mode&unix.S_IFMT == unix.S_IFLNK {
				return nil, unsafeErr(d.join(name), "is a symbolic link")
			}
			if err := d.checkFile(name, &st); err != nil {
				return nil, err
			}
		}
		return nil, &os.PathError{Op: "open", Path: d.join(name), Err: err}
	}
	f := os.NewFile(uintptr(fd), d.join(name))
	var st unix.Stat_t
	if err = unix.Fstat(fd, &st); err == nil {
		err = d.checkFile(name, &st)
	}
	if err != nil {
		f.Close()
		return nil, err
	}
	return f, nil
}

// readFile reads name, at most max bytes; a missing file is
// os.ErrNotExist, a larger one an error that says its size, never what it
// holds.
func (d *dir) readFile(name string, max int) ([]byte, error) {
	f, err := d.open(name, unix.O_RDONLY)
	if err != nil {
		return nil, err
	}
	defer f.Close()
	data, err := io.ReadAll(io.LimitReader(f, int64(max)+1))
	if err != nil {
		return nil, err
	}
	if len(data) > max {
		fi, _ := f.Stat()
		return nil, fmt.Errorf("%s is %d bytes, more than the %d it can hold", d.join(name), fi.Size(), max)
	}
	return data, nil
}

// writeFile replaces name with data so that after a crash either the old
// or the new content is there: a new temporary file (O_EXCL: never one
// someone planted), fsync, rename over name, fsync of the directory.
func (d *dir) writeFile(name string, data []byte) error {
	tmp := name + ".tmp"
	f, err := d.open(tmp, unix.O_WRONLY|unix.O_CREAT|unix.O_EXCL)
	if errors.Is(err, unix.EEXIST) {
		// Left by a crash between create and rename, if it is ours;
		// anyone else's is refused by name.
		var st unix.Stat_t
		if serr := unix.Fstatat(d.fd(), tmp, &st, unix.AT_SYMLINK_NOFOLLOW); serr != nil {
			return serr
		}
		if st.Mode&unix.S_IFMT != unix.S_IFREG || !owned(st.Uid, d.euid) {
			return unsafeErr(d.join(tmp), fmt.Sprintf("exists and is not this user's file (uid %d, mode %06o)", st.Uid, st.Mode))
		}
		if err := unix.Unlinkat(d.fd(), tmp, 0); err != nil {
			return err
		}
		f, err = d.open(tmp, unix.O_WRONLY|unix.O_CREAT|unix.O_EXCL)
	}
	if err != nil {
		return err
	}
	_, err = f.Write(data)
	if err == nil {
		err = f.Sync()
	}
	if cerr := f.Close(); err == nil {
		err = cerr
	}
	if err != nil {
		return err
	}
	if err := unix.Renameat(d.fd(), tmp, d.fd(), name); err != nil {
		return err
	}
	return d.f.Sync()
}

// sameFile reports whether f is still the file at name (not removed or
// replaced), without following a symlink.
func (d *dir) sameFile(f *os.File, name string) (bool, error) {
	var a, b unix.Stat_t
	if err := unix.Fstat(int(f.Fd()), &a); err != nil {
		return false, err
	}
	if err := unix.Fstatat(d.fd(), name, &b, unix.AT_SYMLINK_NOFOLLOW); err != nil {
		if errors.Is(err, unix.ENOENT) {
			return false, os.ErrNotExist
		}
		return false, err
	}
	return a.Dev == b.Dev && a.Ino == b.Ino, nil
}

// lockState holds an exclusive flock on the directory itself for updates of
// a state file; unlock with the returned function.
func (d *dir) lockState() (func(), error) {
	if err := flockFd(d.fd(), unix.LOCK_EX); err != nil {
		return nil, err
	}
	return func() { _ = flockFd(d.fd(), unix.LOCK_UN) }, nil
}

func flockFd(fd, how int) error {
	for {
		err := unix.Flock(fd, how)
		if !errors.Is(err, unix.EINTR) {
			return err
		}
	}
}

// tokenLine reads the token recorded in a lock file's holder record
// ("token=N"), 0 if none.
func tokenLine(data []byte) string {
	for _, line := range strings.Split(string(data), "\n") {
		if v, ok := strings.CutPrefix(line, "token="); ok {
			return v
		}
	}
	return ""
}
