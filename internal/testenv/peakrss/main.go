// Command peakrss runs a command and writes its peak RSS, as wait4 reports
// it, to the file named by $PEAKRSS_OUT, in KiB; it exits with the
// command's code. testenv.RunMeasured starts commands through it.
//
// Why a process of its own: Go's os/exec starts a command with vfork
// (CLONE_VM), and execve records the peak RSS of the memory it leaves, the
// parent's, as the command's own starting peak. Started from a test
// process of 120 MiB, a command that never used 20 MiB reports 120 MiB.
// This program is small, so what it passes on is a few MiB at most.
package main

import (
	"fmt"
	"os"
	"os/exec"
	"strconv"
	"syscall"
)

func main() {
	if len(os.Args) < 2 || os.Getenv("PEAKRSS_OUT") == "" {
		fmt.Fprintln(os.Stderr, "usage: PEAKRSS_OUT=FILE peakrss COMMAND [ARG...]")
		os.Exit(2)
	}
	cmd := exec.Command(os.Args[1], os.Args[2:]...)
	cmd.Stdin, cmd.Stdout, cmd.Stderr = os.Stdin, os.Stdout, os.Stderr
	cmd.Env = os.Environ()
	if err := cmd.Start(); err != nil {
		fmt.Fprintln(os.Stderr, err)
		os.Exit(127)
	}
	_ = cmd.Wait()
	ru, ok := cmd.ProcessState.SysUsage().(*syscall.Rusage)
	if !ok {
		fmt.Fprintln(os.Stderr, "peakrss: no rusage")
		os.Exit(2)
	}
	if err := os.WriteFile(os.Getenv("PEAKRSS_OUT"), []byte(strconv.FormatInt(int64(ru.Maxrss), 10)+"\n"), 0o600); err != nil {
		fmt.Fprintln(os.Stderr, err)
		os.Exit(2)
	}
	os.Exit(cmd.ProcessState.ExitCode())
}
