package bench

import (
	"bufio"
	"encoding/json"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"syscall"
	"time"
)

// proc is one wrapper process (or, for the baseline, the child itself)
// started by the benchmark, in a process group of its own so that no
// signal meant for the benchmark reaches it.
type proc struct {
	tag  string
	cmd  *exec.Cmd
	log  string
	t0   time.Duration // mono() just before the fork
	wall time.Time     // the wall clock at t0, for leaderrun's log timestamps
	done chan struct{} // closed once reaped
	exit time.Duration // mono() when reaped
	addr string        // the store address it was given
}

// spawn starts tl's argv as the process tagged tag, with the child's
// environment for tag. hold: the child runs until signalled; otherwise
// it exits as soon as it has reported. An elector's events on its
// standard output are reported to the hub as its child's would be.
func (b *bench) spawn(tl *tool, argv []string, tag string, hold bool) (*proc, error) {
	p := &proc{tag: tag, log: filepath.Join(b.logDir, tag+".log"), done: make(chan struct{})}
	logf, err := os.Create(p.log)
	if err != nil {
		return nil, err
	}
	defer logf.Close()
	env := append(b.baseEnv(), envSock+"="+b.sock, envTag+"="+tag)
	if hold {
		env = append(env, envHold+"=1")
	}
	p.cmd = exec.Command(argv[0], argv[1:]...)
	p.cmd.Env = append(env, tl.env...)
	p.cmd.Stderr = logf
	var events io.ReadCloser
	if tl.elector {
		if events, err = p.cmd.StdoutPipe(); err != nil {
			return nil, err
		}
	} else {
		p.cmd.Stdout = logf
	}
	p.cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true}
	p.t0, p.wall = mono(), time.Now()
	if err := p.cmd.Start(); err != nil {
		return nil, fmt.Errorf("start %s: %w", argv[0], err)
	}
	b.track(p)
	read := make(chan struct{})
	if events != nil {
		go func() {
			defer close(read)
			b.electorEvents(p, events, hold)
		}()
	} else {
		close(read)
	}
	go func() {
		<-read // Wait closes the pipe: read it to its end first
		_ = p.cmd.Wait()
		p.exit = mono()
		if tl.elector {
			b.hub.report(tag, p.pid(), "exit", p.exit, "")
		}
		close(p.done)
	}()
	return p, nil
}

// electorEvents turns the client-go elector's lines ("started NS",
// "stopped NS", "leader NS ID", with the wall clock in Unix nanoseconds)
// into the events of a child on the hub, on the monotonic clock: started
// is its child's start, stopped its signal. Without hold, an elector
// that started leading is told to stop (SIGTERM), as a child that exits
// at once would end a run.
func (b *bench) electorEvents(p *proc, r io.Reader, hold bool) {
	sc := bufio.NewScanner(r)
	for sc.Scan() {
		f := strings.Fields(sc.Text())
		if len(f) < 2 {
			continue
		}
		ns, err := strconv.ParseInt(f[1], 10, 64)
		if err != nil {
			continue
		}
		at := p.t0 + time.Unix(0, ns).Sub(p.wall)
		switch f[0] {
		case "started":
			b.hub.report(p.tag, p.pid(), "start", at, "")
			if !hold {
				p.signal(syscall.SIGTERM)
			}
		case "stopped":
			b.hub.report(p.tag, p.pid(), "sig", at, "(leading context ended)")
		case "leader":
			b.hub.report(p.tag, p.pid(), "leader", at, "")
		}
	}
}

// baseEnv is the benchmark's environment without anything that would
// change what a wrapper connects to or how it behaves.
func (b *bench) baseEnv() []string {
	var env []string
	for _, kv := range os.Environ() {
		name, _, _ := strings.Cut(kv, "=")
		switch {
		case strings.HasPrefix(name, "LEADERRUN_"), strings.HasPrefix(name, "ETCDCTL_"),
			strings.HasPrefix(name, "CONSUL_"), strings.HasPrefix(name, "BENCH_"),
			name == "NOTIFY_SOCKET", name == "SHELL":
			continue
		}
		env = append(env, kv)
	}
	return env
}

