//go:build linux

package e2e

import (
	"encoding/json"
	"fmt"
	"io"
	"log"
	"net"
	"net/http"
	"net/http/httptest"
	"net/http/httputil"
	"net/url"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/hashicorp/consul/api"

	"github.com/leaderrun/leaderrun/internal/testenv"
)

// Timings of a fast Consul run. A Consul session TTL is at least 10 s;
// 10 s > 6 s + 1 s keeps the child dead before the lease can expire.
const (
	consulTTL    = 10 * time.Second
	consulPrefix = "leaderrun/"
)

// consulArgs are the flags of a Consul run with the shortest TTL Consul
// allows and no lock-delay, then extra.
func consulArgs(addr, lock, id string, extra ...string) []string {
	return append([]string{"--consul-addr", addr, "--lock", lock, "--identity", id,
		"--lease-duration", consulTTL.String(), "--renew-deadline", "6s", "--retry-period", "1s",
		"--kill-grace", "1s", "--consul-lock-delay", "0s"}, extra...)
}

// consulRun is consulArgs followed by the recording child.
func consulRun(t *testing.T, addr, lock, id string, extra ...string) []string {
	return append(append(consulArgs(addr, lock, id, extra...), "--"), childArgv(t)...)
}

// consulTrials is $E2E_TRIALS, or def.
func consulTrials(t *testing.T, def int) int {
	t.Helper()
	s := os.Getenv("E2E_TRIALS")
	if s == "" {
		return def
	}
	n, err := strconv.Atoi(s)
	if err != nil || n < 1 {
		t.Fatalf("E2E_TRIALS=%q: want a positive number", s)
	}
	return n
}

// consulClient is a client of the agent at addr, playing the operator.
func consulClient(t *testing.T, addr string) *api.Client {
	t.Helper()
	cfg := api.DefaultConfig()
	cfg.Address = addr
	c, err := api.NewClient(cfg)
	if err != nil {
		t.Fatal(err)
	}
	return c
}

// consulHolder returns the session holding lock, or "".
func consulHolder(t *testing.T, c *api.Client, lock string) string {
	t.Helper()
	pair, _, err := c.KV().Get(consulPrefix+lock, nil)
	if err != nil {
		t.Fatalf("read %s: %v", consulPrefix+lock, err)
	}
	if pair == nil {
		return ""
	}
	return pair.Session
}

// consulCandidates counts the sessions leaderrun created for lock: its
// holder's and its waiters'.
func consulCandidates(t *testing.T, c *api.Client, lock string) int {
	t.Helper()
	sessions, _, err := c.Session().List(nil)
	if err != nil {
		t.Fatalf("list sessions: %v", err)
	}
	n := 0
	for _, s := range sessions {
		if s.Name == "leaderrun "+consulPrefix+lock {
			n++
		}
	}
	return n
}

// consulStarts returns the "start" events, in order.
func consulStarts(evs []event) []event {
	var out []event
	for _, e := range evs {
		if e.Kind == "start" {
			out = append(out, e)
		}
	}
	return out
}

// consulFirst returns the first event of kind from identity id ("": any).
func consulFirst(evs []event, kind, id string) (event, bool) {
	for _, e := range evs {
		if e.Kind == kind && (id == "" || e.ID == id) {
			return e, true
		}
	}
	return event{}, false
}

// consulSaw is a waitEvents condition: an event of kind from id was seen.
func consulSaw(kind, id string) func([]event) bool {
	return func(evs []event) bool { _, ok := consulFirst(evs, kind, id); return ok }
}

// consulSummary formats durations as min/median/max.
func consulSummary(ds []time.Duration) string {
	if len(ds) == 0 {
		return "none"
	}
	s := slices.Clone(ds)
	slices.Sort(s)
	r := func(d time.Duration) time.Duration { return d.Round(10 * time.Microsecond) }
	return fmt.Sprintf("min %v, median %v, max %v (n=%d)", r(s[0]), r(s[len(s)/2]), r(s[len(s)-1]), len(s))
}

