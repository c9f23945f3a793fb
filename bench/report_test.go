package bench

import (
	"fmt"
	"os"
	"runtime"
	"slices"
	"sort"
	"strconv"
	"strings"
	"sync"
	"time"
)

// rssRec is the largest VmHWM seen for a wrapper, and the sum of its
// helper processes' (leaderrun's watchdog), in KiB.
type rssRec struct {
	wrapper, helpers int
	helperNames      []string
	// helperAnon is the helpers' anonymous pages (KiB); the smaps are the
	// wrapper's (the round with the most anonymous pages) and a helper's.
	helperAnon                int
	wrapperSmaps, helperSmaps smaps
}

// anon is the anonymous resident set of the wrapper and its helpers, KiB.
func (r rssRec) anon() int { return r.wrapperSmaps.anon + r.helperAnon }

// crashOld is what became of the old child after kill -9 of its wrapper.
type crashOld struct {
	trials   int
	survived int             // still running 1 s after the kill
	overlap  int             // still running when the follower's child started
	died     []time.Duration // kill → old child gone, where it died within 1 s
}

// results is everything the benchmark measured.
type results struct {
	runs int

	mu                                  sync.Mutex
	startup, s2c, loss, handover, crash map[string]*sample // by binary / tool id
	exit                                map[string]*sample // exec to exit, by tool id
	faults                              map[string]*sample // minor page faults (as a Duration), by binary / tool id
	initTotal                           map[string]*sample // total package init, by binary
	initPkg                             map[string]*sample // "binary package": init of one package
	pkgSize                             map[string]int     // the binary under test's code and data by package
	compared                            []string           // BENCH_COMPARE's binaries, "leaderrun@label"
	segments                            map[string]*sample // "tool id/segment": leaderrun's start-to-child in parts
	rss                                 map[string]rssRec
	rssLong                             map[string]rssRec // after measureRSSLong
	startupRSS                          map[string]int    // peak RSS of `BINARY version`, KiB
	crashOld                            map[string]crashOld
	cost                                map[string]*costRes
	herd                                map[string]*herdRes // by store
	notes                               map[string][]string // by tool id
	versions                            map[string]string
	machine                             machine
	command                             string
	took                                time.Duration
	bins                                map[string]string // binary paths by name, for their sizes
	loads                               []string          // load average as each phase began
}

func newResults(runs int) *results {
	return &results{runs: runs,
		startup: map[string]*sample{}, s2c: map[string]*sample{}, loss: map[string]*sample{},
		handover: map[string]*sample{}, crash: map[string]*sample{}, segments: map[string]*sample{},
		exit: map[string]*sample{}, faults: map[string]*sample{}, initTotal: map[string]*sample{}, initPkg: map[string]*sample{},
		rss: map[string]rssRec{}, rssLong: map[string]rssRec{}, startupRSS: map[string]int{}, crashOld: map[string]crashOld{}, cost: map[string]*costRes{},
		herd: map[string]*herdRes{}, notes: map[string][]string{}}
}

// sample returns m[id], created if needed. Safe for concurrent use.
func (r *results) sample(m map[string]*sample, id string) *sample {
	r.mu.Lock()
	defer r.mu.Unlock()
	if m[id] == nil {
		m[id] = &sample{}
	}
	return m[id]
}

// note records something a tool did that the figures do not show.
func (r *results) note(id, figure, msg string) {
	r.mu.Lock()
	defer r.mu.Unlock()
	n := figure + ": " + msg
	if !slices.Contains(r.notes[id], n) {
		r.notes[id] = append(r.notes[id], n)
	}
}

// machine describes where the benchmark ran.
type machine struct {
	cpus                  int
	cpu, mem, kernel, goV string
	loadBefore, loadAfter string
	date                  string
	os                    string
}

