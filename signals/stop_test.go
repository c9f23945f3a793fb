//go:build linux

package signals

import (
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/leaderrun/leaderrun/internal/testenv"
)

// escapeeScript makes the command set its trap, start a helper that leaves
// its process group (setsid) and ignores SIGTERM, the shape of `setsid
// some-daemon &`, wait until the helper wrote its pid to pidFile, then do
// what rest says.
func escapeeScript(pidFile, trap, rest string) string {
	return trap + `
setsid sh -c 'trap "" TERM; echo $$ > ` + pidFile + `.tmp; mv ` + pidFile + `.tmp ` + pidFile + `; exec sleep 300' </dev/null >/dev/null 2>&1 &
while [ ! -s ` + pidFile + ` ]; do sleep 0.01; done
` + rest
}

// startEscapee starts script under a new Supervisor with kill grace grace
// and returns the child and the escaped helper, watched.
func startEscapee(t *testing.T, script string, grace time.Duration, pidFile string) (*Child, *testenv.Process) {
	t.Helper()
	if _, err := exec.LookPath("setsid"); err != nil {
		testenv.Missing(t, "setsid(1) from util-linux is not installed")
	}
	sup, err := Prepare(Spec{Path: "/bin/sh", Args: []string{"sh", "-c", script}, KillGrace: grace})
	if err != nil {
		t.Fatal(err)
	}
	c, err := sup.Start(os.Environ(), time.Time{}, nil)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		_ = c.Signal(syscall.SIGKILL)
		c.Wait()
	})
	var pid int
	waitUntil(t, "the helper's pid", func() bool {
		data, err := os.ReadFile(pidFile)
		pid, _ = strconv.Atoi(strings.TrimSpace(string(data)))
		return err == nil && pid > 0
	})
	if pgid, _ := syscall.Getpgid(pid); pgid == c.Pid() {
		t.Fatalf("the helper %d did not leave the command's group", pid)
	}
	return c, testenv.Watch(t, pid)
}

// killedAt waits until the tree was sent the sequence's SIGKILL, by the
// watchdog (its word) or, if the watchdog was late by more than
// backstopDelay (the test process starved it), by leaderrun's backstop.
func killedAt(t *testing.T, c *Child) time.Time {
	t.Helper()
	var at time.Time
	waitUntil(t, "the tree's SIGKILL", func() bool {
		c.mu.Lock()
		defer c.mu.Unlock()
		at = c.killedAt
		return !at.IsZero()
	})
	return at
}

// TestStopSequenceOneDeadline (S9): from the first kill signal, every
// process of the tree, the command's group and a helper that left it alike,
// is SIGKILLed no later than --kill-grace after that signal; the helper
// gets no grace of its own, whether the runner stopped the command or the
// command exited by itself and left the helper behind. Done closes only
// once the helper is gone. The SIGKILL's time is the watchdog's own, when
// it sent it: the test process, on a machine loaded by parallel builds,
// saw deaths up to 240 ms after a SIGKILL sent on time, at e3cbc97 as
// since (-race -count=50, a load of 5 to 7).
func TestStopSequenceOneDeadline(t *testing.T) {
	const grace = 600 * time.Millisecond
	const slack = deadlineSlack // a second grace would add 600 ms
	cases := []struct {
		name string
		// trap and rest are the command's script around the helper's start.
		trap, rest string
		// stop: the test calls Stop (else the command exits by itself).
		stop bool
	}{
		{name: "stopped, command ignores the signal too", trap: `trap "" TERM`, rest: `while :; do sleep 0.05; done`, stop: true},
		{name: "stopped, command exits on the signal", trap: `trap 'exit 0' TERM`, rest: `while :; do sleep 0.05; done`, stop: true},
		{name: "command exits by itself", rest: `exit 0`},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			pidFile := filepath.Join(t.TempDir(), "helper")
			c, helper := startEscapee(t, escapeeScript(pidFile, tc.trap, tc.rest), grace, pidFile)
			if tc.stop {
				c.Stop(syscall.SIGTERM)
			} else {
				select {
				case <-c.exited:
				case <-time.After(10 * time.Second):
					t.Fatal("the command did not exit")
				}
			}
			// The watchdog sends the first kill signal and fixes the
			// SIGKILL instant, --kill-grace later.
			waitUntil(t, "the stop sequence to start", func() bool { return !c.KillAt().IsZero() })
			first := c.KillAt().Add(-grace)
			died := helper.Died(t, 10*time.Second)
			after, sent := died.Sub(first), killedAt(t, c).Sub(first)
			t.Logf("helper %d: SIGKILL sent %v after the first kill signal, its death seen %v after it (grace %v)", helper.Pid,
				sent.Round(time.Millisecond), after.Round(time.Millisecond), grace)
			if sent > grace+slack {
				t.Errorf("SIGKILL sent %v after the first kill signal: more than --kill-grace %v + %v", sent, grace, slack)
			}
			if after < grace-slack {
				t.Errorf("helper ignoring SIGTERM died after only %v: SIGKILL before the grace was up", after)
			}
			select {
			case <-c.Done():
			case <-time.After(10 * time.Second):
				t.Fatal("Done not closed after the tree died")
			}
			if !gone(helper.Pid) {
				t.Errorf("helper %d alive after Done", helper.Pid)
			}
		})
	}
}

