//go:build linux

package e2e

import (
	"encoding/json"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/leaderrun/leaderrun/internal/testenv"
)

// The helpers of every store's tests. Some carry the name of etcd, whose
// tests came first, and are kept under it for the tests that use them
// (escape_test.go, watchdog_test.go).

// etcdStatus is `leaderrun status --json` parsed: every store's fields.
type etcdStatus struct {
	Lock      string `json:"lock"`
	Backend   string `json:"backend"`
	Key       string `json:"key"`
	Held      bool   `json:"held"`
	Identity  string `json:"identity"`
	Token     uint64 `json:"token"`
	TTL       int64  `json:"ttl_ns"`
	Remaining int64  `json:"remaining_ns"`
	Waiting   int    `json:"waiting"`
}

// statusOf is `leaderrun status --json` with args, in env, parsed, and its
// exit code; any other exit than 0 (held) or 3 (not held) fails the test.
func statusOf(t *testing.T, env []string, args ...string) (etcdStatus, int) {
	t.Helper()
	cmd := exec.Command(testenv.Leaderrun(t), append([]string{"status", "--json"}, args...)...)
	cmd.Env = append(os.Environ(), env...)
	var stderr syncBuffer
	cmd.Stderr = &stderr
	out, err := cmd.Output()
	code := 0
	if ee, ok := err.(*exec.ExitError); ok {
		code = ee.ExitCode()
	} else if err != nil {
		t.Fatal(err)
	}
	var st etcdStatus
	if code != 0 && code != 3 {
		t.Fatalf("status: exit %d\n%s%s", code, out, stderr.String())
	}
	if err := json.Unmarshal(out, &st); err != nil {
		t.Fatalf("status --json printed %q: %v", out, err)
	}
	return st, code
}

// etcdFind returns the first event of kind recorded by the child of
// identity id.
func etcdFind(evs []event, kind, id string) (event, bool) {
	for _, e := range evs {
		if e.Kind == kind && e.ID == id {
			return e, true
		}
	}
	return event{}, false
}

// etcdHas is a waitEvents condition: the child of id recorded kind.
func etcdHas(kind, id string) func([]event) bool {
	return func(evs []event) bool { _, ok := etcdFind(evs, kind, id); return ok }
}

// etcdEvents is a new events file for the recording children of a test.
func etcdEvents(t *testing.T) string { return filepath.Join(t.TempDir(), "events") }

// summary formats durations as min/median/max.
func summary(ds []time.Duration) string {
	if len(ds) == 0 {
		return "none"
	}
	s := slices.Clone(ds)
	slices.Sort(s)
	r := func(d time.Duration) time.Duration { return d.Round(10 * time.Microsecond) }
	return fmt.Sprintf("min %v, median %v, max %v (n=%d)", r(s[0]), r(s[len(s)/2]), r(s[len(s)-1]), len(s))
}

func median(ds []time.Duration) time.Duration {
	s := slices.Clone(ds)
	slices.Sort(s)
	return s[len(s)/2]
}

// waitFor polls cond, for conditions in other processes.
func waitFor(t testing.TB, timeout time.Duration, what string, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(timeout)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("timed out after %v waiting for %s", timeout, what)
		}
		time.Sleep(2 * time.Millisecond)
	}
}

// every is cond asked at most once per d, false in between: for a
// condition that costs a process or a request to the store each time,
// which waitFor would otherwise ask back to back.
func every(d time.Duration, cond func() bool) func() bool {
	var last time.Time
	return func() bool {
		if time.Since(last) < d {
			return false
		}
		last = time.Now()
		return cond()
	}
}

// localArgs are the flags of a local-backend run in dir.
func localArgs(dir, lock string, extra ...string) []string {
	return append([]string{"--backend", "local", "--state-dir", dir, "--lock", lock,
		"--lease-duration", "4s", "--renew-deadline", "2s", "--retry-period", "200ms", "--kill-grace", "1s"}, extra...)
}

// cmdArgs are extra flags, then the recording child as the command.
func cmdArgs(t *testing.T, extra []string) []string {
	return append(append(extra, "--"), childArgv(t)...)
}

// readPids reads the process ids a job wrote to path, one a line.
func readPids(path string) []int {
	data, _ := os.ReadFile(path)
	var pids []int
	for _, f := range strings.Fields(string(data)) {
		if n, err := strconv.Atoi(f); err == nil {
			pids = append(pids, n)
		}
	}
	return pids
}

// pauseGroups lists the process groups of a leaderrun tree: leaderrun's
// (the test started it as a group leader), its watchdog's and the child's.
func pauseGroups(t *testing.T, leaderrun, child int) []int {
	t.Helper()
	// Children are listed per thread: any may have forked them.
	files, err := filepath.Glob(filepath.Join("/proc", strconv.Itoa(leaderrun), "task", "*", "children"))
	if err != nil || len(files) == 0 {
		t.Fatalf("list children of %d: %v", leaderrun, err)
	}
	groups := []int{leaderrun}
	add := func(pid int) {
		if pgid, err := syscall.Getpgid(pid); err == nil && !slices.Contains(groups, pgid) {
			groups = append(groups, pgid)
		}
	}
	for _, file := range files {
		data, _ := os.ReadFile(file)
		for _, f := range strings.Fields(string(data)) {
			if pid, err := strconv.Atoi(f); err == nil {
				add(pid)
			}
		}
	}
	add(child)
	if len(groups) != 3 {
		t.Fatalf("process groups of leaderrun %d and its child %d: %v, want leaderrun's, the watchdog's and the child's", leaderrun, child, groups)
	}
	return groups
}

// logLineTime is the time of the first line of leaderrun's text log that
// has msg (quoted there if it has a space).
func logLineTime(out, msg string) (time.Time, bool) {
	for _, line := range strings.Split(out, "\n") {
		line = strings.TrimSpace(line)
		if !strings.Contains(line, `msg="`+msg+`"`) && !strings.Contains(line+" ", " msg="+msg+" ") {
			continue
		}
		ts, _, _ := strings.Cut(strings.TrimPrefix(line, "time="), " ")
		at, err := time.Parse(time.RFC3339Nano, ts)
		return at, err == nil
	}
	return time.Time{}, false
}

// lastLine is the last line of s.
func lastLine(s string) string {
	lines := strings.Split(strings.TrimSpace(s), "\n")
	return lines[len(lines)-1]
}
