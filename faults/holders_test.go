package faults

import (
	"errors"
	"fmt"
	"os"
	"os/exec"
	"sort"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/leaderrun/leaderrun/internal/testenv"
)

// The pool rows (issue 29): poolCandidates leaderrun processes with
// --holders of the fault, one fencing ledger per slot (a resource
// partitioned by slot), and the fault injected on the holders of slots 0
// and 1 at once.
const poolCandidates = 10

// poolVictims is how many holders a pool row's fault hits.
const poolVictims = 2

// poolEnv tells a child of a pool which ledger is its slot's:
// FAULTS_POOL lists, per slot, the ledger's write and presence addresses
// ("write=presence,..."), and the child takes entry $LEADERRUN_SLOT.
func poolEnv() {
	pool := os.Getenv("FAULTS_POOL")
	if pool == "" {
		return
	}
	slots := strings.Split(pool, ",")
	i, err := strconv.Atoi(os.Getenv("LEADERRUN_SLOT"))
	if err != nil || i < 0 || i >= len(slots) {
		fmt.Fprintf(os.Stderr, "child: LEADERRUN_SLOT %q outside the pool of %d\n", os.Getenv("LEADERRUN_SLOT"), len(slots))
		os.Exit(1)
	}
	write, presence, _ := strings.Cut(slots[i], "=")
	os.Setenv("FAULTS_LEDGER", write)
	os.Setenv("FAULTS_PRESENCE", presence)
}

// runPoolTrial is runTrial for a pool row: tr.slots are one trial per
// slot, each with its slot's ledger and the same candidates, which check
// (a)-(d) per slot; check adds the pool's own invariant, at most
// f.holders children at once.
func runPoolTrial(t testing.TB, st store, f fault, bin, child string, n int) *trial {
	tr := &trial{t: t, store: st, timing: st.timings(), fault: f, bin: bin, child: child, exits: map[string]time.Time{}}
	var addrs []string
	for range f.holders {
		l := newLedger(t)
		tr.slots = append(tr.slots, &trial{t: t, timing: tr.timing, fault: f, ledger: l, exits: tr.exits})
		addrs = append(addrs, strings.TrimPrefix(l.env()[1], "FAULTS_LEDGER=")+"="+strings.TrimPrefix(l.env()[2], "FAULTS_PRESENCE="))
	}
	tr.ledger = tr.slots[0].ledger
	lock := fmt.Sprintf("faults-pool-%d-%d", time.Now().UnixNano()%1e9, n)
	tr.begin = time.Now()
	for i := range poolCandidates {
		storeArgs, proxies := st.candidate(t)
		id := fmt.Sprintf("c%d", i)
		args := append(append(append([]string{"--lock", lock, "--identity", id, "--holders", strconv.Itoa(f.holders)}, storeArgs...),
			tr.timing.args()...), "--", child)
		env := append(append(append(os.Environ(), candidateEnv(st)...), tr.ledger.env()...), "FAULTS_POOL="+strings.Join(addrs, ","))
		tr.cands = append(tr.cands, startCandidate(t, bin, id, args, env, proxies))
	}
	for _, s := range tr.slots {
		s.cands = tr.cands
	}
	defer tr.poolTeardown()

	// Every slot held, then the fault on the holders of the first slots,
	// all at once.
	var victims []*candidate
	var pids []int
	for s := range f.holders {
		c, lf := tr.slots[s].waitLeader(30*time.Second, "")
		if c == nil {
			t.Errorf("%s: slot %d has no holder within 30s", f.name, s)
			return tr
		}
		if s < poolVictims {
			victims, pids = append(victims, c), append(pids, lf.Pid)
			tr.slots[s].leaderAtFault = c.id
		}
	}
	tr.injectPool(victims, pids)
	return tr
}

// injectPool hits every victim at once, then waits for every victim's
// slot to have a new holder.
func (tr *trial) injectPool(victims []*candidate, pids []int) {
	tr.faultStart = time.Now()
	for s, c := range victims {
		tr.slots[s].faultStart = tr.faultStart
		tr.fault.inject(tr, c, pids[s])
	}
	tr.faultEnd = time.Now()
	limit := 3*tr.timing.lease + 10*time.Second
	for s, c := range victims {
		if next, _ := tr.slots[s].waitLeader(limit, c.id); next == nil {
			tr.t.Errorf("%s: slot %d has no new holder within %v of the fault", tr.fault.name, s, limit)
		}
	}
	// Watch the new holders a little longer: a stale child writing late
	// would show here.
	time.Sleep(time.Second)
}

