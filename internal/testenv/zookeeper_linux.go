package testenv

import "syscall"

// serverProcAttr makes the kernel kill a server when the test process
// dies, even of SIGKILL or a test timeout: a JVM left behind holds a
// hundred megabytes and its ports.
func serverProcAttr() *syscall.SysProcAttr {
	return &syscall.SysProcAttr{Pdeathsig: syscall.SIGKILL}
}
