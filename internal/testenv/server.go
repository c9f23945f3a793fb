package testenv

import (
	"fmt"
	"os"
	"os/exec"
	"runtime"
	"sync"
	"syscall"
	"time"
)

// Server is one server process that a test runs: an etcd member, a Consul
// agent, postgres, a kube-apiserver, a ZooKeeper JVM, Azurite, ... Every
// server type of this package runs its processes through one, so that
// they all start, wait, stop and die alike:
//   - in a process group of its own, so that a test's signals to a
//     leaderrun's group never reach it;
//   - with a parent-death signal, forked from a thread kept locked for the
//     server's life (see startLocked), so that it dies with the test
//     process even when that is killed or times out;
//   - its stdout and stderr appended to Log, whose end failure messages
//     quote.
//
// Stop, Start and Restart keep Argv, so its ports and data, as an
// operator's restart would. The exported fields are set before the first
// Start and not changed while it runs; the methods are safe for
// concurrent use.
type Server struct {
	// Name names it in messages, e.g. "etcd member m1".
	Name string
	// Argv is its command line. Env, if not nil, is its whole
	// environment; Dir, if not "", its working directory.
	Argv []string
	Env  []string
	Dir  string
	// Log is the file its stdout and stderr are appended to.
	Log string
	// Cred runs it as another user, for a server that refuses to run as
	// root. Zero value: the test's user.
	Cred *syscall.Credential
	// StopSignal is what Stop sends first. Zero value: SIGTERM.
	StopSignal syscall.Signal
	// StopGrace is how long Stop waits for it to exit before SIGKILL.
	// Zero value: 10 s.
	StopGrace time.Duration
	// DeathSignal is what the kernel sends it when the test process dies
	// without stopping it (Linux only). Zero value: SIGKILL.
	DeathSignal syscall.Signal
	// Ready, polled while the server starts, returns nil once it serves
	// (a server in another process offers nothing else to wait on). Zero
	// value: ready once started.
	Ready func() error
	// StartTimeout bounds the wait for Ready. Zero value: 60 s.
	StartTimeout time.Duration

	mu   sync.Mutex
	cmd  *exec.Cmd
	done chan struct{} // closed once cmd has been reaped
}

// readyPoll is how often Start asks Ready.
const readyPoll = 25 * time.Millisecond

// Start starts the server, unless it runs, and waits until it is ready;
// a server that exits meanwhile, or is not ready in time, is an error
// that quotes the end of its log (and the server is stopped).
func (s *Server) Start() error {
	if err := s.Spawn(); err != nil {
		return err
	}
	timeout := s.StartTimeout
	if timeout == 0 {
		timeout = 60 * time.Second
	}
	if err := s.WaitReady(time.Now().Add(timeout)); err != nil {
		s.Kill()
		return err
	}
	return nil
}

// Spawn starts the process, unless it runs, without waiting until it is
// ready: the members of a cluster all run before any of them is.
func (s *Server) Spawn() error {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.cmd != nil {
		select {
		case <-s.done:
		default:
			return nil
		}
	}
	logf, err := os.OpenFile(s.Log, os.O_WRONLY|os.O_CREATE|os.O_APPEND, 0o644)
	if err != nil {
		return fmt.Errorf("start %s: %w", s.Name, err)
	}
	defer logf.Close() // the process has its own descriptor
	cmd := exec.Command(s.Argv[0], s.Argv[1:]...)
	cmd.Env, cmd.Dir = s.Env, s.Dir
	cmd.Stdout, cmd.Stderr = logf, logf
	death := s.DeathSignal
	if death == 0 {
		death = syscall.SIGKILL
	}
	cmd.SysProcAttr = serverAttr(s.Cred, death)
	done, err := startLocked(cmd)
	if err != nil {
		return fmt.Errorf("start %s: %w", s.Name, err)
	}
	s.cmd, s.done = cmd, done
	return nil
}

// WaitReady polls Ready until it returns nil, the process exits or
// deadline passes.
func (s *Server) WaitReady(deadline time.Time) error {
	done := s.Done()
	if done == nil {
		return fmt.Errorf("%s is not running", s.Name)
	}
	for {
		select {
		case <-done:
			return fmt.Errorf("%s exited while starting:\n%s", s.Name, s.Tail())
		default:
		}
		if s.Ready == nil {
			return nil
		}
		err := s.Ready()
		if err == nil {
			return nil
		}
		if time.Now().After(deadline) {
			return fmt.Errorf("%s not ready in time (last: %v):\n%s", s.Name, err, s.Tail())
		}
		time.Sleep(readyPoll)
	}
}

// Stop sends StopSignal, waits up to StopGrace for the server to exit,
// then kills its process group, and returns once it has been reaped.
// Stopping a stopped server does nothing.
func (s *Server) Stop() {
	sig, grace := s.StopSignal, s.StopGrace
	if sig == 0 {
		sig = syscall.SIGTERM
	}
	if grace == 0 {
		grace = 10 * time.Second
	}
	s.Terminate(sig, grace)
}

// Kill kills the server with SIGKILL and returns once it has been
// reaped: nothing it had not written is kept.
func (s *Server) Kill() { s.Terminate(syscall.SIGKILL, 10*time.Second) }

// Terminate sends sig, waits up to grace for the server to exit, then
// kills its process group, and returns once it has been reaped.
func (s *Server) Terminate(sig syscall.Signal, grace time.Duration) {
	s.mu.Lock()
	cmd, done := s.cmd, s.done
	s.cmd, s.done = nil, nil
	s.mu.Unlock()
	if cmd == nil {
		return
	}
	_ = cmd.Process.Signal(sig)
	select {
	case <-done:
		return
	case <-time.After(grace):
	}
	_ = syscall.Kill(-cmd.Process.Pid, syscall.SIGKILL)
	_ = cmd.Process.Kill()
	<-done
}

// Signal sends sig to the running server (SIGSTOP to freeze it, say).
func (s *Server) Signal(sig syscall.Signal) error {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.cmd == nil {
		return fmt.Errorf("%s is not running", s.Name)
	}
	return s.cmd.Process.Signal(sig)
}

// Pid is the server's process id, 0 if it was not started or was
// stopped.
func (s *Server) Pid() int {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.cmd == nil {
		return 0
	}
	return s.cmd.Process.Pid
}

// Running reports whether the process runs: started, not stopped, and
// not exited by itself.
func (s *Server) Running() bool {
	done := s.Done()
	if done == nil {
		return false
	}
	select {
	case <-done:
		return false
	default:
		return true
	}
}

// Done is closed once the process started last has exited and been
// reaped; nil if none was started or it was stopped.
func (s *Server) Done() <-chan struct{} {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.done == nil {
		return nil
	}
	return s.done
}

// Tail is the end of the server's log, for failure messages.
func (s *Server) Tail() string {
	data, _ := os.ReadFile(s.Log)
	if len(data) > 4000 {
		data = data[len(data)-4000:]
	}
	return string(data)
}

// startLocked starts cmd, a server with a parent-death signal, on a thread
// of its own, and returns a channel closed once the server has been
// reaped. The kernel sends the death signal when the thread that forked
// the server ends, not the process, and the Go runtime may end a thread:
// the forking thread is kept, locked, until the server is reaped.
func startLocked(cmd *exec.Cmd) (done chan struct{}, err error) {
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