// TestConsulHandoversAndTokens: three instances, each restarted when it
// exits as systemd would, never run two children at once, and the fencing
// token grows with every grant, also after the key is deleted by hand
// between two runs (where Consul's LockIndex starts again at 1).
func TestConsulHandoversAndTokens(t *testing.T) {
	t.Parallel()
	agent := testenv.StartConsul(t, testenv.ConsulOptions{})
	c := consulClient(t, agent.Addr())
	handovers := consulTrials(t, 5)
	events := filepath.Join(t.TempDir(), "events")
	const lock = "handover"

	// runSlots keeps three instances alive until n children have started
	// in all, then withdraws the ones still waiting.
	runSlots := func(n int) {
		var slots [3]*proc
		run := func(i int) {
			slots[i] = start(t, childEnv(events, "sleep:50ms"), consulRun(t, agent.Addr(), lock, fmt.Sprintf("slot%d", i))...)
		}
		for i := range slots {
			run(i)
		}
		for target := count(readEvents(t, events), "start") + n; ; {
			var exited int
			select {
			case <-slots[0].done:
				exited = 0
			case <-slots[1].done:
				exited = 1
			case <-slots[2].done:
				exited = 2
			case <-time.After(30 * time.Second):
				t.Fatalf("no instance exited for 30s\n%s", formatEvents(readEvents(t, events)))
			}
			if code := slots[exited].code; code != 0 {
				t.Fatalf("slot %d exited %d\n%s", exited, code, slots[exited].stderr.String())
			}
			if count(readEvents(t, events), "start") >= target {
				break
			}
			run(exited)
		}
		for _, p := range slots {
			if !p.exited() {
				p.signal(syscall.SIGTERM)
				p.wait(10 * time.Second)
			}
		}
	}

	runSlots(handovers / 2)
	before := readEvents(t, events)
	lastBefore := consulStarts(before)[len(consulStarts(before))-1].Token
	pair, _, err := c.KV().Get(consulPrefix+lock, nil)
	if err != nil || pair == nil {
		t.Fatalf("read the lock key: %v", err)
	}
	lockIndexBefore := pair.LockIndex
	if _, err := c.KV().Delete(consulPrefix+lock, nil); err != nil {
		t.Fatalf("delete the lock key: %v", err)
	}
	runSlots(handovers - handovers/2)

	evs := readEvents(t, events)
	ivs := checkExclusive(t, evs)
	if len(ivs) < handovers {
		t.Fatalf("%d children ran, want %d", len(ivs), handovers)
	}
	pair, _, err = c.KV().Get(consulPrefix+lock, nil)
	if err != nil || pair == nil {
		t.Fatalf("read the lock key: %v", err)
	}
	firstAfter := consulStarts(evs)[len(consulStarts(before))].Token
	if firstAfter <= lastBefore {
		t.Errorf("token %d after the key was deleted, not greater than %d before", firstAfter, lastBefore)
	}
	var gaps []time.Duration
	tokens := make([]uint64, len(ivs))
	for i, iv := range ivs {
		tokens[i] = iv.Token
		if i > 0 && i != len(consulStarts(before)) {
			gaps = append(gaps, iv.Start.Sub(ivs[i-1].End))
		}
	}
	after := len(ivs) - len(consulStarts(before))
	t.Logf("%d grants, tokens %v; key deleted by hand after token %d; LockIndex was %d then and is %d after %d more grants: it started again at 1",
		len(ivs), tokens, lastBefore, lockIndexBefore, pair.LockIndex, after)
	t.Logf("handover gap, old child's exit to new child's start: %s", consulSummary(gaps))
}

// TestConsulSessionDestroyed: destroying the leader's session stops its
// child at once (S3) and leaderrun exits 76.
func TestConsulSessionDestroyed(t *testing.T) {
	t.Parallel()
	agent := testenv.StartConsul(t, testenv.ConsulOptions{})
	c := consulClient(t, agent.Addr())
	var lat []time.Duration
	for i := range consulTrials(t, 5) {
		events := filepath.Join(t.TempDir(), "events")
		lock := fmt.Sprintf("destroyed-%d", i)
		p := start(t, childEnv(events, "forever"), consulRun(t, agent.Addr(), lock, "leader")...)
		waitEvents(t, events, 10*time.Second, "the child", consulSaw("start", ""))
		session := consulHolder(t, c, lock)
		destroyed := time.Now()
		if _, err := c.Session().Destroy(session, nil); err != nil {
			t.Fatal(err)
		}
		evs := waitEvents(t, events, 5*time.Second, "the kill signal", consulSaw("signal", ""))
		sig, _ := consulFirst(evs, "signal", "")
		d := sig.At.Sub(destroyed)
		lat = append(lat, d)
		if d > time.Second {
			t.Errorf("trial %d: child signalled %v after the session was destroyed, want within 1s", i, d)
		}
		if code := p.wait(10 * time.Second); code != 76 {
			t.Errorf("trial %d: leaderrun exited %d, want 76\n%s", i, code, p.stderr.String())
		}
	}
	t.Logf("session destroyed → child signalled: %s (aim < 100ms)", consulSummary(lat))
}

// consulTimedArgs are the flags of a Consul run with the given timing
// flags (none: leaderrun's defaults) and no --consul-lock-delay, so that
// the lock-delay is the derived one, then extra.
func consulTimedArgs(addr, lock, id string, timing []string, extra ...string) []string {
	args := append([]string{"--consul-addr", addr, "--lock", lock, "--identity", id}, timing...)
	return append(args, extra...)
}