func describeMachine(loadBefore, loadAfter string, began time.Time) machine {
	m := machine{cpus: runtime.NumCPU(), goV: runtime.Version(), loadBefore: loadBefore, loadAfter: loadAfter,
		date: began.UTC().Format("2006-01-02 15:04 MST"), os: runtime.GOOS + "/" + runtime.GOARCH}
	if data, err := os.ReadFile("/proc/cpuinfo"); err == nil {
		for _, line := range strings.Split(string(data), "\n") {
			if k, v, ok := strings.Cut(line, ":"); ok && strings.TrimSpace(k) == "model name" {
				m.cpu = strings.TrimSpace(v)
				break
			}
		}
	}
	if data, err := os.ReadFile("/proc/meminfo"); err == nil {
		for _, line := range strings.Split(string(data), "\n") {
			if f := strings.Fields(line); len(f) >= 2 && f[0] == "MemTotal:" {
				kb, _ := strconv.Atoi(f[1])
				m.mem = fmt.Sprintf("%.1f GiB", float64(kb)/(1<<20))
			}
		}
	}
	if data, err := os.ReadFile("/proc/sys/kernel/osrelease"); err == nil {
		m.kernel = strings.TrimSpace(string(data))
	}
	return m
}

func (r *results) p50(m map[string]*sample, id string) time.Duration {
	if s := m[id]; s != nil {
		return percentile(s.vals, .5)
	}
	return -1
}

func (r *results) pmax(m map[string]*sample, id string) time.Duration {
	if s := m[id]; s != nil {
		return percentile(s.vals, 1)
	}
	return -1
}

func yesNo(ok bool) string {
	if ok {
		return "**yes**"
	}
	return "**no**"
}

// goalMet is one goal's verdict, with the numbers behind it.
type goalMet struct {
	name, goal string
	met        bool
	measured   string
}

// goals judges every goal of the issue on leaderrun's figures.
func (r *results) goals() []goalMet {
	var out []goalMet
	// Start-to-child, exec-to-exit and memory, store by store.
	for _, col := range storeColumns {
		tl, ref := col.lr, col.ref
		if ref != nil && col.s2cRatio > 0 {
			l, e := r.p50(r.s2c, tl.id), r.p50(r.s2c, ref.id)
			out = append(out, goalMet{"start-to-child, " + tl.name, fmt.Sprintf("p50 ≤ %.1f× %s", col.s2cRatio, ref.name),
				l >= 0 && e > 0 && float64(l) <= col.s2cRatio*float64(e),
				fmt.Sprintf("%s vs %s: %s", fmtDur(l), fmtDur(e), ratio(l, e))})
		}
		if ref != nil && col.exitRatio > 0 {
			l, e := r.p50(r.exit, tl.id), r.p50(r.exit, ref.id)
			out = append(out, goalMet{"exec-to-exit, " + tl.name, fmt.Sprintf("p50 ≤ %.1f× %s", col.exitRatio, ref.name),
				l >= 0 && e > 0 && float64(l) <= col.exitRatio*float64(e),
				fmt.Sprintf("%s vs %s: %s", fmtDur(l), fmtDur(e), ratio(l, e))})
		}
		rec := r.rss[tl.id]
		out = append(out, goalMet{"leading RSS, " + tl.name + ", with its watchdog", fmt.Sprintf("≤ %s", mib(rssGoalKiB)),
			rec.wrapper > 0 && rec.wrapper+rec.helpers <= rssGoalKiB, mib(rec.wrapper + rec.helpers)})
		out = append(out, goalMet{"leading anonymous RSS, " + tl.name + ", with its watchdog", fmt.Sprintf("≤ %s", mib(anonGoalKiB)),
			rec.wrapperSmaps.rss > 0 && rec.anon() <= anonGoalKiB, mib(rec.anon())})
		if long, ok := r.rssLong[tl.id]; ok {
			out = append(out, goalMet{"leading RSS after 300 renewals, " + tl.name + ", with its watchdog", fmt.Sprintf("≤ %s; anonymous ≤ %s", mib(rssGoalKiB), mib(anonGoalKiB)),
				long.wrapper > 0 && long.wrapper+long.helpers <= rssGoalKiB && long.anon() <= anonGoalKiB,
				fmt.Sprintf("%s; anonymous %s", mib(long.wrapper+long.helpers), mib(long.anon()))})
		}
	}
	// Loss reaction, handover.
	for _, tl := range []*tool{lrEtcd, lrConsul} {
		s := r.loss[tl.id]
		p99 := time.Duration(-1)
		if s != nil && s.never == 0 {
			p99 = percentile(s.vals, .99)
		}
		out = append(out, goalMet{"loss reaction, " + tl.name, "p99 < 100 ms",
			p99 >= 0 && p99 < 100*time.Millisecond, fmtDur(p99)})
	}
	for _, tl := range []*tool{lrEtcd, lrConsul} {
		p50 := r.p50(r.handover, tl.id)
		out = append(out, goalMet{"graceful handover, " + tl.name, "p50 < 50 ms",
			p50 >= 0 && p50 < 50*time.Millisecond, fmtDur(p50)})
	}
	// Crash failover on etcd.
	mx := r.pmax(r.crash, lrEtcd.id)
	never := r.crash[lrEtcd.id] != nil && r.crash[lrEtcd.id].never > 0
	out = append(out, goalMet{"crash failover, leaderrun (etcd)", fmt.Sprintf("max ≤ lease + 0.5 s = %s", fmtDur(etcdLease+500*time.Millisecond)),
		mx >= 0 && !never && mx <= etcdLease+500*time.Millisecond, "max " + fmtDur(mx)})
	// Store cost.
	for _, tl := range []*tool{lrEtcd, lrConsul} {
		c := r.cost[tl.id]
		if c == nil {
			continue
		}
		other := c.follower.byClass(tl.store)[classOther]
		out = append(out, goalMet{"idle follower polls, " + tl.name, "no requests but keep-alives and watches/blocking queries",
			other < 0.01, fmt.Sprintf("%.2f other req/s", other)})
	}
	for _, tl := range []*tool{lrEtcd, lrConsul} {
		h := r.herd[tl.store]
		if h == nil || len(h.changes) == 0 {
			continue
		}
		woken := h.medianWoken()
		out = append(out, goalMet{fmt.Sprintf("followers woken per change, %s, %d followers", tl.name, h.followers), "1, not all",
			woken <= 1, fmt.Sprintf("median %d of %d", woken, h.followers)})
	}
	return out
}

