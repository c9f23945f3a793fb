//go:build !linux

package testenv

import "syscall"

// serverAttr starts a server in a process group of its own, as cred if
// not nil. There is no parent-death signal here: a server outlives a test
// process that dies without stopping it.
func serverAttr(cred *syscall.Credential, _ syscall.Signal) *syscall.SysProcAttr {
	return &syscall.SysProcAttr{Setpgid: true, Credential: cred}
}