// TestConsulCrashFailover: when the leading leaderrun is killed with
// SIGKILL, its child dies with it, and the follower first in line, which
// has seen no renewal for a lease, takes over: its child starts within
// lease + lock-delay + 1 s of the kill, the lock-delay being the derived
// --kill-grace + 1 s. Once with short timings, once with the defaults.
func TestConsulCrashFailover(t *testing.T) {
	t.Parallel()
	agent := testenv.StartConsul(t, testenv.ConsulOptions{})
	c := consulClient(t, agent.Addr())
	cases := []struct {
		name                    string
		timing                  []string
		lease, grace, lockDelay time.Duration
	}{
		{name: "lease 10s", timing: []string{"--lease-duration", "10s", "--renew-deadline", "6s", "--retry-period", "2s", "--kill-grace", "2s"},
			lease: 10 * time.Second, grace: 2 * time.Second, lockDelay: 3 * time.Second},
		{name: "defaults", lease: 15 * time.Second, grace: 3 * time.Second, lockDelay: 4 * time.Second},
	}
	trials := consulTrials(t, 3)
	for _, tc := range cases {
		for i := range trials {
			t.Run(fmt.Sprintf("%s/%d", tc.name, i), func(t *testing.T) {
				t.Parallel()
				events := filepath.Join(t.TempDir(), "events")
				lock := fmt.Sprintf("crash-%s-%d", strings.ReplaceAll(tc.name, " ", ""), i)
				run := func(id string) *proc {
					args := append(append(consulTimedArgs(agent.Addr(), lock, id, tc.timing), "--"), childArgv(t)...)
					return start(t, childEnv(events, "forever"), args...)
				}
				leader := run("leader")
				evs := waitEvents(t, events, 10*time.Second, "the leader's child", consulSaw("start", "leader"))
				first, _ := consulFirst(evs, "start", "leader")
				info, _, err := c.Session().Info(consulHolder(t, c, lock), nil)
				if err != nil || info == nil {
					t.Fatalf("the leader's session: %v", err)
				}
				if info.LockDelay != tc.lockDelay {
					t.Errorf("the leader's session has lock-delay %v, want --kill-grace + 1s = %v", info.LockDelay, tc.lockDelay)
				}
				follower := run("follower")
				waitFor(t, 10*time.Second, "the follower to queue", func() bool { return consulWaiting(t, c, lock) == 1 })

				killed := time.Now()
				if err := syscall.Kill(leader.pid(), syscall.SIGKILL); err != nil {
					t.Fatal(err)
				}
				waitFor(t, 5*time.Second, "the leader's child to die", func() bool { return !alive(first.Pid) })
				childGone := time.Since(killed)
				if childGone > time.Second {
					t.Errorf("the leader's child died %v after leaderrun was killed, want within 1s", childGone)
				}
				limit := tc.lease + tc.lockDelay + time.Second
				evs = waitEvents(t, events, limit+10*time.Second, "the follower's child", consulSaw("start", "follower"))
				next, _ := consulFirst(evs, "start", "follower")
				failover := next.At.Sub(killed)
				if failover > limit {
					t.Errorf("follower's child started %v after the kill, want within lease + lock-delay + 1s = %v", failover, limit)
				}
				if failover < tc.lease {
					t.Errorf("follower's child started %v after the kill, within the lease of %v", failover, tc.lease)
				}
				if next.Token <= first.Token {
					t.Errorf("follower's token %d not greater than %d", next.Token, first.Token)
				}
				t.Logf("kill -9, lease %v, lock-delay %v (derived): leader's child gone after %v; follower's child started after %v (bound %v)",
					tc.lease, tc.lockDelay, childGone.Round(time.Millisecond), failover.Round(time.Millisecond), limit)
				follower.signal(syscall.SIGTERM)
				follower.wait(10 * time.Second)
			})
		}
	}
}

// consulWaiting counts the live entries of lock's queue of waiters.
func consulWaiting(t *testing.T, c *api.Client, lock string) int {
	t.Helper()
	pairs, _, err := c.KV().List(consulPrefix+lock+":queue/", nil)
	if err != nil {
		t.Fatalf("list the queue of %s: %v", lock, err)
	}
	n := 0
	for _, p := range pairs {
		if p.Session != "" {
			n++
		}
	}
	return n
}

// TestConsulSIGTERMHandover: SIGTERM stops the leader's child, releases the
// key (no lock-delay for a release) and a follower starts at once. Not
// parallel: the 300 ms bound on the median covers process start-up and
// teardown, which a burst of parallel tests would measure instead; a single
// trial may take up to 1 s on a busy machine.
func TestConsulSIGTERMHandover(t *testing.T) {
	agent := testenv.StartConsul(t, testenv.ConsulOptions{})
	c := consulClient(t, agent.Addr())
	var gaps, stores []time.Duration
	for i := range consulTrials(t, 5) {
		events := filepath.Join(t.TempDir(), "events")
		lock := fmt.Sprintf("sigterm-%d", i)
		// The default lock-delay of 15 s: a release must not meet it.
		flags := []string{"--consul-lock-delay", "15s"}
		leader := start(t, childEnv(events, "forever"), consulRun(t, agent.Addr(), lock, "leader", flags...)...)
		waitEvents(t, events, 10*time.Second, "the leader's child", consulSaw("start", "leader"))
		follower := start(t, childEnv(events, "forever"), consulRun(t, agent.Addr(), lock, "follower", flags...)...)
		waitFor(t, 10*time.Second, "the follower to wait", func() bool { return consulCandidates(t, c, lock) == 2 })
		leader.signal(syscall.SIGTERM)
		if code := leader.wait(10 * time.Second); code != 0 {
			t.Errorf("trial %d: leader exited %d after SIGTERM, want its child's 0", i, code)
		}
		evs := waitEvents(t, events, 5*time.Second, "the follower's child", consulSaw("start", "follower"))
		checkExclusive(t, evs)
		exit, _ := consulFirst(evs, "exit", "leader")
		next, _ := consulFirst(evs, "start", "follower")
		gap := next.At.Sub(exit.At)
		gaps = append(gaps, gap)
		// A release that met the lock-delay would take 15 s: one trial
		// slowed by a busy machine must not read as one.
		if gap > time.Second {
			t.Errorf("trial %d: follower's child started %v after the leader's child exited, want within 1s (a release meets no lock-delay)", i, gap)
		}
		follower.signal(syscall.SIGTERM)
		follower.wait(10 * time.Second)
		released, ok1 := consulLogTime(leader.stderr.String(), "leadership released")
		acquired, ok2 := consulLogTime(follower.stderr.String(), "leadership acquired")
		if ok1 && ok2 {
			stores = append(stores, acquired.Sub(released))
		}
	}
	t.Logf("SIGTERM handover, old child's exit → new child's start: %s", consulSummary(gaps))
	if m := median(gaps); m > 300*time.Millisecond {
		t.Errorf("SIGTERM handover: median %v from the old child's exit to the new child's start, want within 300ms", m)
	}
	t.Logf("of which Consul, leader's release logged → follower's grant logged (ms resolution): %s", consulSummary(stores))
}

// consulLogTime is the time of the first log line of leaderrun's text log that
// has msg.
func consulLogTime(out, msg string) (time.Time, bool) {
	for _, line := range strings.Split(out, "\n") {
		line = strings.TrimSpace(line)
		if !strings.Contains(line, `msg="`+msg+`"`) {
			continue
		}
		ts, _, _ := strings.Cut(strings.TrimPrefix(line, "time="), " ")
		at, err := time.Parse(time.RFC3339Nano, ts)
		return at, err == nil
	}
	return time.Time{}, false
}

