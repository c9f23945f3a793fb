package testenv

import "syscall"

// serverAttr starts a server in a process group of its own, as cred if
// not nil, with death as its parent-death signal: the kernel sends it when
// the thread that forked the server ends (see startLocked).
func serverAttr(cred *syscall.Credential, death syscall.Signal) *syscall.SysProcAttr {
	return &syscall.SysProcAttr{Setpgid: true, Credential: cred, Pdeathsig: death}
}
