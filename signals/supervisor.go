package signals

import (
	"bufio"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"os"
	"os/signal"
	"runtime"
	"strings"
	"syscall"
	"time"
)

// IsSupervisor reports whether this process was started by Start as a
// command's supervisor. main must then call Supervise and nothing else.
func IsSupervisor() bool {
	_, ok := os.LookupEnv(supervisorEnv)
	return ok
}

// Supervise is the whole life of a supervisor process. It waits for
// leaderrun's word (a "go" line with the command's environment; if the
// socket closes first, it exits), starts the command as the leader of a new
// process group, with SIGKILL as its parent-death signal, and then:
//   - if leaderrun goes away (its socket end closes: exit, crash, SIGKILL),
//     it kills the whole group with SIGKILL and exits;
//   - when the command exits, it stops whatever the command left running in
//     its group (kill signal, grace, SIGKILL), since nothing may run once the
//     lease is released;
//   - it reports how the command ended on the socket and exits 0.
//
// The supervisor is a subreaper, so orphaned grandchildren are reparented
// to it and reaped.
func Supervise() int {
	var cfg supervisorConfig
	if err := json.Unmarshal([]byte(os.Getenv(supervisorEnv)), &cfg); err != nil {
		fmt.Fprintf(os.Stderr, "leaderrun-supervisor: bad configuration: %v\n", err)
		return 70
	}
	// The socket must not leak into the command: a child could write a
	// fake report on it, and grandchildren holding it open would hide the
	// supervisor's death from leaderrun.
	syscall.CloseOnExec(3)
	conn := os.NewFile(3, "leaderrun")
	report := func(format string, args ...any) {
		_, _ = fmt.Fprintf(conn, format+"\n", args...)
	}
	_ = becomeSubreaper()

	// The command gets its signals from leaderrun, and under systemd's
	// KillMode=control-group from systemd as well; a third copy from us
	// would make many programs quit at once rather than shut down. So the
	// supervisor swallows what is sent to it. Notify, not Ignore: ignored
	// signals would stay ignored in the command across exec.
	swallowed := make(chan os.Signal, 8)
	signal.Notify(swallowed, append(Forwarded, syscall.SIGPIPE)...)
	go func() {
		for range swallowed {
		}
	}()

	// Wait for the word to start. Leaderrun closing its end first means it
	// did not win, or died: there is nothing to do.
	r := bufio.NewReader(conn)
	line, err := r.ReadString('\n')
	kind, arg, _ := strings.Cut(strings.TrimSpace(line), " ")
	var msg goMessage
	if err != nil || kind != "go" || json.Unmarshal([]byte(arg), &msg) != nil {
		return 0
	}

	// Pdeathsig belongs to the forking thread, not the process: keep this
	// goroutine on its thread for the supervisor's whole life so that the
	// thread cannot exit and fire it early.
	runtime.LockOSThread()
	pid, err := syscall.ForkExec(cfg.Path, os.Args[1:], &syscall.ProcAttr{
		Env:   msg.Env,
		Files: []uintptr{0, 1, 2},
		Sys:   childAttr(),
	})
	if err != nil {
		kind := "other"
		switch {
		case errors.Is(err, syscall.ENOENT):
			kind = "notfound"
		case errors.Is(err, syscall.EACCES), errors.Is(err, syscall.EPERM),
			errors.Is(err, syscall.ENOEXEC), errors.Is(err, syscall.EISDIR):
			kind = "notexec"
		}
		report("error %s %v", kind, err)
		return 0
	}
	report("started %d", pid)

	go func() {
		// The only thing leaderrun ever writes is nothing: a read returns
		// when its end closes.
		_, _ = io.Copy(io.Discard, r)
		_ = syscall.Kill(-pid, syscall.SIGKILL)
		for _, k := range children() {
			killTree(k, syscall.SIGKILL)
		}
		os.Exit(1)
	}()

	var ws syscall.WaitStatus
	for {
		wpid, err := syscall.Wait4(-1, &ws, 0, nil)
		if errors.Is(err, syscall.EINTR) {
			continue
		}
		if err != nil || wpid == pid {
			break
		}
	}
	status := statusOf(ws)
	clearGroup(pid, syscall.Signal(cfg.KillSignal), cfg.KillGrace)
	clearEscapees(syscall.Signal(cfg.KillSignal), cfg.KillGrace)
	if status.Signal != 0 {
		report("signal %d", int(status.Signal))
	} else {
		report("exit %d", status.Code)
	}
	return 0
}

// clearGroup stops what is left in process group pgid after its leader
// exited: kill signal, up to grace, SIGKILL.
func clearGroup(pgid int, sig syscall.Signal, grace time.Duration) {
	if !groupAlive(pgid) {
		return
	}
	_ = syscall.Kill(-pgid, sig)
	_ = syscall.Kill(-pgid, syscall.SIGCONT)
	if waitGroup(pgid, time.Now().Add(grace)) {
		return
	}
	_ = syscall.Kill(-pgid, syscall.SIGKILL)
	waitGroup(pgid, time.Now().Add(10*time.Second))
}

// waitGroup reaps what it can and reports whether the group emptied before
// the deadline. Members are not all our children, so there is no single
// wait to block on; a short poll is the simplest correct thing here.
func waitGroup(pgid int, deadline time.Time) bool {
	for groupAlive(pgid) {
		if time.Now().After(deadline) {
			return false
		}
		reapAll()
		time.Sleep(5 * time.Millisecond)
	}
	return true
}

func groupAlive(pgid int) bool {
	return syscall.Kill(-pgid, 0) == nil
}

// Forwarded are the signals that leaderrun passes on to the command's
// process group as they are (S6). SIGTERM and SIGINT also start the stop
// sequence in the runner.
var Forwarded = []os.Signal{
	syscall.SIGHUP, syscall.SIGINT, syscall.SIGQUIT, syscall.SIGTERM,
	syscall.SIGUSR1, syscall.SIGUSR2, syscall.SIGWINCH,
}

// clearEscapees stops descendants that left the command's process group
// (setsid, setpgid) once their parents are gone: as a subreaper the
// supervisor inherits them as children, and nothing may run on after the
// lease is released. Kill signal, up to grace, then SIGKILL.
func clearEscapees(sig syscall.Signal, grace time.Duration) {
	deadline := time.Now().Add(grace)
	signalled := map[int]bool{}
	for give := time.Now().Add(grace + 10*time.Second); time.Now().Before(give); {
		reapAll()
		kids := children()
		if len(kids) == 0 {
			return
		}
		for _, k := range kids {
			switch {
			case time.Now().After(deadline):
				killTree(k, syscall.SIGKILL)
			case !signalled[k]:
				signalled[k] = true
				killTree(k, sig)
				killTree(k, syscall.SIGCONT)
			}
		}
		time.Sleep(5 * time.Millisecond)
	}
}

// killTree signals pid, and its process group if it leads one.
func killTree(pid int, sig syscall.Signal) {
	_ = syscall.Kill(pid, sig)
	if pgid, err := syscall.Getpgid(pid); err == nil && pgid == pid {
		_ = syscall.Kill(-pid, sig)
	}
}

func reapAll() {
	var ws syscall.WaitStatus
	for {
		if wpid, err := syscall.Wait4(-1, &ws, syscall.WNOHANG, nil); wpid <= 0 || err != nil {
			return
		}
	}
}