// TestConsulStalledLeader: a leader whose connection to Consul stalls (no
// byte moves, nothing is closed) stops its child on its renew deadline,
// before the follower, which sees no renewal for a lease, takes over, in
// every trial; the follower's child starts within a lease and a second of
// the stall (lock-delay 0 here: safety does not rest on it). The trials run
// side by side, each with its own lock and proxy, in phases driven from the
// test's goroutine: they wait on Consul's clock, not on the CPU, and
// parallel subtests would run only GOMAXPROCS of them at a time.
func TestConsulStalledLeader(t *testing.T) {
	t.Parallel()
	agent := testenv.StartConsul(t, testenv.ConsulOptions{})
	c := consulClient(t, agent.Addr())
	type trial struct {
		lock, events string
		proxy        *testenv.Proxy
		leader       *proc
		stalled      time.Time
	}
	trials := make([]*trial, consulTrials(t, 5))
	for i := range trials {
		tr := &trial{lock: fmt.Sprintf("stall-%d", i), events: filepath.Join(t.TempDir(), "events"),
			proxy: testenv.NewProxy(t, agent.Addr())}
		tr.leader = start(t, childEnv(tr.events, "forever"), consulRun(t, tr.proxy.Addr(), tr.lock, "leader")...)
		trials[i] = tr
	}
	for _, tr := range trials {
		waitEvents(t, tr.events, 10*time.Second, tr.lock+": the leader's child", consulSaw("start", "leader"))
		start(t, childEnv(tr.events, "forever"), consulRun(t, agent.Addr(), tr.lock, "follower")...)
	}
	for _, tr := range trials {
		waitFor(t, 10*time.Second, tr.lock+": the follower to wait", func() bool { return consulWaiting(t, c, tr.lock) == 1 })
	}
	for _, tr := range trials {
		tr.stalled = time.Now()
		tr.proxy.Stall()
	}
	var stops, takes, margins []time.Duration
	for _, tr := range trials {
		evs := waitEvents(t, tr.events, 2*consulTTL+10*time.Second, tr.lock+": the follower's child", consulSaw("start", "follower"))
		checkExclusive(t, evs)
		sig, ok := consulFirst(evs, "signal", "leader")
		exit, _ := consulFirst(evs, "exit", "leader")
		next, _ := consulFirst(evs, "start", "follower")
		if !ok || exit.At.After(next.At) {
			t.Errorf("%s: the leader's child was not stopped before the follower's started\n%s", tr.lock, formatEvents(evs))
			continue
		}
		stops = append(stops, sig.At.Sub(tr.stalled))
		takes = append(takes, next.At.Sub(tr.stalled))
		if d := next.At.Sub(tr.stalled); d > consulTTL+time.Second {
			t.Errorf("%s: the follower's child started %v after the stall, want within the lease + 1s", tr.lock, d)
		}
		margins = append(margins, next.At.Sub(exit.At))
	}
	for _, tr := range trials {
		tr.proxy.Resume()
		if code := tr.leader.wait(15 * time.Second); code != 76 {
			t.Errorf("%s: leader exited %d, want 76\n%s", tr.lock, code, tr.leader.stderr.String())
		}
	}
	t.Logf("stalled leader, %d trials: stall → leader's child signalled: %s", len(trials), consulSummary(stops))
	t.Logf("stall → follower's child started: %s", consulSummary(takes))
	t.Logf("leader's child exit → follower's child start (safety margin): %s", consulSummary(margins))
}

// TestConsulStatus: status exits 0 with a leader and 3 without, and
// --json carries the holder, its token (the child's FENCE_TOKEN), the
// session TTL and node.
func TestConsulStatus(t *testing.T) {
	t.Parallel()
	agent := testenv.StartConsul(t, testenv.ConsulOptions{})
	status := func(extra ...string) (int, string) {
		p := start(t, nil, append([]string{"status", "--consul-addr", agent.Addr(), "--lock", "st"}, extra...)...)
		code := p.wait(10 * time.Second)
		return code, p.stderr.String()
	}
	if code, out := status(); code != 3 || !strings.Contains(out, "leader:   none") {
		t.Errorf("status of a free lock: exit %d, want 3\n%s", code, out)
	}
	events := filepath.Join(t.TempDir(), "events")
	leader := start(t, childEnv(events, "forever"), consulRun(t, agent.Addr(), "st", "the-leader")...)
	evs := waitEvents(t, events, 10*time.Second, "the child", consulSaw("start", ""))
	code, out := status("--json")
	if code != 0 {
		t.Fatalf("status --json with a leader: exit %d\n%s", code, out)
	}
	var st struct {
		Held     bool   `json:"held"`
		Identity string `json:"identity"`
		Token    uint64 `json:"token"`
		TTL      int64  `json:"ttl_ns"`
		Node     string `json:"node"`
		Backend  string `json:"backend"`
		Key      string `json:"key"`
	}
	if err := json.Unmarshal([]byte(out), &st); err != nil {
		t.Fatalf("status --json: %v\n%s", err, out)
	}
	if !st.Held || st.Identity != "the-leader" || st.Token != evs[0].Token || time.Duration(st.TTL) != consulTTL ||
		st.Node != agent.Node() || st.Backend != "consul" || st.Key != consulPrefix+"st" {
		t.Errorf("status %+v, want held by the-leader with token %d, TTL %v, node %s", st, evs[0].Token, consulTTL, agent.Node())
	}
	if code, out := status(); code != 0 || !strings.Contains(out, "the-leader") || !strings.Contains(out, "ttl:") {
		t.Errorf("status: exit %d\n%s", code, out)
	}
	t.Logf("status --json: %s", strings.TrimSpace(out))
	leader.signal(syscall.SIGTERM)
	leader.wait(10 * time.Second)
}

