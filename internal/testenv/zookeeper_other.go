//go:build !linux

package testenv

import "syscall"

// serverProcAttr: only Linux can tie a server's life to the test process.
func serverProcAttr() *syscall.SysProcAttr { return nil }
