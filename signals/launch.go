package signals

import (
	"errors"
	"fmt"
	"os"
	"sync"
	"sync/atomic"
	"syscall"

	"github.com/leaderrun/leaderrun/signals/watchdog"
)

// launched is a watchdog started and not yet told anything: its process,
// leaderrun's end of its socket (non-blocking, so that it goes through
// the runtime's poller), and what it was started with.
type launched struct {
	proc  *os.Process
	conn  *os.File
	env   []string
	stdio [3]*os.File
}

var errNoTakeover = errors.New("signals: this binary cannot be its own watchdog: it does not import package takeover")

// launch starts this binary as a watchdog with env and stdio, its fd 3
// the other end of conn, tracked before the orphan reaper can see it.
func launch(stdio [3]*os.File, env []string) (*launched, error) {
	if !watchdog.Installed {
		return nil, errNoTakeover
	}
	// /proc/self/exe where there is one: the very file this process
	// runs, even if an upgrade replaced it on disk since, so that both
	// share its pages.
	self := "/proc/self/exe"
	if _, err := os.Stat(self); err != nil {
		if self, err = os.Executable(); err != nil {
			return nil, fmt.Errorf("find this binary to run as the watchdog: %w", err)
		}
	}
	syscall.ForkLock.RLock() // until the ends are close-on-exec
	fds, err := syscall.Socketpair(syscall.AF_UNIX, syscall.SOCK_STREAM, 0)
	if err == nil {
		syscall.CloseOnExec(fds[0])
		syscall.CloseOnExec(fds[1])
	}
	syscall.ForkLock.RUnlock()
	if err != nil {
		return nil, fmt.Errorf("socketpair: %w", err)
	}
	// Non-blocking, so that our end goes through the poller: a shutdown
	// or close then ends a read in progress.
	_ = syscall.SetNonblock(fds[0], true)
	ours, theirs := os.NewFile(uintptr(fds[0]), "watchdog"), os.NewFile(uintptr(fds[1]), "leaderrun")
	defer theirs.Close()
	tracked.Lock()
	defer tracked.Unlock()
	// In a group of its own, so that nothing meant for leaderrun's group
	// reaches it.
	p, err := os.StartProcess(self, []string{watchdog.ProcessName, watchdog.Arg}, &os.ProcAttr{
		Env:   env,
		Files: []*os.File{stdio[0], stdio[1], stdio[2], theirs},
		Sys:   &syscall.SysProcAttr{Setpgid: true},
	})
	if err != nil {
		ours.Close()
		return nil, fmt.Errorf("start the watchdog (%s): %w", self, err)
	}
	tracked.pids[p.Pid] = true
	return &launched{proc: p, conn: ours, env: env, stdio: stdio}, nil
}

// watchdogEnv is the watchdog's environment: its Go runtime kept small.
// One P (GOMAXPROCS=1): it does one thing at a time. No memory profiling
// (GODEBUG=memprofilerate=0): its buckets are memory touched for nothing.
// GOGC stays at its default: the watchdog allocates a few hundred bytes
// per renewal, and a lower target would run the collector during package
// initialisation, which frees little (0.35 MiB more resident, measured).
// GODEBUG (inittrace) and GORACE (race-enabled tests) are passed on.
func watchdogEnv() []string {
	godebug := "memprofilerate=0"
	if v := os.Getenv("GODEBUG"); v != "" {
		godebug += "," + v
	}
	env := []string{"GOMAXPROCS=1", "GODEBUG=" + godebug}
	if v, ok := os.LookupEnv("GORACE"); ok {
		env = append(env, "GORACE="+v)
	}
	return env
}

// early is the watchdog LaunchWatchdog launched, until Prepare adopts it.
var early atomic.Pointer[launched]

// LaunchWatchdog launches the watchdog of a run cmd has decided on, with
// leaderrun's stdio, to start while leaderrun reads its flags and reaches
// the store; Prepare adopts it (or, if this failed, launches one).
func LaunchWatchdog() {
	if early.Load() != nil {
		return
	}
	if w, err := launch([3]*os.File{os.Stdin, os.Stdout, os.Stderr}, watchdogEnv()); err == nil {
		early.Store(w)
	}
}

// DismissEarly lets go of the watchdog LaunchWatchdog launched, if Prepare
// has not adopted it, for a leaderrun about to become another program
// (execve): its socket closes, so it exits, and the program this process
// becomes reaps it as an orphan (see BecomeSubreaper).
func DismissEarly() {
	if w := early.Swap(nil); w != nil {
		w.conn.Close()
	}
}

// tracked holds the pids of the processes this package waits for itself
// or learns the end of from a watchdog (watchdogs, commands), so that the
// orphan reaper (see BecomeSubreaper) leaves them alone, and a command
// re-parented to leaderrun after its watchdog died is waited for here.
var tracked = struct {
	sync.Mutex
	pids map[int]bool
}{pids: map[int]bool{}}

func track(pid int) {
	tracked.Lock()
	defer tracked.Unlock()
	tracked.pids[pid] = true
}

func untrack(pid int) {
	tracked.Lock()
	defer tracked.Unlock()
	delete(tracked.pids, pid)
}