// TestConsulTryAndWait: --try on a held lock exits 75 at once and leaves no
// session behind; --wait gives up on time.
func TestConsulTryAndWait(t *testing.T) {
	t.Parallel()
	agent := testenv.StartConsul(t, testenv.ConsulOptions{})
	c := consulClient(t, agent.Addr())
	events := filepath.Join(t.TempDir(), "events")
	holder := start(t, childEnv(events, "forever"), consulRun(t, agent.Addr(), "held", "holder")...)
	waitEvents(t, events, 10*time.Second, "the holder's child", consulSaw("start", ""))
	cases := []struct {
		name             string
		flags            []string
		code             int
		minTime, maxTime time.Duration
	}{
		{name: "try", flags: []string{"--try"}, code: 75, maxTime: time.Second},
		{name: "wait", flags: []string{"--wait", "1s"}, code: 75, minTime: time.Second, maxTime: 3 * time.Second},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			begin := time.Now()
			p := start(t, childEnv(events, "exit:0"), consulRun(t, agent.Addr(), "held", tc.name, tc.flags...)...)
			code := p.wait(10 * time.Second)
			took := time.Since(begin)
			if code != tc.code || took < tc.minTime || took > tc.maxTime {
				t.Errorf("exit %d after %v, want %d within [%v, %v]\n%s", code, took, tc.code, tc.minTime, tc.maxTime, p.stderr.String())
			}
			if n := consulCandidates(t, c, "held"); n != 1 {
				t.Errorf("%d sessions for the lock after %s exited, want the holder's only", n, tc.name)
			}
			t.Logf("%s: exit %d after %v", tc.name, code, took)
		})
	}
	if n := count(readEvents(t, events), "start"); n != 1 {
		t.Errorf("%d children started, want the holder's only", n)
	}
	holder.signal(syscall.SIGTERM)
	holder.wait(10 * time.Second)
}

// TestConsulErrors: an unreachable agent or a refused token exits 69 with a
// message that names the address and never shows the token; bad Consul
// flags exit 64 naming the flag.
func TestConsulErrors(t *testing.T) {
	t.Parallel()
	const secret = "6f1c1d5e-not-for-logs"
	agent := testenv.StartConsul(t, testenv.ConsulOptions{ACLToken: "root-" + secret})
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	closed := l.Addr().String()
	l.Close()
	tokenFile := filepath.Join(t.TempDir(), "token")
	if err := os.WriteFile(tokenFile, []byte(secret+"\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	cases := []struct {
		name string
		env  []string
		args []string
		code int
		want []string
	}{
		{name: "unreachable", args: consulArgs(closed, "x", "a", "--consul-token", secret, "--", "true"),
			code: 69, want: []string{closed, "connection refused"}},
		{name: "unreachable status", args: []string{"status", "--consul-addr", closed, "--lock", "x", "--consul-token", secret},
			code: 69, want: []string{closed}},
		{name: "token refused", args: consulArgs(agent.Addr(), "x", "a", "--consul-token", secret, "--", "true"),
			code: 69, want: []string{agent.Addr(), "403"}},
		{name: "token file refused", args: consulArgs(agent.Addr(), "x", "a", "--consul-token-file", tokenFile, "--", "true"),
			code: 69, want: []string{agent.Addr(), "403"}},
		{name: "token from env refused", env: []string{"CONSUL_HTTP_TOKEN=" + secret, "CONSUL_HTTP_ADDR=" + agent.Addr()},
			args: []string{"--lock", "x", "--lease-duration", "10s", "--renew-deadline", "6s", "--retry-period", "1s", "--kill-grace", "1s", "--", "true"},
			code: 69, want: []string{agent.Addr(), "403"}},
		{name: "missing token file", args: consulArgs(agent.Addr(), "x", "a", "--consul-token-file", tokenFile+".missing", "--", "true"),
			code: 64, want: []string{"--consul-token-file"}},
		{name: "ttl too short", args: consulArgs(agent.Addr(), "x", "a", "--lease-duration", "9s", "--renew-deadline", "5s", "--", "true"),
			code: 64, want: []string{"--lease-duration 9s", "10s"}},
		{name: "ttl too long", args: consulArgs(agent.Addr(), "x", "a", "--lease-duration", "25h", "--", "true"),
			code: 64, want: []string{"--lease-duration 25h0m0s", "24h"}},
		{name: "lock-delay too long", args: consulArgs(agent.Addr(), "x", "a", "--consul-lock-delay", "61s", "--", "true"),
			code: 64, want: []string{"--consul-lock-delay 1m1s"}},
		{name: "negative lock-delay", args: consulArgs(agent.Addr(), "x", "a", "--consul-lock-delay", "-1s", "--", "true"),
			code: 64, want: []string{"--consul-lock-delay -1s"}},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			p := start(t, tc.env, tc.args...)
			code := p.wait(20 * time.Second)
			out := p.stderr.String()
			if code != tc.code {
				t.Errorf("exit %d, want %d\n%s", code, tc.code, out)
			}
			for _, w := range tc.want {
				if !strings.Contains(out, w) {
					t.Errorf("output does not say %q:\n%s", w, out)
				}
			}
			if strings.Contains(out, secret) {
				t.Errorf("output shows the token:\n%s", out)
			}
		})
	}
	// The management token works, so the refusals above were about the token.
	ok := start(t, []string{"CONSUL_HTTP_TOKEN=root-" + secret}, consulArgs(agent.Addr(), "x", "a", "--", "true")...)
	if code := ok.wait(20 * time.Second); code != 0 {
		t.Errorf("with the management token: exit %d\n%s", code, ok.stderr.String())
	}
}