func (h *herdRes) medianWoken() int {
	var w []int
	for _, c := range h.changes {
		w = append(w, c.woken)
	}
	slices.Sort(w)
	if len(w) == 0 {
		return -1
	}
	return w[(len(w)-1)/2]
}

// costCell prints a rates summary: total, then by class.
func costCell(c rates, store string) string {
	if c == nil {
		return "not measured"
	}
	by := c.byClass(store)
	total := by[classKeepalive] + by[classBlocking] + by[classOther]
	return fmt.Sprintf("%.2f (keep-alive %.2f, watch/blocking %.2f, other %.2f)", total, by[classKeepalive], by[classBlocking], by[classOther])
}

// table is the main table: one row per figure, one column per tool.
func (r *results) table() string {
	var b strings.Builder
	cols := wrappers
	b.WriteString("| figure |")
	for _, tl := range cols {
		b.WriteString(" " + tl.name + " |")
	}
	b.WriteString(" goal (on leaderrun) | met |\n|---|")
	for range cols {
		b.WriteString("---|")
	}
	b.WriteString("---|---|\n")
	g := r.goals()
	verdict := func(prefix ...string) string {
		var parts []string
		for _, x := range g {
			for _, p := range prefix {
				if strings.HasPrefix(x.name, p) {
					parts = append(parts, fmt.Sprintf("%s %s (%s)", shortStore(x.name), yesNo(x.met), x.measured))
				}
			}
		}
		return strings.Join(parts, "; ")
	}
	row := func(name string, cell func(tl *tool) string, goal, met string) {
		b.WriteString("| " + name + " |")
		for _, tl := range cols {
			b.WriteString(" " + cell(tl) + " |")
		}
		b.WriteString(" " + goal + " | " + met + " |\n")
	}
	row(fmt.Sprintf("start-to-child, free lock, p50 / p90 (%d runs)", r.runs), func(tl *tool) string { return r.s2c[tl.id].pair(.9) },
		"etcd ≤ 0.8× etcdctl lock; Consul ≤ 0.3× consul lock", verdict("start-to-child"))
	row("exec-to-exit, free lock, child exits at once, p50 / p90", func(tl *tool) string { return r.exit[tl.id].pair(.9) },
		"etcd ≤ 1.0× etcdctl lock", verdict("exec-to-exit"))
	row("peak RSS while leading (VmHWM), wrapper process", func(tl *tool) string { return mib(r.rss[tl.id].wrapper) }, "", "")
	row("… plus its helper processes", func(tl *tool) string {
		rec := r.rss[tl.id]
		if rec.helpers == 0 {
			return mib(rec.wrapper) + " (none)"
		}
		return fmt.Sprintf("%s (+%s %s)", mib(rec.wrapper+rec.helpers), mib(rec.helpers), strings.Join(rec.helperNames, ", "))
	}, fmt.Sprintf("≤ %s", mib(rssGoalKiB)), verdict("leading RSS"))
	row("anonymous RSS while leading, wrapper + helpers", func(tl *tool) string {
		rec := r.rss[tl.id]
		if rec.wrapperSmaps.rss == 0 {
			return "not measured"
		}
		return fmt.Sprintf("%s (%s + %s)", mib(rec.anon()), mib(rec.wrapperSmaps.anon), mib(rec.helperAnon))
	}, fmt.Sprintf("≤ %s", mib(anonGoalKiB)), verdict("leading anonymous RSS"))
	row("binary size; total package init, p50", func(tl *tool) string {
		bin := map[string]string{"etcd": "etcdctl", "consul": "consul"}[tl.store]
		if strings.HasPrefix(tl.name, "leaderrun") {
			return fmt.Sprintf("%s; %s", r.sizes()["leaderrun"], fmtDur(r.p50(r.initTotal, "leaderrun")))
		}
		return r.sizes()[bin] + "; not measured"
	}, "", "")
	row("loss reaction (lease revoked / session destroyed → child signalled), p50 / p99", func(tl *tool) string { return r.loss[tl.id].pair(.99) },
		"p99 < 100 ms", verdict("loss reaction"))
	row("graceful handover (SIGTERM to leader → follower's child), p50 / p90", func(tl *tool) string { return r.handover[tl.id].pair(.9) },
		"p50 < 50 ms", verdict("graceful handover"))
	row("crash failover (kill -9 of the leading wrapper → follower's child), p50 / max", func(tl *tool) string { return r.crash[tl.id].pair(1) },
		"etcd: ≤ lease + 0.5 s", verdict("crash failover"))
	row("old child after kill -9 of its wrapper", func(tl *tool) string { return r.crashOld[tl.id].String() }, "", "")
	row("store requests/s, one leader", func(tl *tool) string {
		if c := r.cost[tl.id]; c != nil {
			return costCell(c.leader, tl.store)
		}
		return "not measured"
	}, "", "")
	row("store requests/s, one idle follower", func(tl *tool) string {
		if c := r.cost[tl.id]; c != nil {
			return costCell(c.follower, tl.store)
		}
		return "not measured"
	}, "no polling: keep-alives and watches/blocking queries only", verdict("idle follower polls"))
	herd := func(f func(h *herdRes) string) func(tl *tool) string {
		return func(tl *tool) string {
			if tl != lrEtcd && tl != lrConsul {
				return "not run"
			}
			h := r.herd[tl.store]
			if h == nil || len(h.changes) == 0 {
				return "not measured"
			}
			return f(h)
		}
	}
	n := 0
	for _, h := range r.herd {
		n = h.followers
	}
	row(fmt.Sprintf("%d followers: handover p50 / max (%d changes)", n, herdChanges), herd(func(h *herdRes) string { return h.handover.pair(1) }), "", "")
	row(fmt.Sprintf("%d followers: followers woken per change, median (all changes)", n), herd(func(h *herdRes) string {
		var w []string
		for _, c := range h.changes {
			w = append(w, strconv.Itoa(c.woken))
		}
		return fmt.Sprintf("%d (%s)", h.medianWoken(), strings.Join(w, ", "))
	}), "1, not all", verdict("followers woken"))
	return b.String()
}

