//go:build linux

package e2e

import (
	"encoding/json"
	"fmt"
	"math/rand/v2"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"
)

// cronFleet simulates the same crontab line on three hosts, the recipe
// `leaderrun --wait W --once-per P --lock L -- job` of the README: every
// period the three start at random offsets of 0-0.8 s; the job records,
// runs jobTime and exits 0. In the periods listed in kills, the leader is
// killed with kill -9 as soon as its job has started, and a waiting host
// must complete that period instead.
type cronFleet struct {
	// env is added to every host's environment (the store's).
	env []string
	// args are the store flags and timings of host i.
	args    func(i int) []string
	period  time.Duration
	wait    time.Duration
	periods int
	kills   []int
	jobTime time.Duration
	// history lists the lock's history as `leaderrun history --json`
	// prints it, for the check at the end; nil skips it.
	history func(t *testing.T) []historyTerm
}

// historyTerm is one line of `leaderrun history --json`.
type historyTerm struct {
	Identity string    `json:"identity"`
	Token    uint64    `json:"token"`
	Started  time.Time `json:"started"`
	End      string    `json:"end"`
	ExitCode int       `json:"exit_code"`
	Signal   string    `json:"signal"`
	Reason   string    `json:"reason"`
	OnceKey  string    `json:"once_key"`
}

func parseHistory(t *testing.T, out string) []historyTerm {
	t.Helper()
	var terms []historyTerm
	for _, line := range strings.Split(strings.TrimSpace(out), "\n") {
		if line == "" {
			continue
		}
		var h historyTerm
		if err := json.Unmarshal([]byte(line), &h); err != nil {
			t.Fatalf("history line %q: %v", line, err)
		}
		terms = append(terms, h)
	}
	return terms
}

// hostID names host i in period k; the job records it as its identity.
func hostID(k, i int) string { return fmt.Sprintf("p%02d-h%d", k, i) }

func periodOf(id string) int {
	k, _ := strconv.Atoi(strings.TrimPrefix(strings.SplitN(id, "-", 2)[0], "p"))
	return k
}

// run runs the fleet for f.periods periods and checks: exactly one
// completed job per period, by another host than the killed one where
// there was a kill; never two jobs at once, tokens growing; every host that
// was not killed exits 0 (the ones that found the period done included).
func (f cronFleet) run(t *testing.T) {
	t.Helper()
	events := filepath.Join(t.TempDir(), "events")
	type host struct {
		p      *proc
		id     string
		killed bool
	}
	var (
		mu    sync.Mutex
		hosts []*host
		// killedAt is when each killed host's job was seen dead.
		killedAt = map[string]time.Time{}
	)
	// Start on a period boundary with a second to spare, as cron would.
	first := time.Now().Truncate(f.period).Add(f.period)
	if time.Until(first) < time.Second {
		first = first.Add(f.period)
	}
	// One goroutine per host and period, each starting at its own offset.
	var wg sync.WaitGroup
	for k := range f.periods {
		at := first.Add(time.Duration(k) * f.period)
		for i := range 3 {
			offset := time.Duration(rand.Int64N(int64(800 * time.Millisecond)))
			id := hostID(k, i)
			wg.Add(1)
			go func() {
				defer wg.Done()
				time.Sleep(time.Until(at.Add(offset))) // cron fires
				args := append(f.args(i), "--identity", id, "--wait", f.wait.String(),
					"--once-per", f.period.String(), "--log-format", "json", "--")
				p := start(t, append(childEnv(events, "sleep:"+f.jobTime.String()), f.env...), append(args, childArgv(t)...)...)
				mu.Lock()
				hosts = append(hosts, &host{p: p, id: id})
				mu.Unlock()
			}()
		}
		if slices.Contains(f.kills, k) {
			wg.Add(1)
			go func() {
				defer wg.Done()
				// Kill the leader of period k as soon as its job started.
				deadline := at.Add(f.period)
				var leader string
				var pid int
				for time.Now().Before(deadline) && leader == "" {
					for _, e := range readEvents(t, events) {
						if e.Kind == "start" && periodOf(e.ID) == k {
							leader, pid = e.ID, e.Pid
							break
						}
					}
					time.Sleep(5 * time.Millisecond)
				}
				if leader == "" {
					t.Errorf("period %d: no job started to kill", k)
					return
				}
				for {
					mu.Lock()
					var h *host
					for _, x := range hosts {
						if x.id == leader {
							h = x
						}
					}
					mu.Unlock()
					if h != nil {
						h.killed = true
						_ = syscall.Kill(h.p.pid(), syscall.SIGKILL)
						break
					}
					time.Sleep(time.Millisecond)
				}
				for alive(pid) {
					time.Sleep(time.Millisecond)
				}
				mu.Lock()
				killedAt[leader] = time.Now()
				mu.Unlock()
			}()
		}
	}
	wg.Wait()
	gaveUp := 0
	for _, h := range hosts {
		code := h.p.wait(f.wait + f.period + 10*time.Second)
		switch {
		case h.killed:
		case code == 75 && slices.Contains(f.kills, periodOf(h.id)):
			// In a period whose leader was killed, a host may wait out
			// --wait while the replacement runs the job: it never got
			// the lock, and says so (75), which is --wait's contract.
			gaveUp++
		case code != 0:
			t.Errorf("host %s exited %d, want 0 (it ran the job, or found the period done)\n%s", h.id, code, h.p.stderr.String())
		}
	}
	t.Logf("%d hosts of the kill periods waited out --wait %v behind the replacement leader (exit 75)", gaveUp, f.wait)

	evs := readEvents(t, events)
	// A killed job records no exit: it ends when it was seen dead.
	ivs := intervals(evs)
	for i := range ivs {
		if at, ok := killedAt[ivs[i].ID]; ok {
			ivs[i].End = at
		}
	}
	slices.SortFunc(ivs, func(a, b interval) int { return a.Start.Compare(b.Start) })
	for i := 1; i < len(ivs); i++ {
		if ivs[i].Start.Before(ivs[i-1].End) {
			t.Errorf("jobs overlap: %s (token %d) started %v before %s (token %d) ended", ivs[i].ID, ivs[i].Token,
				ivs[i-1].End.Sub(ivs[i].Start), ivs[i-1].ID, ivs[i-1].Token)
		}
		if ivs[i].Token <= ivs[i-1].Token {
			t.Errorf("token went from %d to %d", ivs[i-1].Token, ivs[i].Token)
		}
	}
	completed := map[int][]string{}
	for _, e := range evs {
		if e.Kind == "exit" && e.Rest == "0" {
			completed[periodOf(e.ID)] = append(completed[periodOf(e.ID)], e.ID)
		}
	}
	for k := range f.periods {
		ids := completed[k]
		if len(ids) != 1 {
			t.Errorf("period %d: %d completed runs (%v), want exactly 1", k, len(ids), ids)
			continue
		}
		if slices.Contains(f.kills, k) {
			if _, killed := killedAt[ids[0]]; killed {
				t.Errorf("period %d: the completed run is the killed host's", k)
			}
		}
		t.Logf("period %d: completed by %s%s", k, ids[0], map[bool]string{true: " after a kill -9 of the first leader"}[slices.Contains(f.kills, k)])
	}
	if t.Failed() {
		t.Logf("events:\n%s", formatEvents(evs))
	}
	if f.history == nil {
		return
	}
	// Every job that completed is a term that exited 0 with its period's
	// key; every host that found its period done is a skipped term.
	terms := f.history(t)
	byID := map[string]historyTerm{}
	for _, h := range terms {
		byID[h.Identity] = h
	}
	for k, ids := range completed {
		h, ok := byID[ids[0]]
		if !ok || h.End != "exited" || h.ExitCode != 0 || !strings.HasPrefix(h.OnceKey, "every-") {
			t.Errorf("period %d: history of %s is %+v, want exited 0 with its once-key", k, ids[0], h)
		}
	}
	skipped := 0
	for _, h := range terms {
		if h.End == "skipped" {
			skipped++
		}
	}
	if skipped == 0 {
		t.Errorf("history lists no skipped term among %d", len(terms))
	}
	t.Logf("history: %d terms, %d skipped", len(terms), skipped)
}

