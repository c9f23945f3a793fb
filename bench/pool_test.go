package bench

import (
	"cmp"
	"fmt"
	"os/exec"
	"slices"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"time"

	"github.com/leaderrun/leaderrun/backends"
)

// A pool: at most poolN holders run the command at once, poolWaiters
// more candidates wait. `consul lock -n 3` is Consul's semaphore;
// leaderrun's is --holders 3.
const (
	poolN       = 3
	poolWaiters = 2
	// poolTrials per way of ending a holder, per tool.
	poolTrials = 2
)

// consulPool is `consul lock -n 3`: Consul's semaphore (its Go API's
// Semaphore), the child run directly as the other tools run it. Each
// candidate writes a contender key LOCK/SESSION with a session of its
// own (TTL 15 s, behaviour delete) and the holders' list in LOCK/.lock.
var consulPool = &tool{id: "cnp", name: fmt.Sprintf("consul lock -n %d", poolN), store: "consul",
	argv: func(b *bench, lock, tag, addr string) []string {
		return []string{b.consul, "lock", "-shell=false", "-n", strconv.Itoa(poolN), "-http-addr", "http://" + addr, lock, b.child}
	},
}

// lrPool is leaderrun on tl's store as a pool of poolN holders (issue
// 29's --holders). It is a column of the pool phase when the binary under
// test has the flag (poolTools): with it merged, leaderrun's figures come
// beside consul lock's with no change here. To pool leaderrun on another
// store, add lrPool(lrEtcd) (say) to poolTools' list.
func lrPool(tl *tool) *tool {
	c := *tl
	c.id, c.name = tl.id+"p", fmt.Sprintf("%s --holders %d", tl.name, poolN)
	c.argv = func(b *bench, lock, tag, addr string) []string {
		a := tl.argv(b, lock, tag, addr)
		dash := slices.Index(a, "--")
		return slices.Concat(a[:dash], []string{"--holders", strconv.Itoa(poolN)}, a[dash:])
	}
	return &c
}

// hasHolders reports whether the leaderrun binary has --holders.
func hasHolders(bin string) bool {
	out, _ := exec.Command(bin, "run", "--help").CombinedOutput()
	return strings.Contains(string(out), "--holders")
}

// poolTools are the pool phase's columns: consul lock -n, and leaderrun
// --holders on the same Consul where the build has the flag.
func (b *bench) poolTools() []*tool {
	tools := []*tool{consulPool}
	if hasHolders(b.lr) {
		tools = append(tools, lrPool(lrConsul))
	} else {
		b.res.note(consulPool.id, "pool", "leaderrun --holders: the binary under test has no --holders flag; its column is added by the phase as soon as it has (bench/pool_test.go, poolTools)")
	}
	return tools
}

// poolEnd is one way of ending a holder: its wrapper alone is sent sig.
type poolEnd struct {
	name string
	sig  syscall.Signal
	// bound is how long a trial waits for a waiter's child: Consul
	// invalidates a dead holder's session between TTL and 2×TTL after
	// its last renewal, and may keep its keys for a lock-delay.
	bound time.Duration
}

var poolEnds = []poolEnd{
	{"SIGKILL", syscall.SIGKILL, 2*consulLockTTL + consulLockLockDelay + 15*time.Second},
	{"SIGTERM", syscall.SIGTERM, 20 * time.Second},
}

// poolTrial is what became of one trial: a holder ended, the waiters'
// takeover, the ended holder's child.
type poolTrial struct {
	takeover time.Duration // signal → a waiter's child started; -1: never within the bound
	oldAlive bool          // the ended holder's child still ran when the waiter's started
	oldSig   bool          // the ended holder's child received a signal
	oldGone  time.Duration // signal → the ended holder's child gone; -1: still running 1 s after the takeover (or the bound)
	most     int           // most children of the pool running at once
	err      string
}

// poolRes is one tool's trials, by way of ending (poolEnd.name).
type poolRes struct {
	trials map[string][]poolTrial
}