func shortStore(name string) string {
	switch {
	case strings.Contains(name, "Consul"):
		return "Consul"
	case strings.Contains(name, "etcd"):
		return "etcd"
	}
	return ""
}

func (c crashOld) String() string {
	if c.trials == 0 {
		return "not measured"
	}
	switch {
	case c.survived == c.trials:
		s := fmt.Sprintf("survived (%d of %d)", c.survived, c.trials)
		if c.overlap > 0 {
			s += fmt.Sprintf("; ran alongside the new child in %d", c.overlap)
		}
		return s
	case c.survived == 0:
		return fmt.Sprintf("killed %s after (p50; %d of %d)", fmtDur(percentile(c.died, .5)), len(c.died), c.trials)
	}
	return fmt.Sprintf("survived in %d of %d; killed in %d", c.survived, c.trials, len(c.died))
}

// markdown is docs/benchmarks.md.
func (r *results) markdown() string {
	var b strings.Builder
	m := r.machine
	fmt.Fprintf(&b, "# Benchmarks: leaderrun, `etcdctl lock` and `consul lock`\n\n")
	fmt.Fprintf(&b, "Produced by `%s` on %s, in %v. Every figure below comes from that one run.\n\n",
		r.command, m.date, r.took.Round(time.Second))
	fmt.Fprintf(&b, "**Machine:** %d CPUs (%s), %s RAM, Linux %s, %s, %s. Load average (1, 5, 15 min) %s at the start and %s at the end (the end figure includes the benchmark's own 200-follower phase). Other engineers' test suites may run on this machine at any time, so absolute figures are noisy; the tools were alternated run by run so that the noise hit all alike.\n\n",
		m.cpus, m.cpu, m.mem, m.kernel, m.os, m.goV, m.loadBefore, m.loadAfter)
	fmt.Fprintf(&b, "Load average as each phase began: %s.\n\n", strings.Join(r.loads, "; "))
	fmt.Fprintf(&b, "**Versions:** %s; %s (server %s); %s. leaderrun is built without the race detector, as users build it.\n\n",
		r.versions["leaderrun"], r.versions["etcdctl"], r.versions["etcd"], r.versions["consul"])
	b.WriteString("**Stores:** one single-node etcd (`--heartbeat-interval 100 --election-timeout 1000`) and one Consul dev agent, both on 127.0.0.1, started by the benchmark; every tool runs against the same ones.\n\n")
	b.WriteString("**Settings, as close as the tools allow:**\n\n")
	fmt.Fprintf(&b, "- leaderrun on etcd: `%s`; `etcdctl lock --ttl %s` (a 5 s lease for both).\n", strings.Join(lrEtcdTimings, " "), etcdctlTTL)
	fmt.Fprintf(&b, "- leaderrun on Consul: `%s` (its defaults); `consul lock -shell=false` (so that it runs the child directly, as the others do): it has no flags for its session: TTL 15 s, Consul's default lock-delay 15 s, renewed every TTL/2.\n", strings.Join(lrConsulTimings, " "))
	b.WriteString("- The same child for every tool: the benchmark's test binary re-executed in a child mode, which reads `CLOCK_MONOTONIC` first thing, reports it on a unix socket, and in hold mode reports the time it receives SIGTERM/SIGINT.\n\n")

	b.WriteString("## Results\n\n")
	b.WriteString(r.table())
	b.WriteString("\nPercentiles are nearest-rank: with 30 runs p90 is the 27th smallest; with 10 runs p99 is the largest. \"never\": the awaited event did not come within 5 s; a tool that missed its first 3 runs that way was not run again for that figure.\n\n")
	b.WriteString("![Latency distributions](benchmarks.svg)\n\n")

	b.WriteString("## Goals\n\n| goal | target | measured | met |\n|---|---|---|---|\n")
	for _, g := range r.goals() {
		fmt.Fprintf(&b, "| %s | %s | %s | %s |\n", g.name, g.goal, g.measured, yesNo(g.met))
	}
	b.WriteString("\n")
	b.WriteString(r.analysis())

	b.WriteString("\n## Details\n\n### What a start costs\n\n")
	b.WriteString("Exec to exit of `BINARY version` (the child: `-test.run=^$`), and its peak RSS (getrusage): what a binary of that size costs to start before it does any work. The start-to-child figure of a wrapper includes at least its own start and the child's.\n\n| binary | size | p50 | p90 | peak RSS |\n|---|---|---|---|---|\n")
	for _, id := range []string{"leaderrun", "etcdctl", "consul", "child"} {
		s := r.startup[id]
		if s == nil {
			continue
		}
		fmt.Fprintf(&b, "| %s | %s | %s | %s | %s |\n", id, r.sizes()[id], fmtDur(percentile(s.vals, .5)), fmtDur(percentile(s.vals, .9)), mib(r.startupRSS[id]))
	}
	fmt.Fprintf(&b, "\nThe child started directly, with no lock (fork and exec to its first instruction of `main`): p50 %s, p90 %s. Subtracted from each wrapper's start-to-child p50, that leaves what the wrapper itself costs:\n\n",
		fmtDur(r.p50(r.s2c, direct.id)), fmtDur(percentile(r.s2cVals(direct.id), .9)))
	b.WriteString("| tool | start-to-child p50 | minus the child alone |\n|---|---|---|\n")
	for _, tl := range wrappers {
		p := r.p50(r.s2c, tl.id)
		fmt.Fprintf(&b, "| %s | %s | %s |\n", tl.name, fmtDur(p), fmtDur(p-r.p50(r.s2c, direct.id)))
	}

	b.WriteString("\nWhere leaderrun's start-to-child goes, p50 of each part, from the timestamps of its own log lines (`--log-format json`) against the wall clock at the fork:\n\n| part | leaderrun (etcd) | leaderrun (Consul) |\n|---|---|---|\n")
	for _, seg := range segments {
		fmt.Fprintf(&b, "| %s | %s | %s |\n", seg, fmtDur(r.p50(r.segments, lrEtcd.id+"/"+seg)), fmtDur(r.p50(r.segments, lrConsul.id+"/"+seg)))
	}
	b.WriteString(r.startupDetails())
	b.WriteString("\n### Store cost\n\nRequests per second by method, over ")
	if c := r.cost[lrEtcd.id]; c != nil {
		fmt.Fprintf(&b, "%v windows", c.window.Round(time.Second))
	}
	b.WriteString(". etcd: deltas of `grpc_server_msg_received_total` (for `LeaseKeepAlive`, `grpc_server_msg_sent_total`: etcd counts two received messages for each one-shot keep-alive stream, one response answers each keep-alive) on a server with only the measured processes connected (each etcd tool had a server of its own), the leader alone, then leader and follower, and the follower is the difference; stream messages count one each (a keep-alive, a watch created). Consul: requests counted at an HTTP reverse proxy in front of the agent for each process, over two windows; `?index` marks a blocking query.\n\n")
	b.WriteString("| tool | role | requests/s by method |\n|---|---|---|\n")
	for _, tl := range wrappers {
		c := r.cost[tl.id]
		if c == nil {
			continue
		}
		fmt.Fprintf(&b, "| %s | leader | %s |\n| %s | idle follower | %s |\n", tl.name, fmtRates(c.leader), tl.name, fmtRates(c.follower))
	}
	for _, tl := range []*tool{lrConsul, consulLock} {
		if c := r.cost[tl.id]; c != nil && len(c.followerBlocking) > 0 {
			fmt.Fprintf(&b, "\n%s's idle follower: %d blocking queries ended in the windows, lasting p50 %s (shortest %s, longest %s); %d of them under 1 s.\n",
				tl.name, len(c.followerBlocking), fmtDur(percentile(c.followerBlocking, .5)), fmtDur(percentile(c.followerBlocking, 0)),
				fmtDur(percentile(c.followerBlocking, 1)), c.shortBlocking())
		}
	}
	b.WriteString("\nRequests (counts) for one whole run on a free lock: start, acquire, child that exits at once, release, exit.\n\n| tool | requests |\n|---|---|\n")
	for _, tl := range wrappers {
		if c := r.cost[tl.id]; c != nil {
			fmt.Fprintf(&b, "| %s | %s |\n", tl.name, fmtCounts(c.oneRun))
		}
	}

	for _, tl := range []*tool{lrEtcd, lrConsul} {
		h := r.herd[tl.store]
		if h == nil {
			continue
		}
		fmt.Fprintf(&b, "\n### %d followers on one lock, %s\n\n", h.followers, tl.name)
		fmt.Fprintf(&b, "%d leaderrun processes waiting on one lock (each with its watchdog), and a leader. While idle, all followers together sent (requests/s): %s.\n\n",
			h.followers, fmtRates(h.idle))
		b.WriteString("Then leadership moved by SIGTERM to the leader, several times; each window runs from the SIGTERM to 2 s after the new leader's child started.\n\n")
		b.WriteString("| change | handover | followers woken | requests in the window (not keep-alives) |\n|---|---|---|---|\n")
		for i, c := range h.changes {
			woken := strconv.Itoa(c.woken)
			if tl.store == "consul" {
				woken = fmt.Sprintf("%d (%d blocking queries answered by the change)", c.woken, c.wakes)
			} else {
				woken = fmt.Sprintf("%d (%d watch responses sent)", c.woken, c.wakes)
			}
			fmt.Fprintf(&b, "| %d | %s | %s | %s |\n", i+1, fmtDur(c.handover), woken, fmtCounts(c.requests))
		}
		if tl.store == "etcd" {
			b.WriteString("\netcd: followers woken = Range requests in the window − 1. A waiting candidate of `concurrency.Election` watches only the key just ahead of it in the queue; when that key goes, it re-reads the queue once (a Range), and the new leader reads its own key once more before it starts its child.\n")
		} else {
			b.WriteString("\nConsul: counted at each follower's own proxy; a follower is woken when a blocking query of its returns because the key's index moved (not at the end of its wait).\n")
		}
	}

	if len(r.notes) > 0 {
		b.WriteString("\n### Notes from the run\n\n")
		ids := make([]string, 0, len(r.notes))
		for id := range r.notes {
			ids = append(ids, id)
		}
		sort.Strings(ids)
		for _, id := range ids {
			for _, n := range r.notes[id] {
				fmt.Fprintf(&b, "- %s, %s\n", toolName(id), n)
			}
		}
	}
	b.WriteString(method)
	return b.String()
}

