//go:build linux

package e2e

import (
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"
)

// testTryAndWait: --try on a held lock exits 75 and runs nothing (with
// --conflict-exit-code 0, exits 0), without waiting: it gives up within a
// retry period of campaigning, connection included (by its log, the
// median of three);
// --wait gives up with 75 after its duration (at least twice the retry
// period), and at most two retry periods later;
// a waiting candidate that gets SIGTERM withdraws at once (143). None of
// them changes the lock's record as an operator reads it.
func testTryAndWait(t *testing.T, e *env) {
	lock, events := e.lock("lock"), etcdEvents(t)
	e.leader(t, events, "forever", lock, "holder")
	record := func() string {
		if e.record == nil {
			return ""
		}
		return e.record(t, lock)
	}
	before := record()

	var tries, decided []time.Duration
	for i := range 3 {
		began := time.Now()
		p := e.run(t, events, "exit:0", lock, fmt.Sprintf("try-%d", i), "--try")
		if code := p.wait(20 * time.Second); code != 75 {
			t.Errorf("--try on a held lock exited %d, want 75", code)
		}
		tries = append(tries, time.Since(began))
		// From its start to its refusal by its own log: what --try does
		// once it runs, without the process's start and exit, which a
		// busy machine slows.
		from, ok1 := logLineTime(p.stderr.String(), "campaigning")
		to, ok2 := logLineTime(p.stderr.String(), "not acquired; not running the command")
		if !ok1 || !ok2 {
			t.Fatalf("--try's log does not say when it campaigned and gave up:\n%s", p.stderr.String())
		}
		decided = append(decided, to.Sub(from))
	}
	t.Logf("--try on a held lock, exit 75 after %s (process start included), refused %s after it campaigned",
		summary(tries), summary(decided))
	if m := median(decided); m > e.timings.retry {
		t.Errorf("--try gave up %v (median) after it campaigned, want within the retry period, %v: it must not wait", m, e.timings.retry)
	}
	if code := e.run(t, events, "exit:0", lock, "try-code", "--try", "--conflict-exit-code", "0").wait(20 * time.Second); code != 0 {
		t.Errorf("--try --conflict-exit-code 0 on a held lock exited %d, want 0", code)
	}

	wait := max(time.Second, 2*e.timings.retry)
	began := time.Now()
	if code := e.run(t, events, "exit:0", lock, "wait", "--wait", wait.String()).wait(wait + 20*time.Second); code != 75 {
		t.Errorf("--wait %v on a held lock exited %d, want 75", wait, code)
	}
	took := time.Since(began)
	t.Logf("--wait %v on a held lock: exit 75 after %v (process start included)", wait, took.Round(time.Millisecond))
	if late := wait + 2*e.timings.retry; took < wait || took > late {
		t.Errorf("--wait %v gave up after %v, want within %v", wait, took, late)
	}
	if after := record(); after != before {
		t.Errorf("--try and --wait changed the lock's record from %q to %q", before, after)
	}

	w := e.follower(t, events, "exit:0", lock, "waiter")
	w.signal(syscall.SIGTERM)
	if code := w.wait(3 * time.Second); code != 128+int(syscall.SIGTERM) {
		t.Errorf("a waiter interrupted by SIGTERM exited %d, want %d", code, 128+int(syscall.SIGTERM))
	}
	if after := record(); after != before {
		t.Errorf("the withdrawn waiter changed the lock's record from %q to %q", before, after)
	}
	if evs := readEvents(t, events); count(evs, "start") != 1 {
		t.Errorf("children started:\n%s\nwant only the holder's", formatEvents(evs))
	}
}

