//go:build linux

package e2e

import (
	"fmt"
	"slices"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/leaderrun/leaderrun/internal/testenv"
)

// testHandovers: three contenders at a time hand the lock over until six
// children ran, 200 ms each but the first, which runs past the renew
// deadline (its waiters wait that long, and still get the lock); then,
// where the store can, the operator deletes the lock's record by hand
// while no one holds it, and six more run. Never two children at once;
// every token greater than the one before, across the deletion too.
func testHandovers(t *testing.T, e *env) {
	const together, perWave = 3, 6
	lock, events := e.lock("lock"), etcdEvents(t)
	n := 0
	wave := func() {
		var procs []*proc
		spawn := func() {
			mode := "sleep:200ms"
			if n == 0 {
				mode = "sleep:" + (e.timings.deadline + 500*time.Millisecond).String()
			}
			procs = append(procs, e.run(t, events, mode, lock, fmt.Sprintf("i%02d", n)))
			n++
		}
		for range together {
			spawn()
		}
		waitFor(t, 120*time.Second, "the wave's children to run", func() bool {
			running := 0
			for _, p := range procs {
				if !p.exited() {
					running++
				} else if p.code != 0 {
					t.Fatalf("an instance exited %d:\n%s", p.code, p.stderr.String())
				}
			}
			for ; running < together && len(procs) < perWave; running++ {
				spawn()
			}
			return running == 0
		})
	}
	wave()
	wiped := ""
	if e.wipe != nil {
		e.wipe(t, lock)
		wiped = ", the lock's record deleted by hand half-way"
	}
	wave()
	evs := readEvents(t, events)
	ivs := checkExclusive(t, evs)
	if len(ivs) != 2*perWave {
		t.Fatalf("%d children ran, want %d:\n%s", len(ivs), 2*perWave, formatEvents(evs))
	}
	var tokens []uint64
	var gaps []time.Duration
	for i, iv := range ivs {
		tokens = append(tokens, iv.Token)
		if i > 0 && i != perWave {
			gaps = append(gaps, iv.Start.Sub(ivs[i-1].End))
		}
	}
	t.Logf("%d children, tokens %v%s", len(ivs), tokens, wiped)
	t.Logf("handover gap, a child's exit to the next one's start: %s", summary(gaps))
}

// testLossReported (S3): each way an operator takes the lease from its
// holder (target.losses) gets the child its kill signal within 1 s (aim:
// 100 ms), and leaderrun exits 76, saying why where the store says; a
// follower waiting meanwhile, where the loss asks for one, takes over
// with a greater token.
func testLossReported(t *testing.T, e *env) {
	for _, l := range e.losses {
		t.Run(l.name, func(t *testing.T) {
			var lat []time.Duration
			for i := range trials(t, 3) {
				lock, events := e.lock(fmt.Sprintf("%s-%d", strings.ToLower(l.name), i)), etcdEvents(t)
				p, old := e.leader(t, events, "forever", lock, "leader", l.extra...)
				e.settle(t, p)
				var follower *proc
				if l.takeover {
					follower = e.follower(t, events, "forever", lock, "follower")
				}
				from := time.Now()
				if at := l.do(t, e, lock); !at.IsZero() {
					from = at
				}
				evs := waitEvents(t, events, 5*time.Second, "the child to be signalled", etcdHas("signal", "leader"))
				sig, _ := etcdFind(evs, "signal", "leader")
				d := sig.At.Sub(from)
				lat = append(lat, d)
				if d > time.Second {
					t.Errorf("trial %d: child signalled %v after the loss, want within 1s", i, d)
				}
				if code := p.wait(10 * time.Second); code != 76 {
					t.Errorf("trial %d: leaderrun exited %d, want 76", i, code)
				}
				for _, says := range l.says {
					if !strings.Contains(p.stderr.String(), says) {
						t.Errorf("trial %d: leaderrun's log does not say %q:\n%s", i, says, p.stderr.String())
					}
				}
				if follower != nil {
					evs := waitEvents(t, events, 10*time.Second, "the follower's child", etcdHas("start", "follower"))
					next, _ := etcdFind(evs, "start", "follower")
					if next.Token <= old.Token {
						t.Errorf("trial %d: the follower's token %d is not greater than %d", i, next.Token, old.Token)
					}
					stop(t, follower)
				}
			}
			t.Logf("%s → child signalled: %s (aim < 100ms)", l.name, summary(lat))
		})
	}
}

// settle waits until the holder p is set up to learn of a loss, where the
// store says when that is (target.settled).
func (e *env) settle(t *testing.T, p *proc) {
	t.Helper()
	if e.settled != nil {
		waitFor(t, 10*time.Second, "the holder to settle in", func() bool { return e.settled(p) })
	}
}