// measurePool: for each pool tool and each way of ending a holder,
// poolTrials trials, all at once, each on a pool of its own: poolN holders
// and poolWaiters waiters; once every waiter waits, the first holder's
// wrapper alone gets the signal. Measured: how long until a waiter runs
// its command, whether the ended holder's command still ran then (the
// pool over its size), and the most commands running at once.
func (b *bench) measurePool() {
	var wg sync.WaitGroup
	var mu sync.Mutex
	for _, tl := range b.poolTools() {
		res := &poolRes{trials: map[string][]poolTrial{}}
		b.res.mu.Lock()
		b.res.pool[tl.id] = res
		b.res.mu.Unlock()
		for _, end := range poolEnds {
			for i := range poolTrials {
				lock := fmt.Sprintf("%s-pool-%s-%d", tl.id, strings.ToLower(end.name), i)
				wg.Go(func() {
					tr := b.poolTrial(tl, lock, end)
					mu.Lock()
					res.trials[end.name] = append(res.trials[end.name], tr)
					mu.Unlock()
				})
			}
		}
	}
	wg.Wait()
}

// poolTrial runs one trial on lock.
func (b *bench) poolTrial(tl *tool, lock string, end poolEnd) poolTrial {
	tr := poolTrial{takeover: -1, oldGone: -1}
	fail := func(format string, a ...any) poolTrial {
		tr.err = fmt.Sprintf(format, a...)
		b.t.Errorf("%s, pool %s: %s", tl.name, lock, tr.err)
		return tr
	}
	var procs []*proc
	var tags []string
	for i := range poolN + poolWaiters {
		tag := fmt.Sprintf("%s-%d", lock, i)
		p, err := b.start(tl, lock, tag, b.addr(tl), true)
		if err != nil {
			return fail("%v", err)
		}
		procs, tags = append(procs, p), append(tags, tag)
	}
	// poolN children, and every candidate waiting in the store.
	if !b.hub.wait(30*time.Second, func() bool { return b.running(tags) == poolN }) {
		b.hub.mu.Lock()
		n := b.running(tags)
		b.hub.mu.Unlock()
		return fail("%d of %d holders' children running after 30 s", n, poolN)
	}
	if err := b.waitPool(tl, lock, procs, 30*time.Second); err != nil {
		return fail("%v", err)
	}
	time.Sleep(settle) // waiters in their blocking queries
	var victim *proc
	var waiters []string
	for _, p := range procs {
		if k, ok := b.hub.get(p.tag); ok && k.start != 0 {
			if victim == nil {
				victim = p
			}
		} else {
			waiters = append(waiters, p.tag)
		}
	}
	at := mono()
	victim.signal(end.sig)
	took := b.hub.wait(end.bound, func() bool {
		for _, w := range waiters {
			if k := b.hub.kids[w]; k != nil && k.start != 0 {
				return true
			}
		}
		return false
	})
	if took {
		first := time.Duration(0)
		for _, w := range waiters {
			if k, ok := b.hub.get(w); ok && k.start != 0 && (first == 0 || k.start < first) {
				first = k.start
			}
		}
		tr.takeover = first - at
		o, _ := b.hub.get(victim.tag)
		tr.oldAlive = o.exit == 0 || o.exit > first
		// The ended holder's child: gone within a second of the takeover?
		b.hub.wait(time.Second, func() bool { return b.hub.kids[victim.tag].exit != 0 })
	}
	o, _ := b.hub.get(victim.tag)
	tr.oldSig = o.sig != 0
	if o.exit != 0 {
		tr.oldGone = o.exit - at
	}
	tr.most = b.mostAtOnce(tags)
	return tr
}

// running counts the children of tags running now; the caller holds the
// hub's lock (hub.wait's conditions do).
func (b *bench) running(tags []string) int {
	n := 0
	for _, tag := range tags {
		if k := b.hub.kids[tag]; k != nil && k.start != 0 && k.exit == 0 {
			n++
		}
	}
	return n
}

// mostAtOnce is the most children of tags that ran at the same time.
func (b *bench) mostAtOnce(tags []string) int {
	type ev struct {
		at    time.Duration
		delta int
	}
	var evs []ev
	for _, tag := range tags {
		k, ok := b.hub.get(tag)
		if !ok || k.start == 0 {
			continue
		}
		evs = append(evs, ev{k.start, 1})
		if k.exit != 0 {
			evs = append(evs, ev{k.exit, -1})
		}
	}
	// Ends before starts at the same instant.
	slices.SortFunc(evs, func(a, b ev) int {
		return cmp.Or(cmp.Compare(a.at, b.at), cmp.Compare(a.delta, b.delta))
	})
	most, n := 0, 0
	for _, e := range evs {
		n += e.delta
		most = max(most, n)
	}
	return most
}

