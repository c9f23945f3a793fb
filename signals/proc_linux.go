//go:build linux

package signals

import (
	"os"
	"os/signal"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"

	"unsafe"

	"golang.org/x/sys/unix"
)

// childAttr makes the command a process group leader that dies with SIGKILL
// when the supervisor's forking thread dies.
func childAttr() *syscall.SysProcAttr {
	return &syscall.SysProcAttr{Setpgid: true, Pdeathsig: syscall.SIGKILL}
}

func executable() (string, error) {
	// /proc/self/exe survives the binary being replaced on disk by an upgrade.
	if _, err := os.Stat("/proc/self/exe"); err == nil {
		return "/proc/self/exe", nil
	}
	return os.Executable()
}

func becomeSubreaper() error {
	return unix.Prctl(unix.PR_SET_CHILD_SUBREAPER, 1, 0, 0, 0)
}

// BecomeSubreaper makes this process the reaper of orphaned descendants
// (PR_SET_CHILD_SUBREAPER) and reaps them as they exit, leaving alone the
// supervisors that Start waits for itself. Call it once, from main: in a
// library or test process it would reap children that others wait for.
func BecomeSubreaper() error {
	if err := becomeSubreaper(); err != nil {
		return err
	}
	ch := make(chan os.Signal, 1)
	signal.Notify(ch, syscall.SIGCHLD)
	go func() {
		for range ch {
			reapOrphans()
		}
	}()
	return nil
}

func reapOrphans() {
	tracked.Lock()
	defer tracked.Unlock()
	for {
		var info unix.Siginfo
		// Peek (WNOWAIT) so that a tracked supervisor stays for its Wait.
		err := unix.Waitid(unix.P_ALL, 0, &info, unix.WEXITED|unix.WNOHANG|unix.WNOWAIT, nil)
		pid := int(siginfoPid(&info))
		if err != nil || pid == 0 || tracked.pids[pid] {
			return
		}
		var ws unix.WaitStatus
		_, _ = unix.Wait4(pid, &ws, unix.WNOHANG, nil)
	}
}

// siginfoPid reads si_pid, the first field of the union that follows
// si_signo, si_errno and si_code (aligned to 8 bytes on 64-bit targets).
func siginfoPid(info *unix.Siginfo) int32 {
	off := uintptr(12)
	if unsafe.Sizeof(uintptr(0)) == 8 {
		off = 16
	}
	return *(*int32)(unsafe.Add(unsafe.Pointer(info), off))
}

func socketpair() ([2]int, error) {
	return syscall.Socketpair(syscall.AF_UNIX, syscall.SOCK_STREAM|syscall.SOCK_CLOEXEC, 0)
}

// children lists this process's live children, from every thread's
// /proc/self/task/*/children.
func children() []int {
	files, _ := filepath.Glob("/proc/self/task/*/children")
	var pids []int
	for _, f := range files {
		data, _ := os.ReadFile(f)
		for _, field := range strings.Fields(string(data)) {
			if pid, err := strconv.Atoi(field); err == nil {
				pids = append(pids, pid)
			}
		}
	}
	return pids
}