func (p *proc) pid() int { return p.cmd.Process.Pid }

func (p *proc) exited() bool {
	select {
	case <-p.done:
		return true
	default:
		return false
	}
}

// waitExit waits up to timeout for p to be reaped.
func (p *proc) waitExit(timeout time.Duration) bool {
	select {
	case <-p.done:
		return true
	case <-time.After(timeout):
		return false
	}
}

func (p *proc) signal(sig syscall.Signal) { _ = syscall.Kill(p.pid(), sig) }

// stop sends sig to the wrapper alone and waits up to grace for it to
// exit, then kills its whole tree.
func (p *proc) stop(sig syscall.Signal, grace time.Duration) {
	if p.exited() {
		return
	}
	p.signal(sig)
	if !p.waitExit(grace) {
		p.kill()
	}
}

// kill SIGKILLs p's process group and every descendant with its group
// (leaderrun's watchdog leads its command's), and waits for p.
func (p *proc) kill() {
	if p.exited() {
		return
	}
	pids := descendants(p.pid())
	_ = syscall.Kill(-p.pid(), syscall.SIGKILL)
	for _, d := range pids {
		_ = syscall.Kill(-d, syscall.SIGKILL)
		_ = syscall.Kill(d, syscall.SIGKILL)
	}
	p.waitExit(10 * time.Second)
}

// tail is the end of p's output, for error messages.
func (p *proc) tail() string {
	data, _ := os.ReadFile(p.log)
	if len(data) > 2000 {
		data = data[len(data)-2000:]
	}
	return string(data)
}

// logged reports whether p's output has a line containing msg.
func (p *proc) logged(msg string) bool {
	data, _ := os.ReadFile(p.log)
	return strings.Contains(string(data), msg)
}

// logTimes reads the time of the first JSON log line with each message
// in msgs from p's output (leaderrun with --log-format json).
func (p *proc) logTimes(msgs ...string) map[string]time.Time {
	out := map[string]time.Time{}
	data, _ := os.ReadFile(p.log)
	for _, line := range strings.Split(string(data), "\n") {
		var ev struct {
			Time time.Time
			Msg  string
		}
		if json.Unmarshal([]byte(line), &ev) != nil {
			continue
		}
		if _, seen := out[ev.Msg]; !seen && slices.Contains(msgs, ev.Msg) {
			out[ev.Msg] = ev.Time
		}
	}
	return out
}

// children lists pid's children.
func children(pid int) []int {
	var out []int
	files, _ := filepath.Glob(filepath.Join("/proc", strconv.Itoa(pid), "task", "*", "children"))
	for _, f := range files {
		data, _ := os.ReadFile(f)
		for _, s := range strings.Fields(string(data)) {
			if c, err := strconv.Atoi(s); err == nil {
				out = append(out, c)
			}
		}
	}
	return out
}

// descendants lists pid's descendants, parents before their children.
func descendants(pid int) []int {
	var out []int
	for _, c := range children(pid) {
		out = append(out, c)
		out = append(out, descendants(c)...)
	}
	return out
}

// alive reports whether pid exists and is not a zombie.
func alive(pid int) bool {
	data, err := os.ReadFile(filepath.Join("/proc", strconv.Itoa(pid), "stat"))
	if err != nil {
		return false
	}
	s := string(data)
	if i := strings.LastIndexByte(s, ')'); i >= 0 && i+2 < len(s) {
		return s[i+2] != 'Z'
	}
	return true
}

// argv0 is the base name of pid's argv[0] (leaderrun's watchdog calls
// itself leaderrun-watchdog).
func argv0(pid int) string {
	data, _ := os.ReadFile(filepath.Join("/proc", strconv.Itoa(pid), "cmdline"))
	first, _, _ := strings.Cut(string(data), "\x00")
	return filepath.Base(first)
}
