//go:build linux

package e2e

import (
	"bytes"
	"errors"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"syscall"
	"testing"
	"time"

	"github.com/leaderrun/leaderrun/internal/testenv"
)

// proc is one leaderrun process, in a process group of its own so that a
// test can pause or kill the group as a whole.
type proc struct {
	t      testing.TB
	cmd    *exec.Cmd
	stderr *syncBuffer
	done   chan struct{}
	code   int
}

type syncBuffer = testenv.LockedBuffer

// childEnv is the environment that makes the test binary act as the child
// in mode (see childMain), recording to events.
func childEnv(events, mode string) []string {
	// Under -race the child is a race-enabled binary, which by default
	// sleeps 1 s at exit (atexit_sleep_ms) and would look like a child that
	// ignores its kill signal.
	return []string{"E2E_CHILD=" + mode, "E2E_EVENTS=" + events, "GORACE=atexit_sleep_ms=0"}
}

func childArgv(t testing.TB) []string {
	self, err := os.Executable()
	if err != nil {
		t.Fatal(err)
	}
	return []string{self}
}

// start runs leaderrun with args, with env added to the test's environment.
func start(t testing.TB, env []string, args ...string) *proc {
	t.Helper()
	return startProgram(t, env, testenv.Leaderrun(t), args...)
}

// startProgram is start for another program, such as a wrapper that
// execs leaderrun in the end (the process is the same).
func startProgram(t testing.TB, env []string, program string, args ...string) *proc {
	t.Helper()
	cmd := exec.Command(program, args...)
	cmd.Env = append(os.Environ(), env...)
	p := &proc{t: t, cmd: cmd, stderr: &syncBuffer{}, done: make(chan struct{})}
	cmd.Stderr = p.stderr
	cmd.Stdout = p.stderr
	cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true}
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	go func() {
		defer close(p.done)
		err := cmd.Wait()
		var ee *exec.ExitError
		switch {
		case err == nil:
		case errors.As(err, &ee):
			p.code = ee.ExitCode()
			if ws, ok := ee.Sys().(syscall.WaitStatus); ok && ws.Signaled() {
				p.code = 128 + int(ws.Signal())
			}
		default:
			p.code = -1
		}
	}()
	t.Cleanup(func() {
		select {
		case <-p.done:
		default:
			_ = syscall.Kill(-cmd.Process.Pid, syscall.SIGKILL)
			<-p.done
		}
		if t.Failed() {
			t.Logf("leaderrun %v output:\n%s", args, p.stderr.String())
		}
	})
	return p
}

// wait returns the exit code, failing the test after timeout.
func (p *proc) wait(timeout time.Duration) int {
	p.t.Helper()
	select {
	case <-p.done:
		return p.code
	case <-time.After(timeout):
		p.t.Fatalf("leaderrun still running after %v; output:\n%s", timeout, p.stderr.String())
		return -1
	}
}

func (p *proc) exited() bool {
	select {
	case <-p.done:
		return true
	default:
		return false
	}
}

func (p *proc) signal(sig syscall.Signal) {
	p.t.Helper()
	if err := p.cmd.Process.Signal(sig); err != nil {
		p.t.Fatalf("signal %v: %v", sig, err)
	}
}

// signalIfRunning is signal for a process that may have exited meanwhile:
// one already finished is no error.
func (p *proc) signalIfRunning(sig syscall.Signal) {
	p.t.Helper()
	if err := p.cmd.Process.Signal(sig); err != nil && !errors.Is(err, os.ErrProcessDone) {
		p.t.Fatalf("signal %v: %v", sig, err)
	}
}

func (p *proc) pid() int { return p.cmd.Process.Pid }

// alive reports whether pid exists and is not a zombie.
func alive(pid int) bool {
	if syscall.Kill(pid, 0) != nil {
		return false
	}
	data, err := os.ReadFile(filepath.Join("/proc", strconv.Itoa(pid), "stat"))
	if err != nil {
		return false
	}
	// Field 3 is the state; Z is a zombie.
	i := bytes.LastIndexByte(data, ')')
	return i < 0 || i+2 >= len(data) || data[i+2] != 'Z'
}

// output runs leaderrun to the end; see outputEnv.
func output(t *testing.T, args ...string) (string, int) {
	t.Helper()
	return outputEnv(t, nil, args...)
}

// outputEnv runs leaderrun, with env added to the test's environment, to
// the end and returns what a script reads from it, and its exit code. An
// answer (exit 0, or 3: status found no leader) is its stdout alone, what
// a script parses; a line it logged on stderr beside it (a store client's
// warning, say) goes to the test's log instead. A failure is its stdout,
// then its stderr.
func outputEnv(t *testing.T, env []string, args ...string) (string, int) {
	t.Helper()
	cmd := exec.Command(testenv.Leaderrun(t), args...)
	cmd.Env = append(os.Environ(), env...)
	var stderr syncBuffer
	cmd.Stderr = &stderr
	out, err := cmd.Output()
	code := 0
	var ee *exec.ExitError
	switch {
	case errors.As(err, &ee):
		code = ee.ExitCode()
	case err != nil:
		t.Fatalf("leaderrun %v: %v", args, err)
	}
	if code != 0 && code != 3 {
		return string(out) + stderr.String(), code
	}
	if stderr.String() != "" {
		t.Logf("leaderrun %v (exit %d) logged:\n%s", args, code, stderr.String())
	}
	return string(out), code
}
