//go:build linux

package watchdog

import (
	"errors"
	"fmt"
	"os"
	"slices"
	"strconv"
	"strings"
	"syscall"
	"time"

	"github.com/leaderrun/leaderrun/signals/stop"
	"golang.org/x/sys/unix"
)

// cgroupTree is the command's tree as a cgroup v2 group of its own, made
// by the watchdog below its own cgroup (which is leaderrun's), with no
// controller enabled: it only holds processes. Every process the command
// starts is born in it, and stays in it however it detaches (setsid,
// double fork), unless a process with write access to the hierarchy
// moves it out; cgroup.kill (Linux 5.14) SIGKILLs all of them at once,
// and cgroup.events says when none is left.
type cgroupTree struct {
	dir      string
	dirFD    int // for clone3's CLONE_INTO_CGROUP
	killFD   int // cgroup.kill
	events   int // cgroup.events, polled for POLLPRI
	parentFD int // the directory dir is in, for the keeper's rmdir
	pgid     int
}

// ownCgroup is the directory of this process's cgroup in the cgroup v2
// hierarchy: the "0::" line of /proc/self/cgroup below the cgroup2 mount
// found in /proc/self/mountinfo (/sys/fs/cgroup on a pure v2 host,
// /sys/fs/cgroup/unified on a hybrid one).
func ownCgroup() (string, error) {
	data, err := os.ReadFile("/proc/self/cgroup")
	if err != nil {
		return "", err
	}
	var path string
	for _, line := range strings.Split(string(data), "\n") {
		if p, ok := strings.CutPrefix(line, "0::"); ok {
			path = p
		}
	}
	if path == "" {
		return "", errors.New("no cgroup v2 hierarchy in /proc/self/cgroup")
	}
	mounts, err := os.ReadFile("/proc/self/mountinfo")
	if err != nil {
		return "", err
	}
	for _, line := range strings.Split(string(mounts), "\n") {
		// id parent major:minor root mountpoint options... - fstype source super
		f := strings.Fields(line)
		sep := slices.Index(f, "-")
		if sep < 5 || sep+1 >= len(f) || f[sep+1] != "cgroup2" {
			continue
		}
		root, point := unescapeMount(f[3]), unescapeMount(f[4])
		rel, ok := strings.CutPrefix(path, root)
		if root == "/" {
			rel, ok = path, true
		}
		if ok && (rel == "" || strings.HasPrefix(rel, "/")) {
			if dir := strings.TrimSuffix(point+rel, "/"); dir != "" {
				return dir, nil
			}
			return "/", nil
		}
	}
	return "", errors.New("cgroup2 is not mounted where this process's cgroup is")
}