// waitPool waits until every candidate of lock waits in the store:
// consul lock -n writes a contender key LOCK/SESSION per candidate before
// it waits; a leaderrun waiter campaigns in every slot at once, so each
// slot shows its holder and every waiter (the store's candidates). Its
// "campaigning" log line comes before any of that: a holder ended then,
// on a busy machine, was taken over only once a waiter had finished
// queueing.
func (b *bench) waitPool(tl *tool, lock string, procs []*proc, timeout time.Duration) error {
	deadline := time.Now().Add(timeout)
	for {
		// consul lock -n: its contender keys. leaderrun: the slot that
		// shows the fewest candidates, of its holder and every waiter.
		short := ""
		if tl == consulPool {
			n := 0
			var pairs []struct{ Key, Session string }
			_ = consulGet(b.stores["consul"].(*consulStore).agent.Addr(), "/v1/kv/"+lock+"/?recurse", &pairs)
			for _, p := range pairs {
				if p.Session != "" && !strings.HasSuffix(p.Key, "/.lock") {
					n++
				}
			}
			if n < len(procs) {
				short = fmt.Sprintf("%d of %d candidates waiting", n, len(procs))
			}
		} else {
			for i := range poolN {
				n, err := b.storeOf(tl).candidates(tl, backends.SlotLock(lock, i), b.addr(tl), procs)
				if err != nil || n < 1+poolWaiters {
					short = fmt.Sprintf("slot %d shows %d of %d candidates (its holder and %d waiters; error: %v)", i, n, 1+poolWaiters, poolWaiters, err)
					break
				}
			}
		}
		if short == "" {
			return nil
		}
		if time.Now().After(deadline) {
			return fmt.Errorf("%s after %v", short, timeout)
		}
		time.Sleep(20 * time.Millisecond)
	}
}

// summary is the trials of one way of ending, in figures.
type poolSummary struct {
	trials, took, alive, sig, gone, most int
	takeover                             []time.Duration
	gones                                []time.Duration
	errs                                 []string
}

func summarize(trs []poolTrial) poolSummary {
	var s poolSummary
	for _, tr := range trs {
		s.trials++
		if tr.err != "" {
			s.errs = append(s.errs, tr.err)
			continue
		}
		if tr.takeover >= 0 {
			s.took++
			s.takeover = append(s.takeover, tr.takeover)
		}
		if tr.oldAlive {
			s.alive++
		}
		if tr.oldSig {
			s.sig++
		}
		if tr.oldGone >= 0 {
			s.gone++
			s.gones = append(s.gones, tr.oldGone)
		}
		s.most = max(s.most, tr.most)
	}
	return s
}

func (s poolSummary) takeoverText() string {
	if s.took == 0 {
		return fmt.Sprintf("never (%d of %d trials)", s.trials-len(s.errs), s.trials)
	}
	out := fmt.Sprintf("%s / %s (%d of %d trials)", fmtDur(percentile(s.takeover, .5)), fmtDur(percentile(s.takeover, 1)), s.took, s.trials)
	if n := s.trials - s.took - len(s.errs); n > 0 {
		out += fmt.Sprintf("; never in %d", n)
	}
	return out
}

func (s poolSummary) oldText() string {
	var parts []string
	if s.gone > 0 {
		parts = append(parts, fmt.Sprintf("gone %s after the signal (p50; %d of %d)", fmtDur(percentile(s.gones, .5)), s.gone, s.trials))
	}
	if n := s.trials - s.gone - len(s.errs); n > 0 {
		parts = append(parts, fmt.Sprintf("still running in %d of %d", n, s.trials))
	}
	if s.alive > 0 {
		parts = append(parts, fmt.Sprintf("ran beside the waiter's in %d of %d", s.alive, s.trials))
	}
	parts = append(parts, fmt.Sprintf("signalled in %d of %d", s.sig, s.trials))
	return strings.Join(parts, "; ")
}

