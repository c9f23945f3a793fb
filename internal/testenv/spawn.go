package testenv

import (
	"os/exec"
	"runtime"
)

// startServer starts cmd, a server with a parent-death signal, on a thread
// of its own, and returns a channel closed once the server has been
// reaped. The kernel sends the death signal when the thread that forked
// the server ends, not the process, and the Go runtime may end a thread:
// the forking thread is kept, locked, until the server is reaped.
func startServer(cmd *exec.Cmd) (done chan struct{}, err error) {
	started := make(chan error, 1)
	reaped := make(chan struct{})
	go func() {
		defer close(reaped)
		runtime.LockOSThread()
		defer runtime.UnlockOSThread()
		err := cmd.Start()
		started <- err
		if err == nil {
			_ = cmd.Wait()
		}
	}()
	if err := <-started; err != nil {
		return nil, err
	}
	return reaped, nil
}