// unescapeMount undoes mountinfo's octal escapes (\040 for a space).
func unescapeMount(s string) string {
	if !strings.Contains(s, `\`) {
		return s
	}
	var b strings.Builder
	for i := 0; i < len(s); i++ {
		if s[i] == '\\' && i+3 < len(s) {
			if n, err := strconv.ParseUint(s[i+1:i+4], 8, 8); err == nil {
				b.WriteByte(byte(n))
				i += 3
				continue
			}
		}
		b.WriteByte(s[i])
	}
	return b.String()
}

// makeCgroup creates the command's cgroup below this process's own, or
// says why it cannot: no cgroup v2, no write access (not root, and no
// delegated subtree), a read-only hierarchy (a unit's
// ProtectControlGroups=), no cgroup.kill (before Linux 5.14).
func makeCgroup() (*cgroupTree, error) {
	parent, err := ownCgroup()
	if err != nil {
		return nil, err
	}
	// clone3 may put a child in a cgroup only for a writer of the
	// cgroup.procs of both cgroups' common ancestor: this one.
	if err := unix.Faccessat(unix.AT_FDCWD, parent+"/cgroup.procs", unix.W_OK, unix.AT_EACCESS); err != nil {
		return nil, fmt.Errorf("%s/cgroup.procs: %w", parent, err)
	}
	dir := parent + "/leaderrun-" + strconv.Itoa(os.Getpid())
	err = unix.Mkdir(dir, 0o755)
	if errors.Is(err, unix.EEXIST) {
		// Left by a watchdog of the same pid, or someone's: a new name,
		// with the boot clock's nanoseconds.
		dir += "-" + strconv.FormatInt(int64(Now()), 16)
		err = unix.Mkdir(dir, 0o755)
	}
	if err != nil {
		return nil, fmt.Errorf("mkdir %s: %w", dir, err)
	}
	cg := &cgroupTree{dir: dir, dirFD: -1, killFD: -1, events: -1, parentFD: -1}
	open := func(path string, flags int) (int, error) {
		fd, err := unix.Open(path, flags|unix.O_CLOEXEC, 0)
		if err != nil {
			return -1, fmt.Errorf("%s: %w", path, err)
		}
		return fd, nil
	}
	if cg.dirFD, err = open(dir, unix.O_RDONLY|unix.O_DIRECTORY); err == nil {
		if cg.killFD, err = open(dir+"/cgroup.kill", unix.O_WRONLY); err == nil {
			if cg.events, err = open(dir+"/cgroup.events", unix.O_RDONLY); err == nil {
				cg.parentFD, err = open(parent, unix.O_RDONLY|unix.O_DIRECTORY)
			}
		}
	}
	if err != nil {
		_ = cg.remove()
		return nil, err
	}
	return cg, nil
}

// members lists the processes of the group and of any group below it.
func (cg *cgroupTree) members() []stop.Member {
	if !cg.populated() {
		return nil
	}
	var out []stop.Member
	buf := make([]byte, 512)
	for _, dir := range cgroupDirs(cg.dir, nil) {
		data, _ := os.ReadFile(dir + "/cgroup.procs")
		for _, f := range strings.Fields(string(data)) {
			pid, err := strconv.Atoi(f)
			if err != nil {
				continue
			}
			if p, ok := readStat(pid, buf); ok && !p.zombie {
				out = append(out, stop.Member{Pid: pid, Pgid: p.pgid})
			}
		}
	}
	return out
}

// populated reads cgroup.events (which re-arms its POLLPRI): whether any
// process is left in the group or below it.
func (cg *cgroupTree) populated() bool {
	buf := make([]byte, 128)
	n, err := unix.Pread(cg.events, buf, 0)
	if err != nil {
		return true // cannot tell: look at the processes
	}
	for _, line := range strings.Split(string(buf[:max(n, 0)]), "\n") {
		if v, ok := strings.CutPrefix(line, "populated "); ok {
			return v != "0"
		}
	}
	return true
}

// kill writes cgroup.kill, which SIGKILLs every process of the group and
// of the groups below it, including those forked meanwhile.
func (cg *cgroupTree) kill(pids []int) {
	if _, err := unix.Pwrite(cg.killFD, []byte("1"), 0); err == nil {
		return
	}
	_ = syscall.Kill(-cg.pgid, syscall.SIGKILL)
	for _, pid := range pids {
		_ = syscall.Kill(pid, syscall.SIGKILL)
	}
}

// fds is cgroup.events, which is notified when the group empties.
func (cg *cgroupTree) fds([]stop.Member) ([]unix.PollFd, time.Duration) {
	if !cg.populated() {
		return nil, 0
	}
	return []unix.PollFd{{Fd: int32(cg.events), Events: unix.POLLPRI}}, -1
}

// remove closes the group's descriptors and removes it, with any group
// the command made below it, once it is empty, and says why it could not.
func (cg *cgroupTree) remove() error {
	for _, fd := range []int{cg.dirFD, cg.killFD, cg.events, cg.parentFD} {
		if fd >= 0 {
			unix.Close(fd)
		}
	}
	cg.dirFD, cg.killFD, cg.events, cg.parentFD = -1, -1, -1, -1
	dirs := cgroupDirs(cg.dir, nil)
	// Deepest first; a group may take a moment to leave once empty.
	var errs []error
	for i := len(dirs) - 1; i >= 0; i-- {
		var err error
		for range 50 {
			if err = unix.Rmdir(dirs[i]); !errors.Is(err, unix.EBUSY) {
				break
			}
			time.Sleep(time.Millisecond)
		}
		if err != nil && !errors.Is(err, unix.ENOENT) {
			errs = append(errs, &os.PathError{Op: "rmdir", Path: dirs[i], Err: err})
		}
	}
	return errors.Join(errs...)
}

// cgroupDirs appends dir and every directory below it to dirs, parents
// first (not path/filepath's WalkDir: see doc.go).
func cgroupDirs(dir string, dirs []string) []string {
	dirs = append(dirs, dir)
	entries, _ := os.ReadDir(dir)
	for _, e := range entries {
		if e.IsDir() {
			dirs = cgroupDirs(dir+"/"+e.Name(), dirs)
		}
	}
	return dirs
}
