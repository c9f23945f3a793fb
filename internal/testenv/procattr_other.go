//go:build !linux

package testenv

import "syscall"

// dieWithParent is Linux only; elsewhere a shared server outlives a test
// process that dies without stopping it.
func dieWithParent() *syscall.SysProcAttr { return nil }

// withParentDeathSignal: there is no parent-death signal here.
func withParentDeathSignal(*syscall.SysProcAttr, syscall.Signal) {}
