package bench

import (
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"time"
)

// pssCounts are the numbers of instances leading at once in the Pss
// phase: one alone, then more, each leading a lock of its own. The
// marginal cost of one more instance is read between the first and the
// last.
var pssCounts = []int{1, 5, 20}

// pssLead is how long the instances lead before they are read: renewals,
// keep-alives and loss checks run meanwhile: at least one renewal at
// every store's timings (the longest retry period is 2 s).
const pssLead = 3 * time.Second

// memSum is what N instances of a tool cost while leading, summed over
// the instances, in KiB, from /proc/PID/smaps_rollup: Pss (each page
// divided among the processes that map it, the binary's file-backed pages
// included) and Private (pages no other process maps). The wrapper is the
// process the user starts (leaderrun, etcdctl, consul); the watchdog is
// the child's parent where that is not the wrapper (leaderrun re-executed
// as its watchdog), with the watchdog's other children (its keeper, a
// copy of it): what the watchdog costs; other is every other process of
// the wrapper's tree but the child's own.
type memSum struct {
	wrapperPss, wrapperPriv   int
	watchdogPss, watchdogPriv int
	otherPss, otherPriv       int
	// Pss_Anon: the anonymous part of Pss (heap, stacks, runtime
	// structures: what package init allocated is there).
	wrapperAnon, watchdogAnon, otherAnon int
	rss                                  int // every process but the child's, summed RSS: secondary
	watchdogs                            int // instances that had a watchdog
}

func (m memSum) pss() int     { return m.wrapperPss + m.watchdogPss + m.otherPss }
func (m memSum) private() int { return m.wrapperPriv + m.watchdogPriv + m.otherPriv }
func (m memSum) anon() int    { return m.wrapperAnon + m.watchdogAnon + m.otherAnon }

// pssRec is one tool's memSum for each count of pssCounts.
type pssRec map[int]memSum

// marginal is what one more instance costs, from the first count to the
// last: (f(sum at the last) − f(sum at the first)) / (last − first), KiB.
// ok is false unless both were measured.
func (r pssRec) marginal(f func(memSum) int) (kib int, ok bool) {
	lo, hi := pssCounts[0], pssCounts[len(pssCounts)-1]
	a, okA := r[lo]
	z, okZ := r[hi]
	if !okA || !okZ {
		return 0, false
	}
	return (f(z) - f(a)) / (hi - lo), true
}

// pssTools are the tools measured: leaderrun on every store, and the two
// CLIs that wrap a command under a lock, on their stores.
var pssTools = pssToolsOf(storeColumns)

func pssToolsOf(cols []*storeColumn) []*tool {
	var w []*tool
	for _, col := range cols {
		w = append(w, col.lr)
		if col.ref == etcdctlLock || col.ref == consulLock {
			w = append(w, col.ref)
		}
	}
	return w
}

// measurePss measures memory as a host pays it: for each tool alone on
// the machine, N leaders of distinct locks at once for each N of
// pssCounts, each wrapper with its watchdog and helpers (not the child),
// summed after pssLead of leading. RSS counts the binary's pages once per
// process and misleads; Pss shares them out among the processes that map
// them, so the sum is what the host pays, and the marginal cost between
// 1 and 20 instances is what one more lock on the host costs.
func (b *bench) measurePss() {
	for _, tl := range pssTools {
		rec := pssRec{}
		for _, n := range pssCounts {
			m, err := b.leadersMemory(tl, n)
			b.killAll()
			if err != nil {
				b.t.Errorf("%s, %d leaders: %v", tl.name, n, err)
				break
			}
			rec[n] = m
		}
		b.res.mu.Lock()
		b.res.pss[tl.id] = rec
		b.res.mu.Unlock()
	}
}

// leadersMemory starts n leaders of tl on distinct locks, waits until
// every child runs, lets them lead for pssLead and sums their memory.
func (b *bench) leadersMemory(tl *tool, n int) (memSum, error) {
	var procs []*proc
	for i := range n {
		tag := fmt.Sprintf("%s-pss%d-%d", tl.id, n, i)
		p, err := b.start(tl, tag, tag, b.addr(tl), true)
		if err != nil {
			return memSum{}, err
		}
		procs = append(procs, p)
	}
	kids := map[*proc]kid{}
	for _, p := range procs {
		k, ok := b.hub.started(p.tag, 30*time.Second)
		if !ok {
			return memSum{}, fmt.Errorf("no child within 30 s:\n%s", p.tail())
		}
		kids[p] = k
	}
	time.Sleep(pssLead) // leading
	var m memSum
	for _, p := range procs {
		if err := m.add(p.pid(), kids[p].pid); err != nil {
			return memSum{}, fmt.Errorf("%s: %w", p.tag, err)
		}
	}
	return m, nil
}