// acquired is when p logged that it acquired the lock. The line may
// reach the test's copy of p's output after its child's first record.
func acquired(t *testing.T, p *proc) time.Time {
	t.Helper()
	var at time.Time
	waitFor(t, 5*time.Second, "leaderrun to log that it acquired the lock", func() bool {
		var ok bool
		at, ok = logLineTime(p.stderr.String(), "leadership acquired")
		return ok
	})
	return at
}

// stop sends SIGTERM to p and waits for it.
func stop(t *testing.T, p *proc) {
	t.Helper()
	p.signal(syscall.SIGTERM)
	p.wait(10 * time.Second)
}

// testKill9Leader: SIGKILL of the leading leaderrun alone takes its child
// down within 1 s (pdeathsig and the watchdog), and the follower waiting
// in line takes over within the store's takeover bound (by its log: not
// counting its child's start, which a busy machine slows), with a greater
// token.
func testKill9Leader(t *testing.T, e *env) {
	var gones, takes []time.Duration
	for i := range trials(t, 3) {
		lock, events := e.lock(fmt.Sprint(i)), etcdEvents(t)
		leader, old := e.leader(t, events, "forever", lock, "leader")
		follower := e.follower(t, events, "forever", lock, "follower")
		killed := time.Now()
		if err := syscall.Kill(leader.pid(), syscall.SIGKILL); err != nil {
			t.Fatal(err)
		}
		waitFor(t, 2*time.Second, "the leader's child to die", func() bool { return !alive(old.Pid) })
		gone := time.Since(killed)
		evs := waitEvents(t, events, e.takeover+10*time.Second, "the follower's child", etcdHas("start", "follower"))
		next, _ := etcdFind(evs, "start", "follower")
		took := acquired(t, follower).Sub(killed)
		gones, takes = append(gones, gone), append(takes, took)
		if gone > time.Second {
			t.Errorf("trial %d: the old child outlived leaderrun by %v, want under 1s", i, gone)
		}
		if took > e.takeover {
			t.Errorf("trial %d: the follower acquired the lock %v after the kill, want within %v", i, took, e.takeover)
		}
		if next.Token <= old.Token {
			t.Errorf("trial %d: the follower's token %d is not greater than %d", i, next.Token, old.Token)
		}
		stop(t, follower)
	}
	t.Logf("kill -9 of the leader: its child gone after %s; the follower acquired the lock after %s (bound %v)",
		summary(gones), summary(takes), e.takeover)
}

// testSigtermHandover (S6, S8): signals other than the kill signal reach
// the child; SIGTERM stops it, the lease is released only after its exit,
// and leaderrun exits with the child's status; the follower waiting in
// line acquires the lock within the store's handover bound of the old
// child's exit (the median of three trials; one may take 700 ms more on
// a busy machine), and starts its child after it.
func testSigtermHandover(t *testing.T, e *env) {
	var gaps []time.Duration
	for i := range trials(t, 3) {
		lock, events := e.lock(fmt.Sprint(i)), etcdEvents(t)
		leader, _ := e.leader(t, events, "forever", lock, "leader")
		follower := e.follower(t, events, "forever", lock, "follower")
		if i == 0 {
			leader.signal(syscall.SIGUSR1)
			waitEvents(t, events, 10*time.Second, "the forwarded SIGUSR1", func(evs []event) bool {
				return slices.ContainsFunc(evs, func(e event) bool { return e.Kind == "signal" && strings.Contains(e.Rest, "user defined signal 1") })
			})
		}
		leader.signal(syscall.SIGTERM)
		if code := leader.wait(10 * time.Second); code != 0 {
			t.Errorf("trial %d: the leader exited %d after SIGTERM, want its child's 0", i, code)
		}
		evs := waitEvents(t, events, e.handover+10*time.Second, "the follower's child", etcdHas("start", "follower"))
		checkExclusive(t, evs)
		exit, _ := etcdFind(evs, "exit", "leader")
		gap := acquired(t, follower).Sub(exit.At)
		gaps = append(gaps, gap)
		if gap > e.handover+700*time.Millisecond {
			t.Errorf("trial %d: the follower acquired the lock %v after the leader's child exited, want within %v + 700ms", i, gap, e.handover)
		}
		stop(t, follower)
	}
	t.Logf("SIGTERM handover, the old child's exit → the follower's grant: %s", summary(gaps))
	if m := median(gaps); m > e.handover {
		t.Errorf("SIGTERM handover: median %v, want within %v", m, e.handover)
	}
}