// TestConsulBench compares leaderrun with `consul lock` on the same agent:
// the time from starting the tool to its child's start with a free lock,
// and the memory (RSS) the tool's processes take while leading, the child
// excluded. Both run the same child; runs alternate, 20 of each unless
// E2E_TRIALS says otherwise. leaderrun is built without the race
// detector, as shipped. Run with E2E_BENCH=1.
func TestConsulBench(t *testing.T) {
	if os.Getenv("E2E_BENCH") != "1" {
		t.Skip("benchmark: set E2E_BENCH=1")
	}
	agent := testenv.StartConsul(t, testenv.ConsulOptions{})
	bench := filepath.Join(t.TempDir(), "leaderrun-bench")
	build := exec.Command("go", "build", "-o", bench, ".")
	build.Dir = ".."
	if out, err := build.CombinedOutput(); err != nil {
		t.Fatalf("go build: %v\n%s", err, out)
	}
	consulBin := testenv.ConsulBinary(t)
	child := childArgv(t)
	tools := []struct {
		name string
		argv []string
	}{
		{"leaderrun", append([]string{bench, "--consul-addr", agent.Addr(), "--lock", "bench", "--"}, child...)},
		{"consul lock", append([]string{consulBin, "lock", "-http-addr=" + agent.Addr(), "-shell=false", "bench-consul-lock"}, child...)},
	}
	runs := consulTrials(t, 20)
	latency := make([][]time.Duration, len(tools))
	rss := make([][]int, len(tools))
	mainRSS := make([][]int, len(tools))
	for i := range runs {
		for k := range tools {
			j := (i + k) % len(tools) // alternate which tool goes first
			lat, main, total := consulBenchRun(t, tools[j].argv)
			latency[j] = append(latency[j], lat)
			rss[j] = append(rss[j], total)
			mainRSS[j] = append(mainRSS[j], main)
		}
	}
	median := func(ds []time.Duration) time.Duration {
		s := slices.Clone(ds)
		slices.Sort(s)
		return s[len(s)/2]
	}
	medianKB := func(ns []int) int {
		s := slices.Clone(ns)
		slices.Sort(s)
		return s[len(s)/2]
	}
	for j, tool := range tools {
		t.Logf("%-11s start→child: %s; RSS while leading: median %d KiB (min %d, max %d), of which the main process %d KiB",
			tool.name, consulSummary(latency[j]), medianKB(rss[j]), slices.Min(rss[j]), slices.Max(rss[j]), medianKB(mainRSS[j]))
	}
	t.Logf("ratio leaderrun / consul lock: start→child %.2f, RSS %.2f",
		float64(median(latency[0]))/float64(median(latency[1])), float64(medianKB(rss[0]))/float64(medianKB(rss[1])))
}

// consulBenchRun starts argv with the recording child, measures the time until
// the child starts and, half a second later, the RSS of argv's process
// alone and with its consulDescendants other than the child (leaderrun's
// watchdog); then stops it with SIGTERM.
func consulBenchRun(t *testing.T, argv []string) (latency time.Duration, mainKB, totalKB int) {
	t.Helper()
	events := filepath.Join(t.TempDir(), "events")
	cmd := exec.Command(argv[0], argv[1:]...)
	cmd.Env = append(os.Environ(), childEnv(events, "forever")...)
	cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true}
	began := time.Now()
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	done := make(chan struct{})
	go func() { defer close(done); _ = cmd.Wait() }()
	defer func() {
		_ = cmd.Process.Signal(syscall.SIGTERM)
		select {
		case <-done:
		case <-time.After(10 * time.Second):
			_ = syscall.Kill(-cmd.Process.Pid, syscall.SIGKILL)
			<-done
			t.Errorf("%s did not stop on SIGTERM", argv[0])
		}
	}()
	evs := waitEvents(t, events, 10*time.Second, "the child", consulSaw("start", ""))
	latency = evs[0].At.Sub(began)
	time.Sleep(500 * time.Millisecond) // let it settle into leading; a measurement interval, not synchronisation
	for _, pid := range consulDescendants(cmd.Process.Pid) {
		if pid != evs[0].Pid {
			totalKB += consulRSS(pid)
		}
	}
	return latency, consulRSS(cmd.Process.Pid), totalKB
}

// consulDescendants returns pid and every process below it.
func consulDescendants(pid int) []int {
	children := map[int][]int{}
	entries, _ := os.ReadDir("/proc")
	for _, e := range entries {
		p, err := strconv.Atoi(e.Name())
		if err != nil {
			continue
		}
		data, err := os.ReadFile(filepath.Join("/proc", e.Name(), "stat"))
		if err != nil {
			continue
		}
		// Fields after the command name in parentheses: state, ppid, ...
		rest := string(data[strings.LastIndexByte(string(data), ')')+2:])
		fields := strings.Fields(rest)
		if len(fields) > 1 {
			ppid, _ := strconv.Atoi(fields[1])
			children[ppid] = append(children[ppid], p)
		}
	}
	out := []int{pid}
	for i := 0; i < len(out); i++ {
		out = append(out, children[out[i]]...)
	}
	return out
}

// consulRSS is a process's resident set size in KiB, 0 if it is gone.
func consulRSS(pid int) int {
	data, err := os.ReadFile(filepath.Join("/proc", strconv.Itoa(pid), "status"))
	if err != nil {
		return 0
	}
	for _, line := range strings.Split(string(data), "\n") {
		if v, ok := strings.CutPrefix(line, "VmRSS:"); ok {
			n, _ := strconv.Atoi(strings.TrimSuffix(strings.TrimSpace(v), " kB"))
			return n
		}
	}
	return 0
}