// add adds one instance to m: the wrapper wrapper, whose command is
// child. The watchdog is found as the child's parent.
func (m *memSum) add(wrapper, child int) error {
	tree := descendants(wrapper)
	if !slices.Contains(tree, child) {
		return fmt.Errorf("the child %d is not a descendant of the wrapper %d", child, wrapper)
	}
	watchdog := parentOf(child)
	skip := append([]int{child}, descendants(child)...)
	for _, pid := range append([]int{wrapper}, tree...) {
		if slices.Contains(skip, pid) {
			continue
		}
		s, err := readRollup(pid)
		if err != nil {
			return err
		}
		m.rss += s.rss
		switch {
		case pid == wrapper:
			m.wrapperPss, m.wrapperPriv, m.wrapperAnon = m.wrapperPss+s.pss, m.wrapperPriv+s.private, m.wrapperAnon+s.anon
		case pid == watchdog || watchdog != wrapper && parentOf(pid) == watchdog:
			m.watchdogPss, m.watchdogPriv, m.watchdogAnon = m.watchdogPss+s.pss, m.watchdogPriv+s.private, m.watchdogAnon+s.anon
			if pid == watchdog {
				m.watchdogs++
			}
		default:
			m.otherPss, m.otherPriv, m.otherAnon = m.otherPss+s.pss, m.otherPriv+s.private, m.otherAnon+s.anon
		}
	}
	return nil
}

// parentOf is pid's parent, 0 if pid is gone.
func parentOf(pid int) int {
	data, err := os.ReadFile(filepath.Join("/proc", strconv.Itoa(pid), "stat"))
	if err != nil {
		return 0
	}
	s := string(data)
	i := strings.LastIndexByte(s, ')')
	if i < 0 {
		return 0
	}
	f := strings.Fields(s[i+1:])
	if len(f) < 2 {
		return 0
	}
	ppid, _ := strconv.Atoi(f[1])
	return ppid
}

// rollup is what /proc/PID/smaps_rollup says of a process, in KiB.
type rollup struct{ rss, pss, private, anon int }

// readRollup reads Rss, Pss, Pss_Anon and Private_Clean + Private_Dirty
// of pid.
func readRollup(pid int) (rollup, error) {
	var r rollup
	data, err := os.ReadFile(filepath.Join("/proc", strconv.Itoa(pid), "smaps_rollup"))
	if err != nil {
		return r, err
	}
	for _, line := range strings.Split(string(data), "\n") {
		f := strings.Fields(line)
		if len(f) < 2 {
			continue
		}
		v, _ := strconv.Atoi(f[1])
		switch f[0] {
		case "Rss:":
			r.rss = v
		case "Pss:":
			r.pss = v
		case "Pss_Anon:":
			r.anon = v
		case "Private_Clean:", "Private_Dirty:":
			r.private += v
		}
	}
	return r, nil
}

// Memory goals per instance (issues 24 and 25): one more leading
// instance with its watchdog, on every store; the watchdog alone.
const (
	pssGoalKiB      = 5 * 1024
	watchdogGoalKiB = 1536
)

// pssGoals judge col's memory: the marginal Pss of leaderrun with its
// watchdog, the watchdog's, and on etcd leaderrun alone against
// `etcdctl lock`.
func (r *results) pssGoals(col *storeColumn) []goalMet {
	rec, ok := r.pss[col.lr.id]
	if !ok {
		return nil
	}
	hi := pssCounts[len(pssCounts)-1]
	var out []goalMet
	all, okAll := rec.marginal(memSum.pss)
	out = append(out, goalMet{kind: goalPss, goal: fmt.Sprintf("marginal Pss, leaderrun with its watchdog, ≤ %s", mib(pssGoalKiB)),
		met: okAll && all <= pssGoalKiB, measured: marginalText(all, okAll)})
	wd, okWd := rec.marginal(func(m memSum) int { return m.watchdogPss })
	wdMean := 0
	if m := rec[hi]; m.watchdogs > 0 {
		wdMean = m.watchdogPss / m.watchdogs
	}
	out = append(out, goalMet{kind: goalWatchdog, goal: fmt.Sprintf("the watchdog's marginal Pss at %d leaders ≤ %s", hi, mib(watchdogGoalKiB)),
		met:      okWd && rec[hi].watchdogs == hi && wd <= watchdogGoalKiB,
		measured: fmt.Sprintf("%s (its own Pss at %d leaders: %s each, %d watchdogs found)", marginalText(wd, okWd), hi, mib(wdMean), rec[hi].watchdogs)})
	if col.ref == etcdctlLock {
		alone, okA := rec.marginal(func(m memSum) int { return m.wrapperPss })
		ref, okR := r.pss[etcdctlLock.id].marginal(memSum.pss)
		out = append(out, goalMet{kind: goalPssRef, goal: "marginal Pss, leaderrun alone, ≤ etcdctl lock's",
			met:      okA && okR && alone <= ref,
			measured: fmt.Sprintf("%s vs %s", marginalText(alone, okA), marginalText(ref, okR))})
	}
	return out
}

