package signals

import (
	"bufio"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"os"
	"os/exec"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"time"
)

// Spec describes a command to run.
type Spec struct {
	// Path is the resolved executable (see Resolve); Args is the full argv,
	// Args[0] included.
	Path string
	Args []string
	// Env is the complete environment of the command.
	Env []string
	// KillSignal is sent first when the command is stopped. Zero: SIGTERM.
	KillSignal syscall.Signal
	// KillGrace is how long a stopped command, and anything it leaves in its
	// process group, gets between KillSignal and SIGKILL. Zero: 3 s.
	KillGrace time.Duration
	// Stdin, Stdout, Stderr default to leaderrun's own.
	Stdin          *os.File
	Stdout, Stderr *os.File
	// Log receives one line per signal sent. Zero: slog.Default().
	Log *slog.Logger
}

// Child is a running command under its supervisor.
type Child struct {
	sup  *exec.Cmd
	conn *os.File
	pid  int
	log  *slog.Logger

	done   chan struct{}
	status Status
	err    error // set when the supervisor died without reporting
}

// supervisorEnv carries the supervisor's instructions. It is removed from
// the environment before the command starts.
const supervisorEnv = "_LEADERRUN_SUPERVISOR"

type supervisorConfig struct {
	Path       string        `json:"path"`
	KillSignal int           `json:"kill_signal"`
	KillGrace  time.Duration `json:"kill_grace"`
}

// Supervisor is a supervisor process started ahead of its command. Starting
// it costs a Go binary's start-up; Prepare pays that while the caller
// campaigns, so that winning the lock is followed by nothing slower than a
// fork and exec of the command.
type Supervisor struct {
	spec Spec
	sup  *exec.Cmd
	conn *os.File
	r    *bufio.Reader
}

// Prepare starts the supervisor for spec; spec.Env is ignored, the
// command's environment is given to Start. Call Start or Abort exactly once.
func Prepare(spec Spec) (*Supervisor, error) {
	if spec.KillSignal == 0 {
		spec.KillSignal = syscall.SIGTERM
	}
	if spec.KillGrace == 0 {
		spec.KillGrace = 3 * time.Second
	}
	if spec.Log == nil {
		spec.Log = slog.Default()
	}
	self, err := executable()
	if err != nil {
		return nil, fmt.Errorf("find own executable for the supervisor: %w", err)
	}
	cfg, _ := json.Marshal(supervisorConfig{Path: spec.Path, KillSignal: int(spec.KillSignal), KillGrace: spec.KillGrace})

	fds, err := socketpair()
	if err != nil {
		return nil, fmt.Errorf("socketpair: %w", err)
	}
	ours := os.NewFile(uintptr(fds[0]), "supervisor")
	theirs := os.NewFile(uintptr(fds[1]), "leaderrun")
	defer theirs.Close()

	sup := &exec.Cmd{
		Path:       self,
		Args:       append([]string{"leaderrun-supervisor"}, spec.Args...),
		Env:        append(os.Environ(), supervisorEnv+"="+string(cfg)),
		Stdin:      orDefault(spec.Stdin, os.Stdin),
		Stdout:     orDefault(spec.Stdout, os.Stdout),
		Stderr:     orDefault(spec.Stderr, os.Stderr),
		ExtraFiles: []*os.File{theirs},
		// Its own process group: a Ctrl-C meant for leaderrun must not
		// reach the supervisor behind leaderrun's back.
		SysProcAttr: &syscall.SysProcAttr{Setpgid: true},
	}
	if err := startTracked(sup); err != nil {
		ours.Close()
		return nil, fmt.Errorf("start supervisor %s: %w", self, err)
	}
	return &Supervisor{spec: spec, sup: sup, conn: ours, r: bufio.NewReader(ours)}, nil
}

// Abort kills an unused supervisor and reaps it. It has started nothing.
func (s *Supervisor) Abort() {
	_ = s.sup.Process.Kill()
	s.conn.Close()
	_ = s.sup.Wait()
	untrack(s.sup)
}

// Start tells the supervisor to run the command with env, and returns once
// the command has been forked and exec'd, or has failed to be: an exec
// failure is an error wrapping ErrNotFound or ErrNotExecutable.
func (s *Supervisor) Start(env []string) (*Child, error) {
	c := &Child{sup: s.sup, conn: s.conn, log: s.spec.Log, done: make(chan struct{})}
	msg, _ := json.Marshal(goMessage{Env: env})
	if _, err := fmt.Fprintf(s.conn, "go %s\n", msg); err != nil {
		c.reap()
		return nil, fmt.Errorf("instruct supervisor: %w", err)
	}
	line, err := s.r.ReadString('\n')
	kind, arg, _ := strings.Cut(strings.TrimSpace(line), " ")
	switch {
	case err == nil && kind == "started":
		c.pid, _ = strconv.Atoi(arg)
	case err == nil && kind == "error":
		c.reap()
		code, msg, _ := strings.Cut(arg, " ")
		switch code {
		case "notfound":
			return nil, &ExecError{Command: s.spec.Path, Reason: msg, Err: ErrNotFound}
		case "notexec":
			return nil, &ExecError{Command: s.spec.Path, Reason: msg, Err: ErrNotExecutable}
		}
		return nil, errors.New(msg)
	default:
		c.reap()
		return nil, fmt.Errorf("supervisor failed before starting the command: %q: %v", line, err)
	}
	go c.watch(s.r)
	return c, nil
}