// consulProxy is an HTTP proxy in front of the agent for one leaderrun,
// which records every request: what a process costs Consul, and when its
// blocking queries were answered by a change.
type consulProxy struct {
	srv  *httptest.Server
	mu   sync.Mutex
	reqs []consulRequest
}

// consulRequest is one request through a consulProxy. index is the
// request's ?index (0: not a blocking query), got the answer's
// X-Consul-Index; end is zero while it is open.
type consulRequest struct {
	method, path string
	query        string // "?" and the raw query, "" if none
	start, end   time.Time
	index, got   uint64
}

func (r consulRequest) blocking() bool { return r.method == "GET" && r.index > 0 }
func (r consulRequest) woke() bool     { return r.blocking() && r.got != 0 && r.got != r.index }

func newConsulProxy(t *testing.T, agent string) *consulProxy {
	t.Helper()
	target, err := url.Parse("http://" + agent)
	if err != nil {
		t.Fatal(err)
	}
	rp := httputil.NewSingleHostReverseProxy(target)
	rp.ErrorLog = log.New(io.Discard, "", 0)
	p := &consulProxy{}
	p.srv = httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		index, _ := strconv.ParseUint(r.URL.Query().Get("index"), 10, 64)
		p.mu.Lock()
		i := len(p.reqs)
		var query string
		if r.URL.RawQuery != "" {
			query = "?" + r.URL.RawQuery
		}
		p.reqs = append(p.reqs, consulRequest{method: r.Method, path: r.URL.Path, query: query, start: time.Now(), index: index})
		p.mu.Unlock()
		rp.ServeHTTP(w, r)
		got, _ := strconv.ParseUint(w.Header().Get("X-Consul-Index"), 10, 64)
		p.mu.Lock()
		p.reqs[i].end, p.reqs[i].got = time.Now(), got
		p.mu.Unlock()
	}))
	t.Cleanup(func() {
		p.srv.CloseClientConnections()
		p.srv.Close()
	})
	return p
}

func (p *consulProxy) addr() string { return strings.TrimPrefix(p.srv.URL, "http://") }

// answered returns the requests answered in [from, to).
func (p *consulProxy) answered(from, to time.Time) []consulRequest {
	p.mu.Lock()
	defer p.mu.Unlock()
	var out []consulRequest
	for _, r := range p.reqs {
		if !r.end.IsZero() && !r.end.Before(from) && r.end.Before(to) {
			out = append(out, r)
		}
	}
	return out
}

// sent describes the requests sent in [from, to), as "METHOD path?query".
func (p *consulProxy) sent(from, to time.Time) []string {
	p.mu.Lock()
	defer p.mu.Unlock()
	var out []string
	for _, r := range p.reqs {
		if !r.start.Before(from) && r.start.Before(to) {
			out = append(out, r.method+" "+r.path+r.query)
		}
	}
	return out
}

// blocked reports whether a blocking query on path ("": any) is open.
func (p *consulProxy) blocked(path string) bool {
	p.mu.Lock()
	defer p.mu.Unlock()
	for _, r := range p.reqs {
		if r.blocking() && r.end.IsZero() && (path == "" || r.path == path) {
			return true
		}
	}
	return false
}

// consulIssueTimings are the timings of issue 15's figures.
var consulIssueTimings = []string{"--lease-duration", "10s", "--renew-deadline", "6s", "--retry-period", "2s", "--kill-grace", "2s"}

// TestConsulIdleWaiters counts what two idle leaderrun waiters send their
// agent over a minute (E2E_IDLE_WINDOW) while the leader renews every 2 s.
// The leader's renewals write nothing the waiters watch (its session's
// renewal and its TTL check's pass): the first in line waits on the lock
// key, the second on the first's queue entry, and each sends at most 0.1
// blocking queries/s (`consul lock`'s waiters send 0.05/s), none of them
// ending early for nothing. Neither polls: besides, only its sessions'
// renewals and its check's passes, every TTL/2 for the first in line,
// every 5 minutes for the second (parked: nothing in a minute).
func TestConsulIdleWaiters(t *testing.T) {
	t.Parallel()
	agent := testenv.StartConsul(t, testenv.ConsulOptions{})
	c := consulClient(t, agent.Addr())
	window := time.Minute
	if s := os.Getenv("E2E_IDLE_WINDOW"); s != "" {
		d, err := time.ParseDuration(s)
		if err != nil {
			t.Fatalf("E2E_IDLE_WINDOW=%q: %v", s, err)
		}
		window = d
	}
	const lock = "idle"
	events := filepath.Join(t.TempDir(), "events")
	run := func(addr, id string) *proc {
		args := append(append(consulTimedArgs(addr, lock, id, consulIssueTimings), "--"), childArgv(t)...)
		return start(t, childEnv(events, "forever"), args...)
	}
	leader := run(agent.Addr(), "leader")
	waitEvents(t, events, 10*time.Second, "the leader's child", consulSaw("start", "leader"))
	proxies := []*consulProxy{newConsulProxy(t, agent.Addr()), newConsulProxy(t, agent.Addr())}
	var waiters []*proc
	for i, p := range proxies {
		waiters = append(waiters, run(p.addr(), fmt.Sprintf("waiter%d", i)))
		waitFor(t, 10*time.Second, "the waiter to queue", func() bool { return consulWaiting(t, c, lock) == i+1 })
	}
	waitFor(t, 10*time.Second, "the first waiter to watch the key", func() bool { return proxies[0].blocked("/v1/kv/" + consulPrefix + lock) })
	waitFor(t, 10*time.Second, "the second waiter to watch the first", func() bool { return proxies[1].blocked("") })
	begin := time.Now()
	time.Sleep(window) // the measurement interval, not synchronisation
	end := time.Now()
	secs := end.Sub(begin).Seconds()
	for i, p := range proxies {
		var blocking, woke, short, renewals, passes, other int
		for _, r := range p.answered(begin, end) {
			switch {
			case r.blocking():
				blocking++
				if r.woke() {
					woke++
				} else if r.end.Sub(r.start) < time.Second {
					short++
				}
			case r.method == "PUT" && strings.HasPrefix(r.path, "/v1/session/renew/"):
				renewals++
			case r.method == "PUT" && strings.HasPrefix(r.path, "/v1/agent/check/pass/"):
				passes++
			default:
				other++
			}
		}
		t.Logf("waiter %d over %v: blocking queries %.3f/s (%d, %d answered by a change, %d under 1s for nothing), session renewals %.3f/s, check passes %.3f/s, other %d",
			i, end.Sub(begin).Round(time.Millisecond), float64(blocking)/secs, blocking, woke, short, float64(renewals)/secs, float64(passes)/secs, other)
		if short > 0 || other > 0 {
			t.Errorf("waiter %d: %d blocking queries under 1s for nothing, %d other requests", i, short, other)
		}
		if float64(blocking)/secs > 0.1 {
			t.Errorf("waiter %d: %.3f blocking queries/s, want at most 0.1", i, float64(blocking)/secs)
		}
		// The first in line renews its lock and queue sessions at each
		// pass of its check; the second, parked, its queue session only.
		if sessions := 2 - i; renewals != sessions*passes {
			t.Errorf("waiter %d: %d session renewals for %d check passes, want %d each", i, renewals, passes, sessions)
		}
	}
	for _, p := range append(waiters, leader) {
		p.signal(syscall.SIGTERM)
		p.wait(10 * time.Second)
	}
}