// testStalledLeader (S2): the leader's link to the store stops forwarding
// without closing anything. Its child must be dead before the follower's
// starts, in every trial ($E2E_TRIALS, default 20); the follower
// acquires the lock within the store's takeover bound of the stall, and
// the leader
// exits 76 once its link is back. The trials run five at a time side by
// side, each with its own lock and proxy: they wait on the store's clock,
// not on the CPU.
func testStalledLeader(t *testing.T, e *env) {
	type trial struct {
		lock, events string
		proxy        *testenv.Proxy
		leader       *proc
		follower     *proc
		stalled      time.Time
	}
	if e.via == nil {
		t.Skip("no link to the store to break")
	}
	total := trials(t, 20)
	var stops, takes, margins []time.Duration
	for first := 0; first < total; first += 5 {
		batch := make([]*trial, min(5, total-first))
		for i := range batch {
			tr := &trial{lock: e.lock(fmt.Sprint(first + i)), events: etcdEvents(t), proxy: testenv.NewProxy(t, e.link)}
			tr.leader = e.runVia(t, tr.proxy.Addr(), tr.events, "forever", tr.lock, "leader")
			batch[i] = tr
		}
		for _, tr := range batch {
			waitEvents(t, tr.events, 30*time.Second, tr.lock+": the leader's child", etcdHas("start", "leader"))
			e.settle(t, tr.leader)
			tr.follower = e.follower(t, tr.events, "forever", tr.lock, "follower")
		}
		for _, tr := range batch {
			tr.stalled = time.Now()
			tr.proxy.Stall()
		}
		for _, tr := range batch {
			evs := waitEvents(t, tr.events, e.takeover+10*time.Second, tr.lock+": the follower's child", etcdHas("start", "follower"))
			checkExclusive(t, evs)
			sig, signalled := etcdFind(evs, "signal", "leader")
			exit, exited := etcdFind(evs, "exit", "leader")
			next, _ := etcdFind(evs, "start", "follower")
			if !signalled || !exited || !exit.At.Before(next.At) {
				t.Errorf("%s: the leader's child was not dead before the follower's started\n%s", tr.lock, formatEvents(evs))
				continue
			}
			took := acquired(t, tr.follower).Sub(tr.stalled)
			stops = append(stops, sig.At.Sub(tr.stalled))
			takes = append(takes, took)
			margins = append(margins, next.At.Sub(exit.At))
			if took > e.takeover {
				t.Errorf("%s: the follower acquired the lock %v after the stall, want within %v", tr.lock, took, e.takeover)
			}
		}
		for _, tr := range batch {
			tr.proxy.Resume()
			if code := tr.leader.wait(20 * time.Second); code != 76 {
				t.Errorf("%s: the stalled leader exited %d, want 76\n%s", tr.lock, code, tr.leader.stderr.String())
			}
			stop(t, tr.follower)
		}
	}
	t.Logf("stalled leader, %d trials: stall → leader's child signalled: %s", total, summary(stops))
	t.Logf("stall → follower acquired the lock: %s", summary(takes))
	t.Logf("leader's child exit → follower's child start (safety margin): %s", summary(margins))
}

// testPausedLeader (S7): leaderrun, its watchdog and its child are all
// stopped (SIGSTOP of their process groups): on a store that expires
// leases until the follower has taken over, elsewhere past the renew
// deadline. On SIGCONT the old child is signalled within 200 ms and
// leaderrun exits 76; the follower's token is greater.
func testPausedLeader(t *testing.T, e *env) {
	lock, events := e.lock("lock"), etcdEvents(t)
	leader, old := e.leader(t, events, "forever", lock, "leader")
	follower := e.follower(t, events, "forever", lock, "follower")
	groups := pauseGroups(t, leader.pid(), old.Pid)
	for _, g := range groups {
		if err := syscall.Kill(-g, syscall.SIGSTOP); err != nil {
			t.Fatalf("SIGSTOP group %d: %v", g, err)
		}
	}
	stopped := time.Now()
	if e.expires {
		waitEvents(t, events, e.takeover+10*time.Second, "the follower's child", etcdHas("start", "follower"))
	} else {
		// Paused past the renew deadline. Nothing runs meanwhile: this
		// sleep is the fault being injected, not a wait for an outcome.
		time.Sleep(e.timings.deadline + 500*time.Millisecond)
	}
	resumed := time.Now()
	for _, g := range groups {
		_ = syscall.Kill(-g, syscall.SIGCONT)
	}
	evs := waitEvents(t, events, 5*time.Second, "the old child to be signalled", etcdHas("signal", "leader"))
	sig, _ := etcdFind(evs, "signal", "leader")
	d := sig.At.Sub(resumed)
	if d > 200*time.Millisecond {
		t.Errorf("the old child was signalled %v after the resume, want within 200ms", d)
	}
	if code := leader.wait(10 * time.Second); code != 76 {
		t.Errorf("the paused leader exited %d, want 76", code)
	}
	evs = waitEvents(t, events, e.takeover+10*time.Second, "the follower's child", etcdHas("start", "follower"))
	next, _ := etcdFind(evs, "start", "follower")
	t.Logf("paused %v; the follower's child started %v into the pause with token %d (old %d); the old child signalled %v after SIGCONT",
		resumed.Sub(stopped).Round(time.Millisecond), next.At.Sub(stopped).Round(time.Millisecond), next.Token, old.Token, d.Round(time.Microsecond))
	if next.Token <= old.Token {
		t.Errorf("the follower's token %d is not greater than %d", next.Token, old.Token)
	}
	stop(t, follower)
}