// TestStopReachesEscapeeAtOnce: a helper that left the group while its
// parent still runs gets the kill signal with the group, not once its parent
// is gone.
func TestStopReachesEscapeeAtOnce(t *testing.T) {
	if _, err := exec.LookPath("setsid"); err != nil {
		testenv.Missing(t, "setsid(1) from util-linux is not installed")
	}
	dir := t.TempDir()
	pidFile, termFile := filepath.Join(dir, "helper"), filepath.Join(dir, "term")
	// The helper records SIGTERM and exits; the command catches it and
	// carries on, so its parent is alive when the signal reaches the
	// helper. (Caught, not ignored: an ignored signal would be ignored by
	// the helper too, and a shell cannot trap a signal ignored at entry.)
	script := `trap : TERM
setsid sh -c 'trap "echo term > ` + termFile + `; exit 0" TERM; echo $$ > ` + pidFile + `.tmp; mv ` + pidFile + `.tmp ` + pidFile + `; while :; do sleep 0.05; done' </dev/null >/dev/null 2>&1 &
while [ ! -s ` + pidFile + ` ]; do sleep 0.01; done
while :; do sleep 0.05; done`
	c, helper := startEscapee(t, script, 5*time.Second, pidFile)
	stopped := time.Now()
	c.Stop(syscall.SIGTERM)
	died := helper.Died(t, 4*time.Second)
	if _, err := os.Stat(termFile); err != nil {
		t.Errorf("helper %d ended without getting SIGTERM: %v", helper.Pid, err)
	}
	if d := died.Sub(stopped); d > time.Second {
		t.Errorf("helper got the kill signal %v after Stop, want at once", d)
	} else {
		t.Logf("helper signalled and gone %v after Stop", d.Round(time.Millisecond))
	}
	c.Stop(syscall.SIGKILL)
	<-c.Done()
}

// TestLaterStopKeepsDeadline: a second Stop (a SIGINT while stopping)
// reaches the group but does not move the deadline.
func TestLaterStopKeepsDeadline(t *testing.T) {
	pidFile := filepath.Join(t.TempDir(), "helper")
	c, helper := startEscapee(t, escapeeScript(pidFile, `trap "" TERM INT`, `while :; do sleep 0.05; done`), 800*time.Millisecond, pidFile)
	first := time.Now()
	c.Stop(syscall.SIGTERM)
	waitUntil(t, "the stop sequence to start", func() bool { return !c.KillAt().IsZero() })
	killAt := c.KillAt()
	time.Sleep(500 * time.Millisecond) // a deliberate pause: the second signal comes later
	c.Stop(syscall.SIGINT)
	if got := c.KillAt(); !got.Equal(killAt) {
		t.Errorf("a second Stop moved the deadline from %v to %v", killAt, got)
	}
	helper.Died(t, 10*time.Second)
	// A second grace would end 500 ms after the first (the pause above):
	// the SIGKILL, as the watchdog sent it, comes within a scheduler's
	// slack of the first grace's end.
	if late := killedAt(t, c).Sub(killAt); late > deadlineSlack {
		t.Errorf("SIGKILL sent %v after the first grace ended (%v after the first signal); want within the grace of the first",
			late, killedAt(t, c).Sub(first))
	}
	<-c.Done()
}
