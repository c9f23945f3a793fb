// Command child is the benchmark's child: the command every tool under
// test (leaderrun, etcdctl lock, consul lock) starts. It is a program of
// its own, linking nothing but the standard library and x/sys/unix, so
// that its own start-up adds as little as possible to what is measured:
// once it was the benchmark's test binary re-executed, which ran the
// package init of every store's client library (about 30 ms on a busy
// machine) before it read the clock, and that was counted against every
// tool in start-to-child, handover and crash failover.
//
// Its environment, set by the benchmark on the tool that starts it:
//
//	BENCH_SOCK  the benchmark's unix socket
//	BENCH_TAG   names the tool that started this child
//	BENCH_HOLD  set: run until SIGTERM or SIGINT; unset: exit at once
//
// "child version" prints its name and exits 0 (the benchmark times the
// start-up of each binary that way). Otherwise it reads CLOCK_MONOTONIC first thing, connects, and writes
// "start TAG PID NANOS"; in hold mode, on a signal, "sig TAG PID NANOS
// NAME" before it exits 0. It keeps its connection open while it lives, so
// the benchmark also learns when it died, however it died; and it exits if
// the benchmark goes away, so that no child outlives it.
package main

import (
	"fmt"
	"net"
	"os"
	"os/signal"
	"syscall"

	"golang.org/x/sys/unix"
)

// mono reads CLOCK_MONOTONIC, which every process on the machine shares,
// unlike the monotonic reading inside a time.Time.
func mono() int64 {
	var ts unix.Timespec
	_ = unix.ClockGettime(unix.CLOCK_MONOTONIC, &ts)
	return ts.Nano()
}

func main() { os.Exit(run()) }

func run() int {
	at := mono()
	if len(os.Args) > 1 && os.Args[1] == "version" {
		fmt.Println("bench child")
		return 0
	}
	sigs := make(chan os.Signal, 1)
	signal.Notify(sigs, syscall.SIGTERM, syscall.SIGINT)
	c, err := net.Dial("unix", os.Getenv("BENCH_SOCK"))
	if err != nil {
		fmt.Fprintln(os.Stderr, "bench child:", err)
		return 1
	}
	defer c.Close()
	tag := os.Getenv("BENCH_TAG")
	if _, err := fmt.Fprintf(c, "start %s %d %d\n", tag, os.Getpid(), at); err != nil {
		return 1
	}
	if os.Getenv("BENCH_HOLD") == "" {
		return 0
	}
	hubGone := make(chan struct{})
	go func() {
		defer close(hubGone)
		_, _ = c.Read(make([]byte, 1))
	}()
	select {
	case s := <-sigs:
		fmt.Fprintf(c, "sig %s %d %d %s\n", tag, os.Getpid(), mono(), unix.SignalName(s.(syscall.Signal)))
		return 0
	case <-hubGone:
		return 1
	}
}