func toolName(id string) string {
	for _, tl := range append([]*tool{direct}, wrappers...) {
		if tl.id == id {
			return tl.name
		}
	}
	return id
}

func (r *results) s2cVals(id string) []time.Duration {
	if s := r.s2c[id]; s != nil {
		return s.vals
	}
	return nil
}

// sizes are the binaries' sizes, for the start-up table.
func (r *results) sizes() map[string]string {
	out := map[string]string{}
	for id, path := range r.bins {
		if fi, err := os.Stat(path); err == nil {
			out[id] = fmt.Sprintf("%.1f MiB", float64(fi.Size())/(1<<20))
		}
	}
	return out
}

func fmtRates(r rates) string {
	if len(r) == 0 {
		return "none"
	}
	keys := make([]string, 0, len(r))
	for k := range r {
		keys = append(keys, k)
	}
	sort.Slice(keys, func(i, j int) bool { return r[keys[i]] > r[keys[j]] || r[keys[i]] == r[keys[j]] && keys[i] < keys[j] })
	var parts []string
	for _, k := range keys {
		if r[k] >= 0.005 {
			parts = append(parts, fmt.Sprintf("`%s` %.2f", k, r[k]))
		}
	}
	if len(parts) == 0 {
		return "none"
	}
	return strings.Join(parts, ", ")
}

