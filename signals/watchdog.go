package signals

import (
	"bufio"
	"errors"
	"os"
	"os/exec"
	"os/signal"
	"strconv"
	"strings"
	"sync/atomic"
	"syscall"
)

// The watchdog stands by the command in case leaderrun dies. It says
// "ready" on its socket (its fd 3), then reads it: "pgid N" names the
// command's process group, as soon as the command is forked; "done"
// dismisses it; the socket closing without "done" means that leaderrun is
// gone, and it kills group N with SIGKILL.
//
// It is, by preference, watchdogScript as a tiny static executable built
// into this binary (watchdog/watchdog_amd64.asm; Linux on x86-64), which
// starts in a fraction of a millisecond and stays resident in two pages;
// else /bin/sh running watchdogScript: a shell starts in about a
// millisecond and 1.7 MiB. Either is ready long before a campaign ends,
// and takes no CPU from it. Where there is neither (no memfd can be
// executed, and no /bin/sh in a container image without a shell), it is
// this binary re-executed (see Watchdog). It lives in a process group of
// its own, and ignores the signals that could reach it by mistake: the
// built-in one every signal that can be ignored, the others their
// arguments (the forwarded ones, SIGPIPE and the kill signal).
const watchdogScript = `trap '' "$@"
echo ready >&3
pgid=
while read -r word arg <&3; do
	case $word in
	pgid) pgid=$arg ;;
	done) exit 0 ;;
	esac
done
[ -z "$pgid" ] || kill -s KILL -- "-$pgid"
`

// watchdogEnv marks a process started as a watchdog from this binary; its
// value lists the signals to ignore.
const watchdogEnv = "_LEADERRUN_WATCHDOG"

// shell is the watchdog's interpreter, and builtin whether the built-in
// watchdog is tried first; variables for the tests of the fallbacks.
var (
	shell   = "/bin/sh"
	builtin = true
)

// machineFailed is set once the built-in watchdog could not be executed,
// so that later commands go straight to the shell.
var machineFailed atomic.Bool

// watchdogCommands are the watchdogs to try, in order: the built-in one,
// then the shell or this binary. Each ignores at least the forwarded
// signals, SIGPIPE and killSignal.
func watchdogCommands(killSignal syscall.Signal) ([]*exec.Cmd, error) {
	var cmds []*exec.Cmd
	if builtin && !machineFailed.Load() {
		if path, err := machineWatchdog(); err == nil {
			cmds = append(cmds, &exec.Cmd{Path: path, Args: []string{"leaderrun-watchdog"}, Env: []string{}})
		}
	}
	var ignore []string
	for _, sig := range append(Forwarded, syscall.SIGPIPE, killSignal) {
		ignore = append(ignore, strconv.Itoa(int(sig.(syscall.Signal))))
	}
	if fi, err := os.Stat(shell); err == nil && fi.Mode().IsRegular() && fi.Mode()&0o111 != 0 {
		// Called sh, so that a bash behind /bin/sh acts as sh and reads
		// no start-up files.
		return append(cmds, &exec.Cmd{Path: shell, Args: append([]string{"sh", "-c", watchdogScript, "sh"}, ignore...), Env: []string{}}), nil
	}
	self, err := executable()
	if err != nil {
		if len(cmds) > 0 {
			return cmds, nil
		}
		return nil, errors.New("no " + shell + " and no path to this binary for the watchdog: " + err.Error())
	}
	return append(cmds, &exec.Cmd{Path: self, Args: []string{"leaderrun-watchdog"}, Env: []string{watchdogEnv + "=" + strings.Join(ignore, " ")}}), nil
}

// IsWatchdog reports whether this process was started as a watchdog. main
// must then call Watchdog and nothing else.
func IsWatchdog() bool {
	_, ok := os.LookupEnv(watchdogEnv)
	return ok
}

// Watchdog is watchdogScript in Go, for a host without /bin/sh.
func Watchdog() int {
	var ignore []os.Signal
	for _, f := range strings.Fields(os.Getenv(watchdogEnv)) {
		if n, err := strconv.Atoi(f); err == nil {
			ignore = append(ignore, syscall.Signal(n))
		}
	}
	signal.Ignore(ignore...)
	conn := os.NewFile(3, "leaderrun")
	_, _ = conn.WriteString("ready\n")
	pgid := 0
	r := bufio.NewReader(conn)
	for {
		line, err := r.ReadString('\n')
		if err != nil {
			break
		}
		word, arg, _ := strings.Cut(strings.TrimSpace(line), " ")
		switch word {
		case "pgid":
			pgid, _ = strconv.Atoi(arg)
		case "done":
			return 0
		}
	}
	if pgid > 0 {
		_ = syscall.Kill(-pgid, syscall.SIGKILL)
	}
	return 0
}

// Forwarded are the signals that leaderrun passes on to the command's
// process group as they are (S6). SIGTERM and SIGINT also start the stop
// sequence in the runner.
var Forwarded = []os.Signal{
	syscall.SIGHUP, syscall.SIGINT, syscall.SIGQUIT, syscall.SIGTERM,
	syscall.SIGUSR1, syscall.SIGUSR2, syscall.SIGWINCH,
}
