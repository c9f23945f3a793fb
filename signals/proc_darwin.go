//go:build darwin

package signals

import (
	"os"
	"sync/atomic"
	"syscall"

	"golang.org/x/sys/unix"
)

// childAttr puts the command into process group pgid. Without a
// parent-death signal, the watchdog alone kills the group when leaderrun
// dies.
func childAttr(pgid int) *syscall.SysProcAttr {
	return &syscall.SysProcAttr{Setpgid: true, Pgid: pgid}
}

func executable() (string, error) { return os.Executable() }

// BecomeSubreaper is a no-op where the OS has no subreapers.
func BecomeSubreaper() error { return nil }

func reapOrphans() []int { return nil }

func socketpair() ([2]int, error) {
	syscall.ForkLock.RLock()
	defer syscall.ForkLock.RUnlock()
	fds, err := syscall.Socketpair(syscall.AF_UNIX, syscall.SOCK_STREAM, 0)
	if err == nil {
		syscall.CloseOnExec(fds[0])
		syscall.CloseOnExec(fds[1])
	}
	return fds, err
}

// subreaper stays false: without subreapers, orphans are not ours, and
// descendants that left the command's group are not tracked here.
var subreaper atomic.Bool

func children() []int { return nil }

// groupMembers lists the processes of process group pgid (kern.proc.pgrp).
func groupMembers(pgid int) []int {
	procs, _ := unix.SysctlKinfoProcSlice("kern.proc.pgrp", pgid)
	var pids []int
	for _, p := range procs {
		if p.Proc.P_stat != 5 { // SZOMB
			pids = append(pids, int(p.Proc.P_pid))
		}
	}
	return pids
}