// testStatusAndHistory: status of a free lock exits 3 and says none;
// history of a lock never used prints nothing and exits 0. Three terms
// end (the job's exit 0, its exit 3, the lease taken away); with a holder
// and two waiters, status exits 0 with the holder's identity, its token
// (the child's FENCE_TOKEN), the backend, its key, the lease written and
// what is left of it, and the waiters, where the store tells each. Once
// all ended, history lists the six terms newest first, each with its
// child's token and how it ended, and status exits 3 again.
func testStatusAndHistory(t *testing.T, e *env) {
	lock := e.lock("lock")
	if out, code := e.output(t, "status", lock); code != 3 || !strings.Contains(out, "none") {
		t.Errorf("status of a free lock: exit %d, output:\n%s\nwant exit 3 and leader none", code, out)
	}
	if st, code := e.status(t, lock); code != 3 || st.Held || e.waiters && st.Waiting != 0 {
		t.Errorf("status --json of a free lock: exit %d, %+v", code, st)
	}
	for _, extra := range [][]string{nil, {"--json"}} {
		if out, code := e.output(t, "history", e.lock("never-used"), extra...); code != 0 || out != "" {
			t.Errorf("history %v of a lock never used: exit %d, output %q; want 0 and nothing", extra, code, out)
		}
	}
	events := etcdEvents(t)
	for i, mode := range []string{"exit:0", "exit:3"} {
		if code := e.run(t, events, mode, lock, fmt.Sprintf("term-%d", i)).wait(30 * time.Second); code != i*3 {
			t.Fatalf("term %d: exit %d, want %d", i, code, i*3)
		}
	}
	l := e.losses[0]
	lost, _ := e.leader(t, events, "forever", lock, "lost", l.extra...)
	e.settle(t, lost)
	l.do(t, e, lock)
	if code := lost.wait(30 * time.Second); code != 76 {
		t.Fatalf("the run whose lease was taken away (%s) exited %d, want 76", l.name, code)
	}
	holder, child := e.leader(t, events, "forever", lock, "holder")
	waiters := []*proc{e.follower(t, events, "exit:0", lock, "waiter-1"), e.follower(t, events, "exit:0", lock, "waiter-2")}
	out, code := e.output(t, "status", lock)
	t.Logf("status:\n%s", out)
	if code != 0 || !strings.Contains(out, "holder") || !strings.Contains(out, strconv.FormatUint(child.Token, 10)) {
		t.Errorf("status: exit %d, want 0 naming the holder and token %d", code, child.Token)
	}
	if !e.waiters && strings.Contains(out, "waiting:") {
		t.Errorf("status shows a waiting count, which the store does not keep")
	}
	st, code := e.status(t, lock)
	if code != 0 || !st.Held || st.Identity != "holder" || st.Token != child.Token || st.Backend != e.store.name ||
		!strings.HasPrefix(st.Key, e.key(lock)) {
		t.Errorf("status --json: exit %d, %+v; want held by holder with token %d, backend %s, key %s...",
			code, st, child.Token, e.store.name, e.key(lock))
	}
	if ttl := map[bool]time.Duration{true: e.timings.lease}[e.ttl]; time.Duration(st.TTL) != ttl {
		t.Errorf("status --json: ttl %v, want %v", time.Duration(st.TTL), ttl)
	}
	switch {
	case e.remaining && (st.Remaining <= 0 || time.Duration(st.Remaining) > e.timings.lease):
		t.Errorf("status --json: remaining %v, want more than 0 and at most the lease", time.Duration(st.Remaining))
	case !e.remaining && st.Remaining != -1:
		t.Errorf("status --json: remaining %d, want -1 (the store does not tell)", st.Remaining)
	}
	if waiting := map[bool]int{true: 2, false: -1}[e.waiters]; st.Waiting != waiting {
		t.Errorf("status --json: waiting %d, want %d", st.Waiting, waiting)
	}

	holder.signal(syscall.SIGTERM)
	for _, p := range append(waiters, holder) {
		if code := p.wait(30 * time.Second); code != 0 {
			t.Errorf("exit %d, want 0:\n%s", code, p.stderr.String())
		}
	}
	evs := readEvents(t, events)
	terms := e.history(t, lock)
	out, _ = e.output(t, "history", lock)
	t.Logf("history:\n%s", out)
	if lines := strings.Split(strings.TrimSpace(out), "\n"); len(lines) != 1+len(terms) || !strings.HasPrefix(lines[0], "TOKEN") {
		t.Errorf("history prints %d lines, want a header and %d terms", len(lines), len(terms))
	}
	if len(terms) != 6 {
		t.Fatalf("history lists %d terms, want 6: %+v", len(terms), terms)
	}
	for i, term := range terms {
		start, ok := etcdFind(evs, "start", term.Identity)
		end, exit := "exited", 0
		switch term.Identity {
		case "holder":
			end = "stopped"
		case "lost":
			end = "lost"
		case "term-1":
			exit = 3
		}
		if !ok || term.Token != start.Token || term.End != end || end != "lost" && term.ExitCode != exit {
			t.Errorf("term %d: %+v; want its child's token %d, %s %d", i, term, start.Token, end, exit)
		}
		if i > 0 && term.Token >= terms[i-1].Token {
			t.Errorf("history not newest first: token %d after %d", term.Token, terms[i-1].Token)
		}
	}
	if ids := []string{terms[2].Identity, terms[3].Identity, terms[5].Identity}; !slices.Equal(ids, []string{"holder", "lost", "term-0"}) {
		t.Errorf("history's terms %+v, want the waiters', then the holder's, the lost one's, term-1's and term-0's", terms)
	}
	if terms[2].Signal != "SIGTERM" || terms[3].Reason == "" {
		t.Errorf("history: the stopped term's signal %q, want SIGTERM; the lost term's reason %q, want one", terms[2].Signal, terms[3].Reason)
	}
	if st, code := e.status(t, lock); code != 3 || st.Held {
		t.Errorf("status after the last release: exit %d, %+v; want 3, not held", code, st)
	}
}

