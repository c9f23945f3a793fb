package watchdog

import (
	"fmt"
	"os"
	"strings"
	"sync/atomic"
	"syscall"
)

// The watchdog's launch, and its early launch from leaderrun's own start.
//
// leaderrun needs its watchdog ready the moment it leads. Launched when
// the runner is built, just before the campaign, its start (exec, the Go
// runtime, its packages' initialisation: some 16 ms on a busy host) raced
// the campaign, and on a free lock, whose campaign is one round trip, the
// command's fork waited for it. So when leaderrun's arguments look like a
// run, this package's init launches the watchdog before anything else of
// leaderrun is initialised: its start then overlaps with the
// initialisation of the stores' clients, the reading of the flags and the
// connection to the store. signals.Prepare adopts it (Adopt), or, for
// anything else, launches one as before (Launch).

// Launched is a watchdog that was started and not yet told anything: its
// process (in a process group of its own) and leaderrun's end of its
// socket (close-on-exec, non-blocking: it goes through the runtime's
// poller).
type Launched struct {
	Proc  *os.Process
	Conn  *os.File
	Env   []string    // the environment it was given (see Env)
	Stdio [3]*os.File // its standard input, output and error
}

// Launch starts self as a watchdog with env and stdio. Its fd 3 is the
// other end of Conn. Until it reads a MsgConfig it logs only errors, as
// text, and catches only the forwarded signals and SIGPIPE.
func Launch(self string, stdio [3]*os.File, env []string) (*Launched, error) {
	fds, err := socketpair()
	if err != nil {
		return nil, fmt.Errorf("socketpair: %w", err)
	}
	// Non-blocking, so that our end goes through the poller: closing it
	// then ends a read in progress instead of waiting for it.
	if err := syscall.SetNonblock(fds[0], true); err != nil {
		syscall.Close(fds[0])
		syscall.Close(fds[1])
		return nil, fmt.Errorf("socketpair: %w", err)
	}
	ours, theirs := os.NewFile(uintptr(fds[0]), "watchdog"), os.NewFile(uintptr(fds[1]), "leaderrun")
	defer theirs.Close()
	// In a group of its own, so that nothing meant for leaderrun's group
	// reaches it.
	p, err := os.StartProcess(self, []string{ProcessName, Arg}, &os.ProcAttr{
		Env:   env,
		Files: []*os.File{stdio[0], stdio[1], stdio[2], theirs},
		Sys:   &syscall.SysProcAttr{Setpgid: true},
	})
	if err != nil {
		ours.Close()
		return nil, fmt.Errorf("start the watchdog (%s): %w", self, err)
	}
	return &Launched{Proc: p, Conn: ours, Env: env, Stdio: stdio}, nil
}

// Env is the watchdog's environment: its Go runtime kept small. One P
// (GOMAXPROCS=1): it has one thing to do at a time. No memory profiling
// (GODEBUG=memprofilerate=0): nobody reads the profile, and its buckets
// are memory touched for nothing. GOGC is left at its default on purpose:
// the watchdog allocates nothing while it waits, so its collector never
// runs, and a lower target would only make it run during package
// initialisation, which frees little (the packages keep what they
// allocate) and touches the collector's own structures: measured, 0.35
// MiB more resident with the stores' clients linked, when it was tried.
// GODEBUG is passed on, so that GODEBUG=inittrace=1 shows the watchdog's
// start too, and GORACE for race-enabled test binaries.
func Env() []string {
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

// early is the watchdog that init launched, until Adopt takes it.
var early atomic.Pointer[Launched]

// launchEarly launches the watchdog if args (os.Args) look like a run.
// A failure is left for signals.Prepare to meet again and report.
func launchEarly(args []string) {
	if !looksLikeRun(args) {
		return
	}
	self, err := Executable()
	if err != nil {
		return
	}
	if l, err := Launch(self, [3]*os.File{os.Stdin, os.Stdout, os.Stderr}, Env()); err == nil {
		early.Store(l)
	}
}

// Adopt hands over the watchdog that was launched at start, once; nil if
// there is none (not a run, or already adopted).
func Adopt() *Launched { return early.Swap(nil) }

// looksLikeRun reports whether args are leaderrun's run command: the
// default command or "run", a "--" followed by the command, and no help
// or version flag before it (see cmd's withDefaultCommand), and no shell
// completion. Test binaries (-test. flags) never launch one. A guess that is wrong only
// costs time: a watchdog that is not adopted exits when leaderrun does
// (its socket closes), and one that is not launched is launched later.
func looksLikeRun(args []string) bool {
	if len(args) < 3 || (args[1] != "run" && !strings.HasPrefix(args[1], "-")) ||
		args[len(args)-1] == "--generate-bash-completion" {
		return false
	}
	for i, a := range args[1:] {
		if a == "--" {
			return i+2 < len(args)
		}
		switch strings.TrimLeft(a, "-") {
		case "h", "help", "v", "version", "generate-bash-completion":
			return false
		}
		if strings.HasPrefix(a, "-test.") {
			return false
		}
	}
	return false
}