func fmtCounts(r rates) string {
	if len(r) == 0 {
		return "none"
	}
	keys := make([]string, 0, len(r))
	for k := range r {
		keys = append(keys, k)
	}
	sort.Slice(keys, func(i, j int) bool { return r[keys[i]] > r[keys[j]] || r[keys[i]] == r[keys[j]] && keys[i] < keys[j] })
	var parts []string
	for _, k := range keys {
		parts = append(parts, fmt.Sprintf("`%s` %.0f", k, r[k]))
	}
	return strings.Join(parts, ", ")
}

const method = `
## How it is measured

- **start-to-child**: from just before the fork of the wrapper to the child's first reading of the clock in ` + "`main`" + `, on a lock nobody holds; the child exits at once and the wrapper is waited for before the next run. Runs rotate through the tools (and the child alone), so each tool runs right after each other one equally often.
- **peak RSS**: every wrapper leads its own lock at once for 3 s, then VmHWM is read from /proc/PID/status, for the wrapper and for its descendants except the child (leaderrun's watchdog); the largest of 3 rounds. The helpers' figure is the sum of their VmHWM.
- **loss reaction**: the leader's child runs; etcd: the lease of the holder's key (under ` + "`leaderrun/LOCK/`" + ` or ` + "`LOCK/`" + `) is revoked through etcd's JSON gateway; Consul: the session holding the key (` + "`leaderrun/LOCK`" + ` or ` + "`LOCK/.lock`" + `) is destroyed with ` + "`PUT /v1/session/destroy/ID`" + `. Measured from just before that request to the child's receipt of SIGTERM/SIGINT.
- **graceful handover**: a leader, and a follower that the store shows waiting (its key or session exists; then 300 ms to settle); SIGTERM to the leader's wrapper process; measured to the follower's child start.
- **crash failover**: the same, with SIGKILL to the leader's wrapper process only; measured to the follower's child start. The old child is checked 1 s after the kill. The etcd trials of both tools ran side by side, each on its own lock, as did all the Consul trials: each waits out a lease, so the machine's noise does not matter there.
- **store cost** and **followers**: see the details above. No other process talked to the measured store, or through the measured proxy, during a window; the benchmark reads etcd's /metrics over HTTP, which is not counted.
`
