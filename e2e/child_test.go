//go:build linux

package e2e

import (
	"bufio"
	"fmt"
	"os"
	"os/signal"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"
)

// childMain is the child command: it appends one line per event to
// $E2E_EVENTS ("<unix-ns> <event> token=<FENCE_TOKEN> pid=<pid> id=<identity> [detail]"),
// then behaves as $E2E_CHILD says:
//
//	sleep:D    run for D, exit 0 (exit at once on SIGTERM/SIGINT after recording it)
//	exit:N     exit with status N at once
//	ignore:D   record signals but ignore them, run for D
//	forever    like sleep, without end
//
// With $E2E_SLOT_LOCKS (a directory, for pools: TestHolders) the start
// record names the child's $LEADERRUN_SLOT ("slot=N"), and before it the
// child takes, without waiting, an flock on the slot's file and one on any
// of $E2E_CAP capacity files: a second child in the same slot, or one
// child more than the pool's size, finds them held and records "overlap"
// or "overcap". The kernel drops a child's flocks the instant it dies,
// however it dies, so this sees what timestamps cannot: a child killed by
// SIGKILL records no exit.
func childMain() int {
	mode, arg, _ := strings.Cut(os.Getenv("E2E_CHILD"), ":")
	rec := func(event, detail string) {
		f, err := os.OpenFile(os.Getenv("E2E_EVENTS"), os.O_WRONLY|os.O_APPEND|os.O_CREATE, 0o600)
		if err != nil {
			return
		}
		defer f.Close()
		fmt.Fprintf(f, "%d %s token=%s pid=%d id=%s %s\n", time.Now().UnixNano(), event,
			os.Getenv("FENCE_TOKEN"), os.Getpid(), os.Getenv("LEADERRUN_IDENTITY"), detail)
	}
	sigs := make(chan os.Signal, 4)
	signal.Notify(sigs, syscall.SIGTERM, syscall.SIGINT, syscall.SIGHUP, syscall.SIGUSR1)
	if dir := os.Getenv("E2E_SLOT_LOCKS"); dir != "" {
		slot := "slot=" + os.Getenv("LEADERRUN_SLOT")
		overlap, overcap := takeSlotLocks(dir)
		if overlap {
			rec("overlap", slot)
		}
		if overcap {
			rec("overcap", slot)
		}
		rec("start", slot)
	} else {
		rec("start", "")
	}
	var d time.Duration
	switch mode {
	case "exit":
		n, _ := strconv.Atoi(arg)
		rec("exit", arg)
		return n
	case "forever":
		d = 24 * time.Hour
	default:
		d, _ = time.ParseDuration(arg)
	}
	end := time.After(d)
	for {
		select {
		case s := <-sigs:
			rec("signal", s.(syscall.Signal).String())
			if mode != "ignore" && (s == syscall.SIGTERM || s == syscall.SIGINT) {
				rec("exit", "signalled")
				return 0
			}
		case <-end:
			rec("exit", "0")
			return 0
		}
	}
}

// slotLocks are the files a child of a pool holds its flocks on: open,
// and referenced, for the child's whole life.
var slotLocks []*os.File

// takeSlotLocks takes the flocks of childMain's pool mode and says which
// it could not take.
func takeSlotLocks(dir string) (overlap, overcap bool) {
	take := func(name string) bool {
		f, err := os.OpenFile(filepath.Join(dir, name), os.O_RDWR|os.O_CREATE, 0o600)
		if err != nil {
			return false
		}
		if syscall.Flock(int(f.Fd()), syscall.LOCK_EX|syscall.LOCK_NB) != nil {
			f.Close()
			return false
		}
		slotLocks = append(slotLocks, f)
		return true
	}
	overlap = !take("slot-" + os.Getenv("LEADERRUN_SLOT"))
	n, _ := strconv.Atoi(os.Getenv("E2E_CAP"))
	overcap = true
	for i := 0; i < n && overcap; i++ {
		overcap = !take("cap-" + strconv.Itoa(i))
	}
	return overlap, overcap
}

// event is one line of the events file.
type event struct {
	At    time.Time
	Kind  string
	Token uint64
	Pid   int
	ID    string
	Rest  string
}

func readEvents(t testing.TB, path string) []event {
	t.Helper()
	f, err := os.Open(path)
	if os.IsNotExist(err) {
		return nil
	}
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	var evs []event
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		fields := strings.Fields(sc.Text())
		if len(fields) < 5 {
			continue
		}
		ns, _ := strconv.ParseInt(fields[0], 10, 64)
		e := event{At: time.Unix(0, ns), Kind: fields[1]}
		e.Token, _ = strconv.ParseUint(strings.TrimPrefix(fields[2], "token="), 10, 64)
		e.Pid, _ = strconv.Atoi(strings.TrimPrefix(fields[3], "pid="))
		e.ID = strings.TrimPrefix(fields[4], "id=")
		e.Rest = strings.Join(fields[5:], " ")
		evs = append(evs, e)
	}
	return evs
}

// waitEvents polls the events file until cond holds for its events. A file
// written by other processes offers no channel to wait on.
func waitEvents(t testing.TB, path string, timeout time.Duration, what string, cond func([]event) bool) []event {
	t.Helper()
	deadline := time.Now().Add(timeout)
	for {
		evs := readEvents(t, path)
		if cond(evs) {
			return evs
		}
		if time.Now().After(deadline) {
			t.Fatalf("timed out after %v waiting for %s; events:\n%s", timeout, what, formatEvents(evs))
		}
		time.Sleep(2 * time.Millisecond)
	}
}

func count(evs []event, kind string) int {
	n := 0
	for _, e := range evs {
		if e.Kind == kind {
			n++
		}
	}
	return n
}

func formatEvents(evs []event) string {
	var b strings.Builder
	for _, e := range evs {
		fmt.Fprintf(&b, "  %s %-6s token=%d pid=%d id=%s %s\n", e.At.Format("15:04:05.000000"), e.Kind, e.Token, e.Pid, e.ID, e.Rest)
	}
	return b.String()
}

// intervals returns each child's [start, exit] from the events, by pid.
// A child without an exit record is open until now.
type interval struct {
	Pid        int
	Token      uint64
	ID         string
	Start, End time.Time
}

func intervals(evs []event) []interval {
	byPid := map[int]*interval{}
	var order []int
	for _, e := range evs {
		switch e.Kind {
		case "start":
			byPid[e.Pid] = &interval{Pid: e.Pid, Token: e.Token, ID: e.ID, Start: e.At}
			order = append(order, e.Pid)
		case "exit":
			if iv := byPid[e.Pid]; iv != nil {
				iv.End = e.At
			}
		}
	}
	out := make([]interval, 0, len(order))
	for _, pid := range order {
		iv := *byPid[pid]
		if iv.End.IsZero() {
			iv.End = time.Now()
		}
		out = append(out, iv)
	}
	return out
}

// checkExclusive fails the test if two children ran at the same time or a
// later child's token is not greater than an earlier one's.
func checkExclusive(t testing.TB, evs []event) []interval {
	t.Helper()
	ivs := intervals(evs)
	for i := 1; i < len(ivs); i++ {
		prev, cur := ivs[i-1], ivs[i]
		if cur.Start.Before(prev.End) {
			t.Errorf("children overlap: pid %d (token %d) started %v before pid %d (token %d) ended\n%s",
				cur.Pid, cur.Token, prev.End.Sub(cur.Start), prev.Pid, prev.Token, formatEvents(evs))
		}
		if cur.Token <= prev.Token {
			t.Errorf("token went from %d to %d", prev.Token, cur.Token)
		}
	}
	return ivs
}