// onceFailures: a job that exits 1 records nothing and the next candidate
// runs it; a leader that loses its lease just before the marker write
// (the job itself takes the lock away, then exits 0) records nothing and
// exits 76, and the next candidate runs the job; after a success, the next
// candidate runs nothing and exits 0.
func onceFailures(t *testing.T, env, args []string, loseLock string) {
	t.Helper()
	events := filepath.Join(t.TempDir(), "events")
	once := func(id, mode string, extra ...string) (int, []event) {
		a := append(slices.Clone(args), append([]string{"--identity", id, "--once-key", "nightly-1"}, extra...)...)
		var p *proc
		if mode == "" {
			p = start(t, env, a...)
		} else {
			p = start(t, append(childEnv(events, mode), env...), append(append(a, "--"), childArgv(t)...)...)
		}
		code := p.wait(30 * time.Second)
		var mine []event
		for _, e := range readEvents(t, events) {
			if e.ID == id {
				mine = append(mine, e)
			}
		}
		return code, mine
	}
	if code, evs := once("fails", "exit:1"); code != 1 || count(evs, "start") != 1 {
		t.Fatalf("failing job: exit %d, %d starts; want 1, 1", code, count(evs, "start"))
	}
	// The job takes the lock away from its own leader, then exits 0.
	if code, _ := once("loses", "", "--shell", "--", loseLock+" && echo start-lost >> "+events); code != 76 {
		t.Fatalf("job that lost the lock before the marker: exit %d, want 76", code)
	}
	if code, evs := once("succeeds", "sleep:10ms"); code != 0 || count(evs, "start") != 1 {
		t.Fatalf("after a failure and a loss, the next candidate: exit %d, %d starts; want 0, 1 (it runs)", code, count(evs, "start"))
	}
	if code, evs := once("skips", "sleep:10ms"); code != 0 || count(evs, "start") != 0 {
		t.Fatalf("after a success, the next candidate: exit %d, %d starts; want 0, 0 (it skips)", code, count(evs, "start"))
	}
	if code, evs := once("skips-9", "sleep:10ms", "--done-exit-code", "9"); code != 9 || count(evs, "start") != 0 {
		t.Fatalf("--done-exit-code 9: exit %d, %d starts; want 9, 0", code, count(evs, "start"))
	}
}
