package signals

import (
	"errors"
	"fmt"
	"os"
	"sync/atomic"
	"syscall"

	"github.com/leaderrun/leaderrun/signals/watchdog"
)

// The watchdog's launch: early, by cmd, once it has decided that the
// command line is a run (LaunchWatchdog), so that the watchdog starts
// while leaderrun reads its flags and reaches the store; or by Prepare,
// for any other caller.

// launched is a watchdog that was started and not yet told anything: its
// process (in a process group of its own), leaderrun's end of its socket
// (close-on-exec, non-blocking: it goes through the runtime's poller),
// and what it was started with.
type launched struct {
	proc  *os.Process
	conn  *os.File
	env   []string
	stdio [3]*os.File
}

var errNoTakeover = errors.New("signals: this binary cannot be its own watchdog: it does not import package takeover")

// launch starts this binary as a watchdog with env and stdio, tracked
// (see BecomeSubreaper) before the orphan reaper can see it exit. Its fd
// 3 is the other end of conn.
func launch(stdio [3]*os.File, env []string) (*launched, error) {
	if !watchdog.Installed {
		return nil, errNoTakeover
	}
	self, err := executable()
	if err != nil {
		return nil, fmt.Errorf("find this binary to run as the watchdog: %w", err)
	}
	fds, err := socketpair()
	if err != nil {
		return nil, fmt.Errorf("socketpair: %w", err)
	}
	// Non-blocking, so that our end goes through the poller: a shutdown
	// or close then ends a read in progress.
	if err := syscall.SetNonblock(fds[0], true); err != nil {
		syscall.Close(fds[0])
		syscall.Close(fds[1])
		return nil, fmt.Errorf("socketpair: %w", err)
	}
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
// One P (GOMAXPROCS=1): it has one thing to do at a time. No memory
// profiling (GODEBUG=memprofilerate=0): nobody reads the profile, and its
// buckets are memory touched for nothing. GOGC is left at its default on
// purpose: the watchdog allocates a few hundred bytes per renewal, so its
// collector runs rarely, and a lower target would only make it run during
// package initialisation, which frees little (the packages keep what they
// allocate) and touches the collector's own structures: measured, 0.35
// MiB more resident with the stores' clients linked, when it was tried.
// GODEBUG is passed on, so that GODEBUG=inittrace=1 shows the watchdog's
// start too, and GORACE for race-enabled test binaries.
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

// LaunchWatchdog launches the watchdog of a run that cmd has decided on,
// with leaderrun's own standard input, output and error, so that it starts
// while leaderrun reads its flags and reaches the store; Prepare adopts
// it. A launch that fails is left to Prepare to try again.
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
// (execve): its socket is closed, so that it exits, and nothing waits for
// that; the program this process becomes reaps it as an orphan (see
// BecomeSubreaper).
func DismissEarly() {
	if w := early.Swap(nil); w != nil {
		w.conn.Close()
	}
}