func marginalText(kib int, ok bool) string {
	if !ok {
		return "not measured"
	}
	return mib(kib)
}

// pssCell is a tool's cell in the main table's Pss rows.
func (r *results) pssCell(tl *tool, f func(memSum) int) string {
	rec, ok := r.pss[tl.id]
	if !ok {
		return "not run"
	}
	var parts []string
	for _, n := range pssCounts {
		if m, ok := rec[n]; ok {
			parts = append(parts, mib(f(m)))
		} else {
			parts = append(parts, "–")
		}
	}
	return strings.Join(parts, " / ")
}

// pssTable is the memory table: what N leading instances of each tool
// cost the host, and one more.
func (r *results) pssTable() string {
	if len(r.pss) == 0 {
		return ""
	}
	var b strings.Builder
	counts := make([]string, len(pssCounts))
	for i, n := range pssCounts {
		counts[i] = strconv.Itoa(n)
	}
	ns := strings.Join(counts, " / ")
	lo, hi := pssCounts[0], pssCounts[len(pssCounts)-1]
	fmt.Fprintf(&b, "| tool | Pss, %s leaders (summed) | Private, %s leaders | marginal Pss, wrapper + watchdog | marginal Private | marginal Pss, wrapper alone | watchdog: marginal Pss; own Pss at %d, each | RSS at %d, summed (secondary) |\n|---|---|---|---|---|---|---|---|\n",
		ns, ns, hi, hi)
	for _, tl := range pssTools {
		rec, ok := r.pss[tl.id]
		if !ok {
			continue
		}
		all, okAll := rec.marginal(memSum.pss)
		priv, okPriv := rec.marginal(memSum.private)
		alone, okAlone := rec.marginal(func(m memSum) int { return m.wrapperPss })
		wd := "none"
		if m := rec[hi]; m.watchdogs > 0 {
			w, okW := rec.marginal(func(m memSum) int { return m.watchdogPss })
			wd = fmt.Sprintf("%s; %s", marginalText(w, okW), mib(m.watchdogPss/m.watchdogs))
		}
		rss := "–"
		if m, ok := rec[hi]; ok {
			rss = mib(m.rss)
		}
		fmt.Fprintf(&b, "| %s | %s | %s | %s | %s | %s | %s | %s |\n", tl.name, r.pssCell(tl, memSum.pss), r.pssCell(tl, memSum.private),
			marginalText(all, okAll), marginalText(priv, okPriv), marginalText(alone, okAlone), wd, rss)
	}
	fmt.Fprintf(&b, "\nMarginal: (sum at %d − sum at %d) / %d.\n", hi, lo, hi-lo)
	return b.String()
}

// pssDetails is the report's section on what one more instance costs.
func (r *results) pssDetails() string {
	if len(r.pss) == 0 {
		return ""
	}
	var b strings.Builder
	hi := pssCounts[len(pssCounts)-1]
	counts := make([]string, len(pssCounts))
	for i, n := range pssCounts {
		counts[i] = strconv.Itoa(n)
	}
	fmt.Fprintf(&b, "\n### Memory as a host pays it\n\nEach tool alone on the machine (nothing else of the benchmark running): %s leaders of distinct locks at once, each leading for %v, then `/proc/PID/smaps_rollup` of every process of each wrapper's tree but the child's: the wrapper (leaderrun, `etcdctl`, `consul`), its watchdog (the child's parent, where that is not the wrapper: leaderrun re-executed) and any other helper. Pss divides each page among the processes that map it, so the binary's code, read from one file, is paid once per host and shared out; Private is what no other process maps. The marginal figure is what one more leading instance costs the host. RSS, summed, counts the shared pages once per process: it is shown for comparison only.\n\n",
		strings.Join(counts, ", then "), pssLead)
	b.WriteString(r.pssTable())
	for _, tl := range pssTools {
		m, ok := r.pss[tl.id][hi]
		if !ok || m.watchdogs == 0 {
			continue
		}
		an, okAn := r.pss[tl.id].marginal(memSum.anon)
		other := ""
		if m.otherPss > 0 {
			other = fmt.Sprintf(", other helpers %s", mib(m.otherPss))
		}
		fmt.Fprintf(&b, "- %s at %d leaders: leaderrun %s Pss (%s private, %s anonymous) in all, its watchdogs %s Pss (%s private, %s anonymous)%s; the anonymous part of one more instance's Pss: %s.\n",
			tl.name, hi, mib(m.wrapperPss), mib(m.wrapperPriv), mib(m.wrapperAnon), mib(m.watchdogPss), mib(m.watchdogPriv), mib(m.watchdogAnon), other, marginalText(an, okAn))
	}
	return b.String()
}