// startCandidate starts one leaderrun of a trial in a process group of
// its own and records its exit.
func startCandidate(t testing.TB, bin, id string, args, env []string, proxies []*testenv.Proxy) *candidate {
	c := &candidate{id: id, proxies: proxies, out: &lockedBuffer{}, done: make(chan struct{})}
	c.cmd = exec.Command(bin, args...)
	c.cmd.Env = env
	c.cmd.Stdout, c.cmd.Stderr = c.out, c.out
	c.cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true}
	if err := c.cmd.Start(); err != nil {
		t.Fatal(err)
	}
	go func() {
		err := c.cmd.Wait()
		c.exitAt = time.Now()
		var ee *exec.ExitError
		if errors.As(err, &ee) {
			c.code = ee.ExitCode()
		}
		close(c.done)
	}()
	return c
}

// poolTeardown is teardown for a pool: every candidate stopped, then
// every slot's ledger.
func (tr *trial) poolTeardown() {
	tr.stopCandidates()
	for _, s := range tr.slots {
		s.closeLedger()
	}
	tr.end = time.Now()
}

// checkPool is check for a pool: every slot's verdict, and no more than
// the pool's size of children at once across the slots.
func (tr *trial) checkPool() verdict {
	v := verdict{failover: -1}
	var lives []life
	for s, st := range tr.slots {
		sv := st.check()
		for _, p := range [][]string{sv.overlap, sv.tokenOrder, sv.acceptedLower, sv.outlived} {
			for i := range p {
				p[i] = fmt.Sprintf("slot %d: %s", s, p[i])
			}
		}
		v.leaderChanges += sv.leaderChanges
		v.overlap = append(v.overlap, sv.overlap...)
		v.tokenOrder = append(v.tokenOrder, sv.tokenOrder...)
		v.acceptedLower = append(v.acceptedLower, sv.acceptedLower...)
		v.outlived = append(v.outlived, sv.outlived...)
		v.staleRejected += sv.staleRejected
		if s < poolVictims && sv.failover >= 0 {
			// The row's failover is the later of the victims' slots.
			v.failover = max(v.failover, sv.failover)
		}
		lives = append(lives, sv.lives...)
		v.writes = append(v.writes, sv.writes...)
	}
	sort.Slice(lives, func(i, j int) bool { return lives[i].Start.Before(lives[j].Start) })
	v.lives = lives
	if most, at := mostAtOnce(lives); most > tr.fault.holders {
		v.overlap = append(v.overlap, fmt.Sprintf("(a) %d children of a pool of %d ran at once, at %s",
			most, tr.fault.holders, at.Format("15:04:05.000")))
	}
	return v
}

// mostAtOnce is the largest number of lives that overlap, and when.
func mostAtOnce(lives []life) (int, time.Time) {
	type edge struct {
		at    time.Time
		delta int
	}
	var edges []edge
	for _, lf := range lives {
		edges = append(edges, edge{lf.Start, 1}, edge{lf.End, -1})
	}
	// Ends before starts at the same instant: a handover is not an overlap.
	sort.Slice(edges, func(i, j int) bool {
		if edges[i].at.Equal(edges[j].at) {
			return edges[i].delta < edges[j].delta
		}
		return edges[i].at.Before(edges[j].at)
	})
	most, n := 0, 0
	var when time.Time
	for _, e := range edges {
		n += e.delta
		if n > most {
			most, when = n, e.at
		}
	}
	return most, when
}

// TestMostAtOnce: the pool's invariant counts children that ran at the
// same time, and a handover at the same instant is not an overlap.
func TestMostAtOnce(t *testing.T) {
	t0 := time.Now()
	at := func(ms int) time.Time { return t0.Add(time.Duration(ms) * time.Millisecond) }
	lives := func(spans ...[2]int) []life {
		var ls []life
		for _, s := range spans {
			ls = append(ls, life{Start: at(s[0]), End: at(s[1])})
		}
		return ls
	}
	for _, tc := range []struct {
		name  string
		lives []life
		want  int
	}{
		{"none", nil, 0},
		{"three slots", lives([2]int{0, 100}, [2]int{10, 100}, [2]int{20, 100}), 3},
		{"handovers", lives([2]int{0, 50}, [2]int{50, 100}, [2]int{10, 60}, [2]int{60, 90}, [2]int{20, 100}), 3},
		{"a fourth at once", lives([2]int{0, 100}, [2]int{10, 100}, [2]int{20, 100}, [2]int{99, 120}), 4},
	} {
		if got, _ := mostAtOnce(tc.lives); got != tc.want {
			t.Errorf("%s: %d at once, want %d", tc.name, got, tc.want)
		}
	}
}