// TestConsulFewWoken: N leaderrun waiters (E2E_WAITERS, default 20) on one
// lock, each through a proxy of its own; at each change of leader (SIGTERM
// to the leader) only two followers are woken: the next in line, which
// becomes the leader, and the one behind it, which moves up.
func TestConsulFewWoken(t *testing.T) {
	t.Parallel()
	agent := testenv.StartConsul(t, testenv.ConsulOptions{})
	c := consulClient(t, agent.Addr())
	n := 20
	if s := os.Getenv("E2E_WAITERS"); s != "" {
		v, err := strconv.Atoi(s)
		if err != nil || v < 3 {
			t.Fatalf("E2E_WAITERS=%q: want a number of at least 3", s)
		}
		n = v
	}
	changes := min(5, n-2)
	const lock = "herd"
	key := "/v1/kv/" + consulPrefix + lock
	events := filepath.Join(t.TempDir(), "events")
	procs := make([]*proc, n+1)
	proxies := make([]*consulProxy, n+1)
	for i := range procs {
		proxies[i] = newConsulProxy(t, agent.Addr())
		args := append(append(consulTimedArgs(proxies[i].addr(), lock, fmt.Sprintf("p%03d", i), consulIssueTimings), "--"), childArgv(t)...)
		procs[i] = start(t, childEnv(events, "forever"), args...)
		if i == 0 {
			waitEvents(t, events, 10*time.Second, "the first child", consulSaw("start", "p000"))
		} else {
			waitFor(t, 20*time.Second, "the waiter to queue", func() bool { return consulWaiting(t, c, lock) == i })
		}
	}
	waitFor(t, 10*time.Second, "the first waiter to watch the key", func() bool { return proxies[1].blocked(key) })
	var woken []int
	var handovers []time.Duration
	for k := range changes {
		stopped := time.Now()
		procs[k].signal(syscall.SIGTERM)
		next := fmt.Sprintf("p%03d", k+1)
		evs := waitEvents(t, events, 10*time.Second, next+"'s child", consulSaw("start", next))
		waitFor(t, 10*time.Second, "the next in line to watch the key", func() bool { return proxies[k+2].blocked(key) })
		end := time.Now()
		exit, _ := consulFirst(evs, "exit", fmt.Sprintf("p%03d", k))
		st, _ := consulFirst(evs, "start", next)
		handovers = append(handovers, st.At.Sub(exit.At))
		var who []int
		for i, p := range proxies {
			if i == k {
				continue // the old leader, not a follower
			}
			for _, r := range p.answered(stopped, end) {
				if r.woke() {
					who = append(who, i)
					break
				}
			}
		}
		woken = append(woken, len(who))
		t.Logf("change %d: p%03d → %s, handover (old child's exit → new child's start) %v; processes woken: %v", k, k, next, st.At.Sub(exit.At).Round(time.Microsecond), who)
		for _, i := range who {
			if i != k+1 && i != k+2 {
				t.Errorf("change %d: p%03d was woken; want only the new leader p%03d and the next in line p%03d", k, i, k+1, k+2)
			}
		}
	}
	checkExclusive(t, readEvents(t, events))
	slices.Sort(woken)
	t.Logf("%d waiters, %d changes: processes woken per change %v (median %d); handover %s", n, changes, woken, woken[len(woken)/2], consulSummary(handovers))
	if woken[len(woken)/2] > 2 {
		t.Errorf("median %d processes woken per change, want at most 2", woken[len(woken)/2])
	}
	for _, p := range procs {
		if !p.exited() {
			p.signal(syscall.SIGTERM)
		}
	}
	for _, p := range procs {
		p.wait(10 * time.Second)
	}
}
