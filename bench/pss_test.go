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

// Instances in the Pss phase: one alone, then this many at once, each
// leading a lock of its own.
const pssMany = 9

// pssRec is what leaderrun and its watchdog cost while leading, summed
// over the instances, in KiB, from /proc/PID/smaps_rollup: Pss (shared
// pages divided among the processes that map them, the binary's
// file-backed pages included) and Private (pages no other process maps).
type pssRec struct {
	one, many               int // Pss of 1 and of pssMany instances
	privateOne, privateMany int
}

// marginal is the Pss and Private of one more instance.
func (r pssRec) marginal() (pss, private int) {
	return (r.many - r.one) / (pssMany - 1), (r.privateMany - r.privateOne) / (pssMany - 1)
}

// measurePss measures memory as a host pays it (DESIGN §7): for each
// store, one leader, then pssMany leaders of distinct locks at once;
// leaderrun and its watchdog of each (not the child), summed, after 3 s
// of leading (renewals and loss checks run meanwhile). RSS counts the
// binary's pages once per process and misleads; Pss shares them out.
func (b *bench) measurePss() {
	for _, col := range storeColumns {
		tl := col.lr
		rec := pssRec{}
		for _, n := range []int{1, pssMany} {
			pss, private, err := b.leadersMemory(tl, n)
			if err != nil {
				b.t.Errorf("%s: %v", tl.name, err)
				break
			}
			if n == 1 {
				rec.one, rec.privateOne = pss, private
			} else {
				rec.many, rec.privateMany = pss, private
			}
			b.killAll()
		}
		b.res.mu.Lock()
		b.res.pss[tl.id] = rec
		b.res.mu.Unlock()
	}
}

// leadersMemory starts n leaders of tl on distinct locks, and sums the
// Pss and Private of each leaderrun and its descendants but the child.
func (b *bench) leadersMemory(tl *tool, n int) (pss, private int, err error) {
	var procs []*proc
	for i := range n {
		tag := fmt.Sprintf("%s-pss%d-%d", tl.id, n, i)
		p, err := b.start(tl, tag, tag, b.addr(tl), true)
		if err != nil {
			return 0, 0, err
		}
		procs = append(procs, p)
	}
	kids := map[*proc]kid{}
	for _, p := range procs {
		k, ok := b.hub.started(p.tag, 15*time.Second)
		if !ok {
			return 0, 0, fmt.Errorf("no child within 15 s:\n%s", p.tail())
		}
		kids[p] = k
	}
	time.Sleep(3 * time.Second) // leading
	for _, p := range procs {
		skip := append([]int{kids[p].pid}, descendants(kids[p].pid)...)
		for _, pid := range append([]int{p.pid()}, descendants(p.pid())...) {
			if slices.Contains(skip, pid) {
				continue
			}
			s, pr, err := readPss(pid)
			if err != nil {
				return 0, 0, err
			}
			pss, private = pss+s, private+pr
		}
	}
	return pss, private, nil
}

// readPss reads Pss and Private_Clean + Private_Dirty of pid, in KiB.
func readPss(pid int) (pss, private int, err error) {
	data, err := os.ReadFile(filepath.Join("/proc", strconv.Itoa(pid), "smaps_rollup"))
	if err != nil {
		return 0, 0, err
	}
	for _, line := range strings.Split(string(data), "\n") {
		f := strings.Fields(line)
		if len(f) < 2 {
			continue
		}
		v, _ := strconv.Atoi(f[1])
		switch f[0] {
		case "Pss:":
			pss = v
		case "Private_Clean:", "Private_Dirty:":
			private += v
		}
	}
	return pss, private, nil
}

// pssDetails is the section of the report on what one more instance
// costs.
func (r *results) pssDetails() string {
	if len(r.pss) == 0 {
		return ""
	}
	var b strings.Builder
	fmt.Fprintf(&b, "\n### What one more instance costs\n\nleaderrun and its watchdog while leading, summed over 1 and over %d instances leading distinct locks at once (the child left out), from `/proc/PID/smaps_rollup` after 3 s of leading; the marginal figure is the difference divided by %d. Pss shares each page among the processes that map it, so the binary's code, read from one file, is paid for once per host; Private is what no other process maps.\n\n",
		pssMany, pssMany-1)
	fmt.Fprintf(&b, "| tool | Pss, 1 instance | Pss, %d instances | marginal Pss | marginal Private |\n|---|---|---|---|---|\n", pssMany)
	for _, col := range storeColumns {
		rec, ok := r.pss[col.lr.id]
		if !ok {
			continue
		}
		mp, mpr := rec.marginal()
		fmt.Fprintf(&b, "| %s | %s | %s | %s | %s |\n", col.lr.name, mib(rec.one), mib(rec.many), mib(mp), mib(mpr))
	}
	return b.String()
}
