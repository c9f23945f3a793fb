//go:build linux

package e2e

import (
	"errors"
	"os"
	"strings"
	"syscall"
	"testing"
	"time"
)

// outage is how long the store's server stays down in OutageDuringWait
// (issue 41: a two-second outage at 02:00 must not cost the day's run).
const outage = 2 * time.Second

// skipNoServer skips a scenario on a store that has no server to stop.
func skipNoServer(t *testing.T, e *env) {
	t.Helper()
	if e.stopServer == nil || e.startServer == nil {
		t.Skip("the store has no server to stop (target.stopServer)")
	}
}

// testOutageDuringWait (issue 41): a leader holds the lock and a
// candidate waits with --wait 30s; the store's server is stopped for 2 s
// and started again. The candidate does not give up (no exit 69, nor 75):
// once the leader's job has ended (by the leader's loss during the
// outage, or a SIGTERM once the store is back), it is granted the lock and
// runs its job, never beside the leader's. Where the store keeps its data
// (store.durable), its token is greater than the leader's.
func testOutageDuringWait(t *testing.T, e *env) {
	skipNoServer(t, e)
	lock, events := e.lock("lock"), etcdEvents(t)
	leader, _ := e.leader(t, events, "forever", lock, "leader")
	cand := e.follower(t, events, "exit:0", lock, "candidate", "--wait", "30s")

	began := time.Now()
	e.stopServer(t)
	down := time.Now()
	// The outage itself: how long the store stays down, not a wait for
	// anything to happen.
	time.Sleep(outage)
	e.startServer(t)
	up := time.Now()
	t.Logf("the store's server stopped in %v, down %v, serving again %v later",
		down.Sub(began).Round(time.Millisecond), outage, up.Sub(down).Round(time.Millisecond))
	// A server whose own stop and start outlast the lease (the
	// apiserver's graceful stop takes 10 s) lets the candidate take the
	// lock as soon as it answers again, and run its job: exit 0, checked
	// below as any run. Any other exit is giving up.
	if cand.exited() && cand.code != 0 {
		t.Fatalf("the candidate gave up during the outage: exit %d:\n%s", cand.code, cand.stderr.String())
	}

	// The leader may have lost the lease while the store was down (its
	// renewals failed past --renew-deadline); if it still leads, its job
	// ends now.
	// (It may end by itself in between: a process already finished is
	// no error.)
	if err := leader.cmd.Process.Signal(syscall.SIGTERM); err != nil && !errors.Is(err, os.ErrProcessDone) {
		t.Fatalf("signal the leader: %v", err)
	}
	code := leader.wait(30 * time.Second)
	t.Logf("the leader exited %d", code)

	waitEvents(t, events, e.takeover+30*time.Second, "the candidate's child", etcdHas("start", "candidate"))
	if code := cand.wait(30 * time.Second); code != 0 {
		t.Fatalf("the candidate exited %d, want 0 (its job ran and exited 0):\n%s", code, cand.stderr.String())
	}
	evs := readEvents(t, events)
	ivs := intervals(evs)
	if len(ivs) != 2 || ivs[0].ID != "leader" || ivs[1].ID != "candidate" {
		t.Fatalf("children: %+v, want the leader's, then the candidate's:\n%s", ivs, formatEvents(evs))
	}
	if ivs[1].Start.Before(ivs[0].End) {
		t.Errorf("the candidate's child started %v before the leader's ended:\n%s", ivs[0].End.Sub(ivs[1].Start), formatEvents(evs))
	}
	t.Logf("the leader's child ended at %+v from the store's return; the candidate's started %v after that (tokens %d, %d)",
		ivs[0].End.Sub(up).Round(time.Millisecond), ivs[1].Start.Sub(ivs[0].End).Round(time.Millisecond), ivs[0].Token, ivs[1].Token)
	if e.durable && ivs[1].Token <= ivs[0].Token {
		t.Errorf("the candidate's token, %d, is not greater than the leader's, %d, on a store that kept its data", ivs[1].Token, ivs[0].Token)
	}
}

// testOutagePastWait (issue 41): a candidate that starts while the
// store's server is down, with --wait 3s, retries for the whole wait
// and then exits 69, the store unavailable, naming
// the store; never at once.
func testOutagePastWait(t *testing.T, e *env) {
	skipNoServer(t, e)
	const wait = 3 * time.Second
	lock, events := e.lock("lock"), etcdEvents(t)
	e.stopServer(t)
	// Started again at the end, for the target's own cleanup.
	t.Cleanup(func() { e.startServer(t) })
	began := time.Now()
	p := e.run(t, events, "exit:0", lock, "candidate", "--wait", wait.String())
	code := p.wait(wait + 30*time.Second)
	took := time.Since(began)
	out := p.stderr.String()
	t.Logf("--wait %v with the store down: exit %d after %v: %s", wait, code, took.Round(time.Millisecond), lastLine(out))
	if code != 69 {
		t.Fatalf("exit %d, want 69 (store unavailable):\n%s", code, out)
	}
	if want := "no answer from " + e.store.name + " within --wait " + wait.String(); !strings.Contains(out, want) {
		t.Errorf("the exit does not say %q:\n%s", want, out)
	}
	if e.link != "" && !strings.Contains(out, e.link) {
		t.Errorf("the exit does not name the store's address, %s:\n%s", e.link, out)
	}
	// The driver logs each failure it retries; a store whose client
	// retries by itself within one attempt (ZooKeeper's connect) fails
	// once, at the wait's end.
	t.Logf("the candidate logged %d failures it retried", strings.Count(out, "store failed; retrying"))
	if took < wait {
		t.Errorf("gave up after %v, before its --wait %v ended: the store must be retried while the wait runs", took, wait)
	}
	if late := wait + 5*time.Second; took > late {
		t.Errorf("gave up after %v, want within %v", took, late)
	}
	if n := count(readEvents(t, events), "start"); n != 0 {
		t.Errorf("%d children started with the store down", n)
	}
}
