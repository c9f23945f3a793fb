//go:build linux

package e2e

import (
	"strings"
	"testing"
	"time"
)

// testOncePerPeriod: the fleet's crontab (cronFleet) on the store: 10
// periods of 6 s, three hosts at random offsets (up to 0.8 s) with --wait
// 4s --once-per 6s, a kill -9 of the leader mid-run in 3 of them, with
// timings short enough for a takeover (the lease and a retry period, 3 s
// at most) and the 1 s job within a period. Exactly one completed run per
// period, never two jobs at once, and history agrees, and so do the
// markers, where the test can read them. The last host to wait gives up
// 4 s after it started: a takeover fits even when the killed leader's job
// started a second and more late on a busy machine, and the replacement's
// job ends before the next period begins.
func testOncePerPeriod(t *testing.T, e *env) {
	lock := e.lock("lock")
	cronFleet{
		env: e.target.env,
		args: func(int) []string {
			return append(append(append([]string{"--lock", lock}, e.flags...), e.onceTimings.flags()...), e.runFlags...)
		},
		period: 6 * time.Second, wait: 4 * time.Second, periods: 10, kills: []int{2, 5, 8}, jobTime: time.Second,
		history: func(t *testing.T) []historyTerm { return e.history(t, lock) },
	}.run(t)
	if e.marker == nil {
		return
	}
	// Each completed period's marker, while the store keeps it (7
	// periods), names the run that completed it.
	kept := 0
	for _, term := range e.history(t, lock) {
		if term.End != "exited" || term.ExitCode != 0 {
			continue
		}
		if id := e.marker(t, lock, term.OnceKey); id != "" {
			kept++
			if id != term.Identity {
				t.Errorf("the marker of %s names %s, want %s, whose run completed it", term.OnceKey, id, term.Identity)
			}
		}
	}
	t.Logf("%d markers of the fleet's periods are still kept", kept)
	if kept == 0 {
		t.Errorf("the store keeps no marker of the fleet's periods")
	}
}

// testOnceDone: with --once-per, the first run of the period runs the
// command; the next finds the period done and exits 0 without running
// anything, saying who completed it; with --done-exit-code 9, 9.
func testOnceDone(t *testing.T, e *env) {
	lock, events := e.lock("lock"), etcdEvents(t)
	if code := e.run(t, events, "sleep:10ms", lock, "first", "--once-per", "24h").wait(30 * time.Second); code != 0 {
		t.Fatalf("the first run exited %d", code)
	}
	p := e.run(t, events, "sleep:10ms", lock, "second", "--once-per", "24h")
	if code := p.wait(30 * time.Second); code != 0 {
		t.Fatalf("the second run exited %d, want 0", code)
	}
	if code := e.run(t, events, "sleep:10ms", lock, "third", "--once-per", "24h", "--done-exit-code", "9").wait(30 * time.Second); code != 9 {
		t.Errorf("the third run exited %d, want 9", code)
	}
	if evs := readEvents(t, events); count(evs, "start") != 1 {
		t.Errorf("children started:\n%s\nwant only the first's", formatEvents(evs))
	}
	if !strings.Contains(p.stderr.String(), "already completed") || !strings.Contains(p.stderr.String(), "completed_by=first") {
		t.Errorf("the second run does not say who completed the period:\n%s", p.stderr.String())
	}
}

// testOnceFailures (onceFailures): a job that exits 1 records nothing
// and the next candidate runs it; a job that takes its own lock away
// (target.loseCommand) and exits 0 records nothing, its leaderrun exits
// 76, and the next candidate runs the job; after a success, the next
// candidate runs nothing. The history shows it all, and the marker, where
// the test can read it, is the successful run's.
func testOnceFailures(t *testing.T, e *env) {
	lock := e.lock("lock")
	args := append(append(append([]string{"--lock", lock}, e.flags...), e.timings.flags()...), e.runFlags...)
	onceFailures(t, e.target.env, args, e.loseCommand(t, lock))
	out, code := e.output(t, "history", lock)
	t.Logf("history:\n%s", out)
	wants := []string{"exited 1", "skipped"}
	if e.lostTerm {
		wants = append(wants, "lost")
	}
	for _, want := range wants {
		if code != 0 || !strings.Contains(out, want) {
			t.Errorf("history (exit %d) does not say %q", code, want)
		}
	}
	if e.marker != nil {
		if id := e.marker(t, lock, "nightly-1"); id != "succeeds" {
			t.Errorf("the marker of nightly-1 names %q, want the successful run's, succeeds", id)
		}
	}
}