// poolTable is the pool phase's table.
func (r *results) poolTable() string {
	if len(r.pool) == 0 {
		return ""
	}
	var b strings.Builder
	fmt.Fprintf(&b, "| pool of %d, %d waiters | holder ended by | a waiter's command after, p50 / max | the ended holder's command | most commands at once (pool of %d) |\n|---|---|---|---|---|\n",
		poolN, poolWaiters, poolN)
	for _, tl := range []*tool{consulPool, lrPool(lrConsul)} {
		res := r.pool[tl.id]
		if res == nil {
			continue
		}
		for _, end := range poolEnds {
			s := summarize(res.trials[end.name])
			fmt.Fprintf(&b, "| %s | %s to the wrapper | %s | %s | %d |\n", tl.name, end.name, s.takeoverText(), s.oldText(), s.most)
		}
	}
	return b.String()
}

// poolGoals judge leaderrun's pool, where it was measured: never more
// holders' commands than the pool's size, and the ended holder's command
// gone before a waiter's starts.
func (r *results) poolGoals() []goalMet {
	tl := lrPool(lrConsul)
	res := r.pool[tl.id]
	if res == nil {
		return nil
	}
	var out []goalMet
	for _, end := range poolEnds {
		s := summarize(res.trials[end.name])
		out = append(out, goalMet{name: goalPool + ", " + tl.name, store: "Consul", kind: goalPool,
			goal:     fmt.Sprintf("holder ended by %s: never more than %d commands at once, every trial", end.name, poolN),
			met:      len(s.errs) == 0 && s.trials > 0 && s.most <= poolN && s.alive == 0 && s.took == s.trials,
			measured: fmt.Sprintf("most %d at once; old command %s; takeover %s", s.most, s.oldText(), s.takeoverText())})
	}
	return out
}

// poolDetails is the report's section on pools.
func (r *results) poolDetails() string {
	if len(r.pool) == 0 {
		return ""
	}
	var b strings.Builder
	fmt.Fprintf(&b, "\n### A pool of %d holders: what each does when a holder dies\n\n", poolN)
	fmt.Fprintf(&b, "On the same Consul agent, %d trials per row, all at once, each on a pool of its own: %d candidates started together, %d of them holding (their commands running) and %d waiting (every one's contender key or campaign in the store); then the wrapper of one holder alone is sent SIGKILL (its command is not) or SIGTERM. A trial waits up to %v (SIGKILL) or %v (SIGTERM) for a waiter's command.\n\n",
		poolTrials, poolN+poolWaiters, poolN, poolWaiters, poolEnds[0].bound, poolEnds[1].bound)
	b.WriteString(r.poolTable())
	if res := r.pool[consulPool.id]; res != nil {
		k, t := summarize(res.trials["SIGKILL"]), summarize(res.trials["SIGTERM"])
		fmt.Fprintf(&b, "\n`consul lock -n %d` is Consul's semaphore: each candidate creates a session (TTL %v, behaviour delete, renewed every TTL/2) and a contender key under the prefix; the holders are listed in the prefix's `.lock` key, and a waiter prunes from that list the holders whose contender key is gone. ", poolN, consulLockTTL)
		fmt.Fprintf(&b, "Killed with SIGKILL, a holder's slot stays taken until Consul invalidates its session (between TTL and 2×TTL after its last renewal: %v–%v) and deletes its contender key: a waiter ran after %s. ", consulLockTTL, 2*consulLockTTL, k.takeoverText())
		if k.alive > 0 {
			fmt.Fprintf(&b, "Nothing ties the command to the wrapper: the killed holder's command ran on beside the waiter's in %d of %d trials, %d commands at once in a pool of %d. ", k.alive, k.trials, k.most, poolN)
		}
		fmt.Fprintf(&b, "Sent SIGTERM, `consul lock` signals its command, waits for it and releases its slot: a waiter ran after %s, the old command %s.\n", t.takeoverText(), t.oldText())
	}
	if r.pool[lrPool(lrConsul).id] == nil {
		fmt.Fprintf(&b, "\nleaderrun --holders was not measured: the binary under test has no such flag. The phase adds its column (`lrPool(lrConsul)`, bench/pool_test.go) when it has.\n")
	}
	return b.String()
}
