package signals

import (
	"bufio"
	"errors"
	"os"
	"os/exec"
	"os/signal"
	"syscall"
)

// The watchdog is the leader of the command's process group and does one
// thing: it says "ready" once it ignores the signals that leaderrun sends to
// the group, then reads its socket. "done" dismisses it; the socket closing
// without a word means that leaderrun is gone, and it kills its own process
// group, the command's, with SIGKILL.
//
// It is /bin/sh running watchdogScript: a shell starts in about a
// millisecond and a megabyte, so it is up and ready long before a campaign
// ends, and takes no CPU from it. Where there is no /bin/sh (a container
// image without a shell), it is this binary re-executed (see Watchdog).
const watchdogScript = `trap '' HUP INT QUIT TERM USR1 USR2 WINCH PIPE TSTP TTIN TTOU
echo ready
read -r word
[ "$word" = done ] || kill -s KILL 0
`

// watchdogEnv marks a process started as a watchdog from this binary.
const watchdogEnv = "_LEADERRUN_WATCHDOG"

// shell is the watchdog's interpreter; a variable for the tests of the
// fallback.
var shell = "/bin/sh"

// watchdogCommand is the watchdog to start: the shell, or this binary.
func watchdogCommand() (*exec.Cmd, error) {
	if fi, err := os.Stat(shell); err == nil && fi.Mode().IsRegular() && fi.Mode()&0o111 != 0 {
		return &exec.Cmd{Path: shell, Args: []string{"leaderrun-watchdog", "-c", watchdogScript}, Env: []string{}}, nil
	}
	self, err := executable()
	if err != nil {
		return nil, errors.New("no " + shell + " and no path to this binary for the watchdog: " + err.Error())
	}
	return &exec.Cmd{Path: self, Args: []string{"leaderrun-watchdog"}, Env: []string{watchdogEnv + "=1"}}, nil
}

// IsWatchdog reports whether this process was started as a watchdog. main
// must then call Watchdog and nothing else.
func IsWatchdog() bool {
	_, ok := os.LookupEnv(watchdogEnv)
	return ok
}

// Watchdog is watchdogScript in Go, for a host without /bin/sh. Its socket
// is standard input and output.
func Watchdog() int {
	signal.Ignore(append(Forwarded, syscall.SIGPIPE, syscall.SIGTSTP, syscall.SIGTTIN, syscall.SIGTTOU)...)
	_, _ = os.Stdout.WriteString("ready\n")
	word, _ := bufio.NewReader(os.Stdin).ReadString('\n')
	if word != "done\n" {
		_ = syscall.Kill(0, syscall.SIGKILL)
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

// orphans are this process's children that this package does not wait for
// itself: as a subreaper, the orphans of the command's tree.
func orphans() []int {
	tracked.Lock()
	defer tracked.Unlock()
	var pids []int
	for _, pid := range children() {
		if !tracked.pids[pid] {
			pids = append(pids, pid)
		}
	}
	return pids
}

// killTree signals pid, and its process group if it leads one.
func killTree(pid int, sig syscall.Signal) {
	_ = syscall.Kill(pid, sig)
	if pgid, err := syscall.Getpgid(pid); err == nil && pgid == pid {
		_ = syscall.Kill(-pid, sig)
	}
}