// testStatusAfterLeaderKilled (issue 26): once the lease of a leader
// killed with SIGKILL has run out by the store's own measure, status says
// the lock is not held and exits 3. Before the kill it says who holds it,
// and exits 0.
func testStatusAfterLeaderKilled(t *testing.T, e *env) {
	lock, events := e.lock("lock"), etcdEvents(t)
	leader, _ := e.leader(t, events, "forever", lock, "leader")
	if st, code := e.status(t, lock); code != 0 || !st.Held || st.Identity != "leader" {
		t.Fatalf("status while the leader runs: exit %d, %+v; want held by leader", code, st)
	}
	if err := syscall.Kill(leader.pid(), syscall.SIGKILL); err != nil {
		t.Fatal(err)
	}
	killed := time.Now()
	leader.wait(10 * time.Second)
	var st etcdStatus
	code := 0
	waitFor(t, e.statusBound, "status to say the lock is not held", every(20*time.Millisecond, func() bool {
		st, code = e.status(t, lock)
		return code == 3 && !st.Held
	}))
	t.Logf("status says not held %v after the leader's SIGKILL", time.Since(killed).Round(time.Millisecond))
}

// testCheck: `leaderrun check` in the child exits 0 while leading, and 1
// within the store's notice bound of the lease being taken away
// (target.losses[0]), never 0 again; leaderrun exits 76. The job ignores
// SIGTERM, and the grace is 3 s, so that it runs on to see it.
func testCheck(t *testing.T, e *env) {
	lock := e.lock("lock")
	out, job := checkJob(t)
	grace := 3 * time.Second
	lease := max(e.timings.lease, e.timings.deadline+grace+e.timings.retry+time.Second)
	p := e.job(t, nil, e.args(lock, "checker", "--lease-duration", lease.String(), "--kill-grace", grace.String(), "--shell", "--", job)...)
	waitFor(t, 20*time.Second, "a successful check", func() bool { return len(checks(out, 0)) > 0 })
	e.settle(t, p)
	lost := time.Now()
	if at := e.losses[0].do(t, e, lock); !at.IsZero() {
		lost = at
	}
	expectCheckFailsWithin(t, p, out, lost, e.notice)
}

// testCredentialsStayOut: the variables that carry the store's
// credentials (store.credentials), whose only purpose is the lock, and
// systemd's watchdog variables (leaderrun's own) do not reach the job;
// --pass-credentials passes the store's on. The variables a job uses for
// its own work (store.kept) reach it always.
func testCredentialsStayOut(t *testing.T, e *env) {
	var env []string
	for _, name := range e.credentials {
		if !slices.ContainsFunc(e.target.env, func(kv string) bool { return strings.HasPrefix(kv, name+"=") }) {
			env = append(env, name+"=e2e-"+strings.ToLower(name))
		}
	}
	env = append(append(env, e.kept...), "WATCHDOG_USEC=30000000", "WATCHDOG_PID=1")
	for _, pass := range []bool{false, true} {
		t.Run(map[bool]string{false: "default", true: "--pass-credentials"}[pass], func(t *testing.T) {
			out := filepath.Join(t.TempDir(), "env")
			extra := []string{"--shell"}
			if pass {
				extra = append(extra, "--pass-credentials")
			}
			p := e.job(t, env, append(e.args(e.lock(strconv.FormatBool(pass)), "c", extra...), "--", "env > "+out)...)
			if code := p.wait(30 * time.Second); code != 0 {
				t.Fatalf("exit %d:\n%s", code, p.stderr.String())
			}
			data, err := os.ReadFile(out)
			if err != nil {
				t.Fatal(err)
			}
			got := map[string]bool{}
			for _, line := range strings.Split(string(data), "\n") {
				name, _, _ := strings.Cut(line, "=")
				got[name] = true
			}
			for _, name := range e.credentials {
				if got[name] != pass {
					t.Errorf("%s in the command's environment: %v, want %v", name, got[name], pass)
				}
			}
			for _, name := range []string{"WATCHDOG_USEC", "WATCHDOG_PID"} {
				if got[name] {
					t.Errorf("%s (systemd's, for leaderrun) reached the command", name)
				}
			}
			for _, kv := range append(slices.Clone(e.kept), "FENCE_TOKEN=") {
				if name, _, _ := strings.Cut(kv, "="); !got[name] {
					t.Errorf("%s missing from the command's environment", name)
				}
			}
		})
	}
}

// testTokensSurviveRestart: the store's server restarted (stopped, then
// started with its data) while no one holds the lock, the next grant's
// token is still greater than every one before (S1).
func testTokensSurviveRestart(t *testing.T, e *env) {
	lock, events := e.lock("lock"), etcdEvents(t)
	for _, id := range []string{"before", "after"} {
		if id == "after" {
			began := time.Now()
			e.stopServer(t)
			e.startServer(t)
			t.Logf("the store's server restarted in %v", time.Since(began).Round(time.Millisecond))
		}
		if code := e.run(t, events, "exit:0", lock, id, "--wait", "30s").wait(60 * time.Second); code != 0 {
			t.Fatalf("%s the restart: exit %d", id, code)
		}
	}
	evs := readEvents(t, events)
	first, _ := etcdFind(evs, "start", "before")
	next, ok := etcdFind(evs, "start", "after")
	t.Logf("tokens %d before the restart, %d after it", first.Token, next.Token)
	if !ok || next.Token <= first.Token {
		t.Errorf("the token after the restart, %d, is not greater than %d before it", next.Token, first.Token)
	}
}