// goMessage is leaderrun's one instruction to its supervisor: run the
// command now, with this environment.
type goMessage struct {
	Env []string `json:"env"`
}

func orDefault(f, def *os.File) *os.File {
	if f != nil {
		return f
	}
	return def
}

// watch reads the supervisor's final report, reaps it and closes done.
func (c *Child) watch(r *bufio.Reader) {
	defer close(c.done)
	line, _ := r.ReadString('\n')
	kind, arg, _ := strings.Cut(strings.TrimSpace(line), " ")
	n, convErr := strconv.Atoi(arg)
	switch {
	case kind == "exit" && convErr == nil:
		c.status = Status{Code: n}
	case kind == "signal" && convErr == nil:
		c.status = Status{Signal: syscall.Signal(n)}
	default:
		// The supervisor died without a word (someone killed it): make sure
		// nothing of the command survives it.
		_ = syscall.Kill(-c.pid, syscall.SIGKILL)
		c.status = Status{Signal: syscall.SIGKILL}
		c.err = fmt.Errorf("supervisor of pid %d died without reporting", c.pid)
	}
	c.reap()
}

func (c *Child) reap() {
	c.conn.Close()
	_ = c.sup.Wait()
	untrack(c.sup)
}

// Pid is the command's pid, which is also its process group id.
func (c *Child) Pid() int { return c.pid }

// Done is closed once the command and its process group are gone and the
// supervisor has been reaped.
func (c *Child) Done() <-chan struct{} { return c.done }

// Wait blocks until Done and returns how the command ended.
func (c *Child) Wait() (Status, error) {
	<-c.done
	return c.status, c.err
}

// Signal sends sig to the command's whole process group.
func (c *Child) Signal(sig syscall.Signal) error {
	select {
	case <-c.done:
		return nil
	default:
	}
	err := syscall.Kill(-c.pid, sig)
	if sig != syscall.SIGKILL && sig != syscall.SIGCONT && err == nil {
		// A stopped group (SIGSTOP, or SIGTTIN from reading a terminal it
		// does not own) would sit on the signal until SIGKILL: wake it,
		// as systemd does.
		_ = syscall.Kill(-c.pid, syscall.SIGCONT)
	}
	c.log.Info("signalled child", "pid", c.pid, "signal", Name(sig))
	if errors.Is(err, syscall.ESRCH) {
		return nil
	}
	return err
}

// Name is a signal's conventional name, SIGTERM rather than "terminated".
func Name(sig syscall.Signal) string {
	for name, s := range byName {
		if s == sig {
			return "SIG" + name
		}
	}
	return strconv.Itoa(int(sig))
}

// ExecError is a command that cannot be run. It unwraps to ErrNotFound or
// ErrNotExecutable.
type ExecError struct {
	Command string
	Reason  string // as a shell would say it: "command not found", "permission denied"
	Err     error
}

func (e *ExecError) Error() string { return e.Command + ": " + e.Reason }
func (e *ExecError) Unwrap() error { return e.Err }

// Resolve finds the executable for name the way a shell would, and reports
// ErrNotFound (exit 127) or ErrNotExecutable (exit 126) before anything is
// started, so that a typo in a crontab line never takes leadership.
func Resolve(name string) (string, error) {
	notFound := &ExecError{Command: name, Reason: "command not found", Err: ErrNotFound}
	if name == "" {
		return "", notFound
	}
	path, err := exec.LookPath(name)
	if err == nil {
		return path, nil
	}
	if strings.Contains(name, "/") {
		fi, serr := os.Stat(name)
		switch {
		case serr != nil:
			return "", &ExecError{Command: name, Reason: "no such file", Err: ErrNotFound}
		case fi.IsDir():
			return "", &ExecError{Command: name, Reason: "is a directory", Err: ErrNotExecutable}
		default:
			return "", &ExecError{Command: name, Reason: "permission denied", Err: ErrNotExecutable}
		}
	}
	if errors.Is(err, exec.ErrNotFound) {
		// A match in PATH without the execute bit is "permission denied" to
		// a shell, not "not found".
		for _, dir := range strings.Split(os.Getenv("PATH"), ":") {
			if dir == "" {
				dir = "."
			}
			if fi, serr := os.Stat(dir + "/" + name); serr == nil && !fi.IsDir() {
				return "", &ExecError{Command: dir + "/" + name, Reason: "permission denied", Err: ErrNotExecutable}
			}
		}
	}
	return "", notFound
}

// tracked holds the pids of supervisors this process waits for itself, so
// that the orphan reaper (see BecomeSubreaper) leaves them alone.
var tracked struct {
	sync.Mutex
	pids map[int]bool
}

func startTracked(cmd *exec.Cmd) error {
	tracked.Lock()
	defer tracked.Unlock()
	if err := cmd.Start(); err != nil {
		return err
	}
	if tracked.pids == nil {
		tracked.pids = map[int]bool{}
	}
	tracked.pids[cmd.Process.Pid] = true
	return nil
}

func untrack(cmd *exec.Cmd) {
	tracked.Lock()
	defer tracked.Unlock()
	if cmd.Process != nil {
		delete(tracked.pids, cmd.Process.Pid)
	}
}
