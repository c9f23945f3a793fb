package testenv

import "syscall"

// dieWithParent makes the kernel kill a server if the test process dies
// without stopping it (a test timeout, a panic), for the servers that a
// package's tests share and that no test's cleanup owns. The signal is tied
// to the forking thread, which the Go runtime keeps alive unless a goroutine
// locked to it exits; no test helper here locks threads.
func dieWithParent() *syscall.SysProcAttr {
	return &syscall.SysProcAttr{Pdeathsig: syscall.SIGKILL}
}

// withParentDeathSignal has the kernel send sig to the process that attr
// starts if the test process dies first.
func withParentDeathSignal(attr *syscall.SysProcAttr, sig syscall.Signal) {
	attr.Pdeathsig = sig
}
