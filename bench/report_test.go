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

	"github.com/leaderrun/leaderrun/internal/testenv"
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
	initBytes                           map[string]*sample // heap allocated by package init (bytes, as a Duration), by binary
	initPkgBytes                        map[string]*sample // "binary package": bytes its init allocated
	initCount                           map[string]int     // packages initialised, by binary
	pkgSize                             map[string]int     // the binary under test's code and data by package
	compared                            []string           // BENCH_COMPARE's binaries, "leaderrun@label"
	segments                            map[string]*sample // "tool id/segment": leaderrun's start-to-child in parts
	rss                                 map[string]rssRec
	rssLong                             map[string]rssRec // after measureRSSLong
	startupRSS                          map[string]int    // peak RSS of `BINARY version`, KiB
	crashOld                            map[string]crashOld
	cost                                map[string]*costRes
	herd                                map[string]*herdRes // by store
	pss                                 map[string]pssRec   // by tool id
	pool                                map[string]*poolRes // by tool id
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
		initBytes: map[string]*sample{}, initPkgBytes: map[string]*sample{}, initCount: map[string]int{}, pool: map[string]*poolRes{},
		rss: map[string]rssRec{}, rssLong: map[string]rssRec{}, startupRSS: map[string]int{}, crashOld: map[string]crashOld{}, cost: map[string]*costRes{},
		herd: map[string]*herdRes{}, pss: map[string]pssRec{}, notes: map[string][]string{}}
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
	store      string // the column's title
	kind       string // the table row it belongs to (a goal* constant)
	met        bool
	measured   string
}

// Kinds of goals, by the table row that shows them.
const (
	goalS2C      = "start-to-child"
	goalExit     = "exec-to-exit"
	goalPss      = "memory per instance"
	goalWatchdog = "watchdog memory"
	goalPssRef   = "memory beside etcdctl lock"
	goalPool     = "pool of holders"
	goalLoss     = "loss reaction"
	goalHandover = "graceful handover"
	goalCrash    = "crash failover"
	goalCrashOld = "old child after kill -9"
	goalIdle     = "idle follower"
	goalSecond   = "second waiter"
	goalHerd     = "followers woken"
	goalHerdHO   = "handover with the herd"
)

// goals judges every goal of the issues on leaderrun's figures, store by
// store.
func (r *results) goals() []goalMet {
	var out []goalMet
	for _, col := range storeColumns {
		tl, ref := col.lr, col.ref
		add := func(kind, goal string, met bool, measured string) {
			out = append(out, goalMet{name: kind + ", " + tl.name, goal: goal, store: col.title, kind: kind, met: met, measured: measured})
		}
		if ref != nil && col.s2cRatio > 0 {
			l, e := r.p50(r.s2c, tl.id), r.p50(r.s2c, ref.id)
			add(goalS2C, fmt.Sprintf("p50 ≤ %.1f× %s", col.s2cRatio, ref.name), l >= 0 && e > 0 && float64(l) <= col.s2cRatio*float64(e),
				fmt.Sprintf("%s vs %s: %s", fmtDur(l), fmtDur(e), ratio(l, e)))
		}
		if ref != nil && col.exitRatio > 0 {
			l, e := r.p50(r.exit, tl.id), r.p50(r.exit, ref.id)
			add(goalExit, fmt.Sprintf("p50 ≤ %.1f× %s", col.exitRatio, ref.name), l >= 0 && e > 0 && float64(l) <= col.exitRatio*float64(e),
				fmt.Sprintf("%s vs %s: %s", fmtDur(l), fmtDur(e), ratio(l, e)))
		}
		for _, g := range r.pssGoals(col) {
			add(g.kind, g.goal, g.met, g.measured)
		}
		if !col.latency {
			continue
		}
		p99 := time.Duration(-1)
		if s := r.loss[tl.id]; s != nil && s.never == 0 {
			p99 = percentile(s.vals, .99)
		}
		add(goalLoss, "p99 < 50 ms", p99 >= 0 && p99 < 50*time.Millisecond, "p99 "+fmtDur(p99))
		p50 := r.p50(r.handover, tl.id)
		add(goalHandover, "p50 < 50 ms", p50 >= 0 && p50 < 50*time.Millisecond, "p50 "+fmtDur(p50))
		mx := r.pmax(r.crash, tl.id)
		never := r.crash[tl.id] != nil && r.crash[tl.id].never > 0
		add(goalCrash, fmt.Sprintf("max ≤ %s = %s", col.crashGoalText, fmtDur(col.crashGoal)), mx >= 0 && !never && mx <= col.crashGoal,
			fmt.Sprintf("max %s (%d trials)", fmtDur(mx), r.crash[tl.id].runs()))
		c := r.crashOld[tl.id]
		add(goalCrashOld, "the child gone within 1 s, every trial", c.trials > 0 && len(c.died) == c.trials && c.overlap == 0,
			c.String())
		if cost := r.cost[tl.id]; cost != nil {
			for _, g := range followerGoals(col, cost) {
				add(g.kind, g.goal, g.met, g.measured)
			}
		}
		if h := r.herd[col.name]; h != nil && len(h.changes) > 0 {
			woken := h.medianWoken()
			if col.herdWoken > 0 {
				add(goalHerd, fmt.Sprintf("median ≤ %d of %d", col.herdWoken, h.followers), woken <= col.herdWoken,
					fmt.Sprintf("median %d of %d", woken, h.followers))
			}
			if col.herdHandover > 0 {
				p50 := percentile(h.handover.vals, .5)
				add(goalHerdHO, fmt.Sprintf("p50 < %s with %d followers", fmtDur(col.herdHandover), h.followers),
					p50 >= 0 && p50 < col.herdHandover, "p50 "+fmtDur(p50))
			}
		}
	}
	return append(out, r.poolGoals()...)
}

// followerGoals judge what idle followers send. A follower with a
// session or lease of its own (etcd, Consul, ZooKeeper) sends keep-alives
// of it and blocking queries or watches, nothing else; one without
// (Kubernetes) only watches. A PostgreSQL follower tries once when the
// holder's lease would expire, a statement per lease duration (it sleeps
// until then: expiry sends no notification); a MySQL follower is held to
// the same budget (its first in line reads the row about twice per lease
// duration, docs/backends/mysql.md says). On Consul the leader's
// renewals write nothing a waiter watches: the first in line (on the lock
// key) and the second (on the first's queue entry) must each stay at or
// under 0.1 blocking queries/s.
func followerGoals(col *storeColumn, c *costRes) []goalMet {
	var out []goalMet
	by := c.first.byClass()
	switch col.name {
	case "postgres", "mysql":
		// One acquire per lease duration, and what the window's edges
		// can add: one more.
		budget := 1/col.tm.lease.Seconds() + 1/c.followersOver.Seconds()
		out = append(out, goalMet{kind: goalIdle, goal: fmt.Sprintf("≤ 1 statement per lease duration (≤ %.2f/s over %v)", budget, c.followersOver.Round(time.Second)),
			met:      by[classOther]+by[classKeepalive] <= budget+1e-9,
			measured: fmt.Sprintf("%.2f statements/s (%s)", by[classOther]+by[classKeepalive], fmtRates(c.first))})
	case "kubernetes":
		out = append(out, goalMet{kind: goalIdle, goal: "watches only", met: by[classOther]+by[classKeepalive] < 0.01,
			measured: fmt.Sprintf("%.2f other req/s", by[classOther]+by[classKeepalive])})
	default:
		out = append(out, goalMet{kind: goalIdle, goal: "keep-alives and watches/blocking queries only", met: by[classOther] < 0.01,
			measured: fmt.Sprintf("%.2f other req/s", by[classOther])})
	}
	if col.name == "consul" {
		out = append(out, goalMet{kind: goalIdle, goal: "first in line: blocking queries ≤ 0.1/s",
			met: by[classBlocking] <= 0.1, measured: fmt.Sprintf("%.2f blocking/s", by[classBlocking])})
		sb := c.second.byClass()
		out = append(out, goalMet{kind: goalSecond, goal: "blocking queries ≤ 0.1/s, nothing but keep-alives besides", met: c.second != nil && sb[classBlocking] <= 0.1 && sb[classOther] < 0.01,
			measured: fmt.Sprintf("%.2f blocking/s, %.2f other req/s", sb[classBlocking], sb[classOther])})
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
func costCell(c rates) string {
	if c == nil {
		return "not measured"
	}
	by := c.byClass()
	return fmt.Sprintf("%.2f (keep-alive %.2f, watch/blocking %.2f, other %.2f)", c.total(), by[classKeepalive], by[classBlocking], by[classOther])
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
	verdict := func(kinds ...string) (string, string) {
		var goals, parts []string
		for _, x := range g {
			if slices.Contains(kinds, x.kind) {
				goals = append(goals, x.store+": "+x.goal)
				parts = append(parts, fmt.Sprintf("%s %s (%s)", x.store, yesNo(x.met), x.measured))
			}
		}
		return strings.Join(dedupGoals(goals), "; "), strings.Join(parts, "; ")
	}
	row := func(name string, cell func(tl *tool) string, kinds ...string) {
		b.WriteString("| " + name + " |")
		for _, tl := range cols {
			b.WriteString(" " + cell(tl) + " |")
		}
		goal, met := verdict(kinds...)
		b.WriteString(" " + goal + " | " + met + " |\n")
	}
	notRun := func(f func(tl *tool) string) func(tl *tool) string {
		return func(tl *tool) string {
			if !column(tl).latency {
				return "not run"
			}
			return f(tl)
		}
	}
	row(fmt.Sprintf("start-to-child, free lock, p50 / p90 (%d runs)", r.runs), func(tl *tool) string {
		s := r.s2c[tl.id].pair(.9)
		if tl.elector {
			s += " (to OnStartedLeading)"
		}
		return s
	}, goalS2C)
	row("exec-to-exit, free lock, child exits at once, p50 / p90", func(tl *tool) string {
		if tl.elector {
			return "– (runs no command)"
		}
		return r.exit[tl.id].pair(.9)
	}, goalExit)
	ns := make([]string, len(pssCounts))
	for i, n := range pssCounts {
		ns[i] = strconv.Itoa(n)
	}
	lo, hi := pssCounts[0], pssCounts[len(pssCounts)-1]
	row(fmt.Sprintf("Pss of %s leaders, summed, wrapper + watchdog", strings.Join(ns, " / ")), func(tl *tool) string { return r.pssCell(tl, memSum.pss) })
	row(fmt.Sprintf("Private of %s leaders, summed, wrapper + watchdog", strings.Join(ns, " / ")), func(tl *tool) string { return r.pssCell(tl, memSum.private) })
	row(fmt.Sprintf("one more leader (marginal, %d→%d): Pss wrapper + watchdog / Private / Pss wrapper alone", lo, hi), func(tl *tool) string {
		rec, ok := r.pss[tl.id]
		if !ok {
			return "not run"
		}
		all, okAll := rec.marginal(memSum.pss)
		priv, okPriv := rec.marginal(memSum.private)
		alone, okAlone := rec.marginal(func(m memSum) int { return m.wrapperPss })
		return fmt.Sprintf("%s / %s / %s", marginalText(all, okAll), marginalText(priv, okPriv), marginalText(alone, okAlone))
	}, goalPss, goalPssRef)
	row(fmt.Sprintf("watchdog: marginal Pss; its own Pss at %d leaders, each", hi), func(tl *tool) string {
		rec, ok := r.pss[tl.id]
		if !ok {
			return "not run"
		}
		m := rec[hi]
		if m.watchdogs == 0 {
			return "none"
		}
		w, okW := rec.marginal(func(m memSum) int { return m.watchdogPss })
		return fmt.Sprintf("%s; %s", marginalText(w, okW), mib(m.watchdogPss/m.watchdogs))
	}, goalWatchdog)
	row("peak RSS while leading (VmHWM), wrapper + helpers (secondary: counts shared pages in full)", func(tl *tool) string {
		rec := r.rss[tl.id]
		if rec.wrapper == 0 {
			return "not measured"
		}
		return mib(rec.wrapper + rec.helpers)
	})
	row("binary size; package init p50, allocated by init", func(tl *tool) string {
		bin := "leaderrun"
		if !tl.leaderrun() {
			bin = map[string]string{"etcd": "etcdctl", "consul": "consul", "kubernetes": "k8selector"}[tl.store]
		}
		if r.initTotal[bin] == nil {
			return r.sizes()[bin] + "; not measured"
		}
		return fmt.Sprintf("%s; %s, %s", r.sizes()[bin], fmtDur(r.p50(r.initTotal, bin)), bytesText(int(r.p50(r.initBytes, bin))))
	})
	row("loss reaction (the store drops the holder → child signalled), p50 / p99", notRun(func(tl *tool) string { return r.loss[tl.id].pair(.99) }), goalLoss)
	row("graceful handover (SIGTERM to leader → follower's child), p50 / p90", notRun(func(tl *tool) string { return r.handover[tl.id].pair(.9) }), goalHandover)
	row("crash failover (kill -9 of the leading wrapper → follower's child), p50 / max", notRun(func(tl *tool) string { return r.crash[tl.id].pair(1) }), goalCrash)
	row("old child after kill -9 of its wrapper", notRun(func(tl *tool) string {
		if tl.elector {
			return "– (leads in process: dies with it)"
		}
		return r.crashOld[tl.id].String()
	}), goalCrashOld)
	cost := func(f func(c *costRes) string) func(tl *tool) string {
		return notRun(func(tl *tool) string {
			if c := r.cost[tl.id]; c != nil {
				return f(c)
			}
			return "not measured"
		})
	}
	row("store requests/s, one leader", cost(func(c *costRes) string { return costCell(c.leader) }))
	row("store requests/s, one idle follower (first in line)", cost(func(c *costRes) string { return costCell(c.first) }), goalIdle)
	row("store requests/s, a second idle waiter", cost(func(c *costRes) string {
		if !c.perProcess {
			return "not measured apart"
		}
		return costCell(c.second)
	}), goalSecond)
	herd := func(f func(h *herdRes) string) func(tl *tool) string {
		return notRun(func(tl *tool) string {
			if !tl.leaderrun() {
				return "not run"
			}
			h := r.herd[tl.store]
			if h == nil || len(h.changes) == 0 {
				return "not measured"
			}
			return f(h)
		})
	}
	n := 0
	for _, h := range r.herd {
		n = h.followers
	}
	row(fmt.Sprintf("%d followers: handover p50 / max (%d changes)", n, herdChanges), herd(func(h *herdRes) string { return h.handover.pair(1) }), goalHerdHO)
	row(fmt.Sprintf("%d followers: followers woken per change, median (all changes)", n), herd(func(h *herdRes) string {
		var w []string
		for _, c := range h.changes {
			w = append(w, strconv.Itoa(c.woken))
		}
		return fmt.Sprintf("%d (%s)", h.medianWoken(), strings.Join(w, ", "))
	}), goalHerd)
	return b.String()
}

// dedupGoals merges "Store: goal" entries with the same goal into
// "StoreA, StoreB: goal".
func dedupGoals(goals []string) []string {
	var order []string
	stores := map[string][]string{}
	for _, g := range goals {
		st, goal, _ := strings.Cut(g, ": ")
		if _, ok := stores[goal]; !ok {
			order = append(order, goal)
		}
		stores[goal] = append(stores[goal], st)
	}
	out := make([]string, len(order))
	for i, goal := range order {
		out[i] = strings.Join(stores[goal], ", ") + ": " + goal
	}
	return out
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
	case c.survived == 0 && len(c.died) == c.trials:
		return fmt.Sprintf("killed %s after (p50; %d of %d)", fmtDur(percentile(c.died, .5)), len(c.died), c.trials)
	}
	return fmt.Sprintf("survived in %d of %d; killed within 1 s in %d", c.survived, c.trials, len(c.died))
}

// markdown is docs/benchmarks.md.
func (r *results) markdown() string {
	var b strings.Builder
	m := r.machine
	b.WriteString("# Benchmarks: leaderrun on every store, beside `etcdctl lock`, `consul lock` and client-go's elector\n\n")
	fmt.Fprintf(&b, "Produced by `%s` on %s, in %v. Every figure below comes from that one run.\n\n",
		r.command, m.date, r.took.Round(time.Second))
	fmt.Fprintf(&b, "**Machine:** %d CPUs (%s), %s RAM, Linux %s, %s, %s. Load average (1, 5, 15 min) %s at the start and %s at the end (the end figure includes the benchmark's own 200-follower phases). Other engineers' test suites may run on this machine at any time, so absolute figures are noisy; the tools were alternated run by run so that the noise hit all alike.\n\n",
		m.cpus, m.cpu, m.mem, m.kernel, m.os, m.goV, m.loadBefore, m.loadAfter)
	fmt.Fprintf(&b, "Load average as each phase began: %s.\n\n", strings.Join(r.loads, "; "))
	fmt.Fprintf(&b, "**Versions:** %s; %s (server %s); %s; %s; %s; %s; %s. leaderrun is built as releases are (`CGO_ENABLED=0`, `-trimpath -ldflags='-s -w' -tags urfave_cli_no_docs`), without the race detector.\n\n",
		r.versions["leaderrun"], r.versions["etcdctl"], r.versions["etcd"], r.versions["consul"], r.versions["postgres"], r.versions["kube-apiserver"], r.versions["zookeeper"],
		r.versions["redis"])
	b.WriteString("**Stores**, all on 127.0.0.1, started by the benchmark; every tool of a store runs against the same server:\n\n")
	b.WriteString("- etcd: one member (`--heartbeat-interval 100 --election-timeout 1000`).\n")
	b.WriteString("- Consul: one dev agent.\n")
	fmt.Fprintf(&b, "- PostgreSQL: one throwaway cluster (`fsync=off`, `max_connections=%d`); leaderrun connects as the superuser, listening for notifications.\n", postgresMaxConnections)
	b.WriteString("- Kubernetes: one kube-apiserver with its own etcd, RBAC on; leaderrun as a user granted get, create, update and watch on leases in the benchmark's namespace, the client-go elector as one granted get, create and update.\n")
	b.WriteString("- ZooKeeper: one standalone server, tickTime 200 ms (session timeouts 0.4–60 s).\n")
	b.WriteString("- Redis: one redis-server with a password, `appendonly yes`, `appendfsync always` (every write on disk before it is acknowledged), as docs/backends/redis.md asks.\n")
	b.WriteString("- DynamoDB: the tests' emulator (`internal/testenv/ddbemu`: minidyn, in memory, over HTTP), its table created beforehand; start-to-child and memory only: an emulator's latencies say nothing of DynamoDB's.\n")
	b.WriteString("- Azure Blob Storage: one Azurite blob service (the tests' emulator), the benchmark's container created beforehand.\n")
	fmt.Fprintf(&b, "- MySQL: one MariaDB server (%s; `mariadb-install-db`, InnoDB, binary log off, `max_connections=%d`); leaderrun connects as root, the password in `MYSQL_PWD`.\n", r.versions["mariadb"], mysqlMaxConnections)
	fmt.Fprintf(&b, "- S3: one versitygw %s gateway (its posix backend on a temporary directory), the benchmark's bucket created beforehand; leaderrun hands the run to leaderrun-aws, which reaches it path-style with the gateway's root credentials from the environment.\n", testenv.VersityGWVersion)
	b.WriteString("- local: a state directory on the benchmark's file system.\n\n")
	b.WriteString("**Settings**, as the rest of the project runs each store (e2e/, faults/), and as close to each other as the tools allow:\n\n")
	for _, col := range storeColumns {
		fmt.Fprintf(&b, "- leaderrun on %s: %s", col.title, col.tm)
		switch col.name {
		case "etcd":
			fmt.Fprintf(&b, "; `etcdctl lock --ttl %s` (a 5 s lease for both).\n", etcdctlTTL)
		case "consul":
			fmt.Fprintf(&b, ", the lock-delay derived from the kill grace (%v; no `--consul-lock-delay`); `consul lock -shell=false` (so that it runs the child directly, as the others do), which has no flags for its session: TTL %v, Consul's default lock-delay %v, renewed every TTL/2.\n",
				consulLockDelay, consulLockTTL, consulLockLockDelay)
		case "kubernetes":
			fmt.Fprintf(&b, "; the client-go elector (`internal/testenv/k8selector`, client-go's `leaderelection` with `ReleaseOnCancel`) with LeaseDuration %v, RenewDeadline %v, RetryPeriod %v.\n",
				kubeTimings.lease, kubeTimings.deadline, kubeTimings.retry)
		default:
			b.WriteString(".\n")
		}
	}
	b.WriteString("- The same child for every tool: `bench/child`, a program of its own that links only the standard library and x/sys/unix, built as releases are; it reads `CLOCK_MONOTONIC` first thing, reports it on a unix socket, and in hold mode reports the time it receives SIGTERM/SIGINT. The client-go elector runs no child: its events (OnStartedLeading, the end of its leading context, OnNewLeader) are read from its output, with their times.\n\n")

	b.WriteString("## Results\n\n")
	b.WriteString(r.table())
	fmt.Fprintf(&b, "\nPercentiles are nearest-rank: with this run's %d runs p90 is the %s smallest; under 100 runs p99 is the largest (loss reaction and graceful handover: %d trials per tool in this run). ",
		r.runs, ordinal(nearestRank(0.9, r.runs)), latencyRuns(r.runs))
	b.WriteString("\"never\": the awaited event did not come within the bound (5 s; the client-go elector's loss reaction: lease + 5 s); a tool that missed its first 3 runs that way was not run again for that figure. \"not run\": the figure does not apply (the local backend has one host and no store to measure; the herd is leaderrun's).\n\n")
	b.WriteString("![Latency distributions](benchmarks.svg)\n\n")

	b.WriteString("## Goals\n\n| store | goal | target | measured | met |\n|---|---|---|---|---|\n")
	for _, g := range r.goals() {
		fmt.Fprintf(&b, "| %s | %s | %s | %s | %s |\n", g.store, g.kind, g.goal, g.measured, yesNo(g.met))
	}
	b.WriteString("\n")
	b.WriteString(r.analysis())

	b.WriteString("\n## Details\n\n### What a start costs\n\n")
	b.WriteString("Exec to exit of `BINARY version` (the client-go elector: `-h`; the watchdog: leaderrun re-executed as its watchdog with no socket, which exits at its first check, once its packages are initialised: what it costs to become ready, bar the cgroup it then makes), and its peak RSS (getrusage): what a binary of that size costs to start before it does any work. The start-to-child figure of a wrapper includes at least its own start and the child's; leaderrun's includes the watchdog's start too where that outlasts the campaign it overlaps.\n\n| binary | size | p50 | p90 | peak RSS |\n|---|---|---|---|---|\n")
	for _, id := range []string{"leaderrun", "watchdog", "etcdctl", "consul", "k8selector", "child"} {
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

	b.WriteString("\nWhere leaderrun's start-to-child goes, p50 of each part, from the timestamps of its own log lines (`--log-format json`) against the wall clock at the fork:\n\n| part |")
	for _, col := range storeColumns {
		b.WriteString(" " + col.lr.name + " |")
	}
	b.WriteString("\n|---|" + strings.Repeat("---|", len(storeColumns)) + "\n")
	for _, seg := range segments {
		b.WriteString("| " + seg + " |")
		for _, col := range storeColumns {
			b.WriteString(" " + fmtDur(r.p50(r.segments, col.lr.id+"/"+seg)) + " |")
		}
		b.WriteString("\n")
	}
	b.WriteString(r.startupDetails())
	b.WriteString(r.pssDetails())
	b.WriteString(r.poolDetails())
	b.WriteString(r.costDetails())
	b.WriteString(r.herdDetails())

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

// costDetails is the store-cost section: requests by kind, per tool.
func (r *results) costDetails() string {
	var b strings.Builder
	b.WriteString("\n### Store cost\n\n")
	fmt.Fprintf(&b, "Requests per second by kind. Every tool ran at once, each on a lock of its own: the leader alone for a window, then with an idle follower (first in line) and, where the meter tells processes apart, a second waiter behind it, for another window of the same length (%v). How each store's requests are counted:\n\n", r.costWindow().Round(time.Second))
	seen := map[string]bool{}
	for _, tl := range latencyTools {
		c := r.cost[tl.id]
		if c == nil || seen[tl.store] {
			continue
		}
		seen[tl.store] = true
		fmt.Fprintf(&b, "- %s: %s.\n", column(tl).title, c.how)
	}
	b.WriteString("\n| tool | role | requests/s by kind |\n|---|---|---|\n")
	for _, tl := range latencyTools {
		c := r.cost[tl.id]
		if c == nil {
			continue
		}
		fmt.Fprintf(&b, "| %s | leader | %s |\n| %s | idle follower, first in line | %s |\n", tl.name, fmtRates(c.leader), tl.name, fmtRates(c.first))
		if c.perProcess {
			fmt.Fprintf(&b, "| %s | idle follower, second in line | %s |\n", tl.name, fmtRates(c.second))
		}
	}
	for _, tl := range []*tool{lrConsul, consulLock} {
		c := r.cost[tl.id]
		if c == nil {
			continue
		}
		for _, w := range []struct {
			role string
			d    []time.Duration
		}{{"first in line", c.firstBlocking}, {"second in line", c.secondBlocking}} {
			if len(w.d) == 0 {
				fmt.Fprintf(&b, "\n%s, idle follower %s: no blocking query ended in the window.\n", tl.name, w.role)
				continue
			}
			fmt.Fprintf(&b, "\n%s, idle follower %s: %d blocking queries ended in the window, lasting p50 %s (shortest %s, longest %s).\n",
				tl.name, w.role, len(w.d), fmtDur(percentile(w.d, .5)), fmtDur(percentile(w.d, 0)), fmtDur(percentile(w.d, 1)))
		}
	}
	b.WriteString("\nRequests (counts) for one whole run on a free lock: start, acquire, child that exits at once, release, exit.\n\n| tool | requests |\n|---|---|\n")
	for _, tl := range latencyTools {
		if c := r.cost[tl.id]; c != nil {
			fmt.Fprintf(&b, "| %s | %s |\n", tl.name, fmtCounts(c.oneRun))
		}
	}
	return b.String()
}

func (r *results) costWindow() time.Duration {
	for _, c := range r.cost {
		return c.followersOver
	}
	return 0
}

// herdDetails is the many-followers section, store by store.
func (r *results) herdDetails() string {
	var b strings.Builder
	for _, col := range storeColumns {
		h := r.herd[col.name]
		if h == nil {
			continue
		}
		fmt.Fprintf(&b, "\n### %d followers on one lock, %s\n\n", h.followers, col.lr.name)
		who := "all followers together"
		if !h.perProcess {
			who = "the whole server (the leader included)"
		}
		fmt.Fprintf(&b, "%d leaderrun processes waiting on one lock (each with its watchdog), and a leader. While idle for %v, %s sent (requests/s): %s; %d followers were woken (%d wake-ups).\n\n",
			h.followers, h.idleFor.Round(time.Second), who, fmtRates(h.idle), h.idleWoken, h.idleWakes)
		b.WriteString("Then leadership moved by SIGTERM to the leader, several times; each window runs from the SIGTERM to 2 s after the new leader's child started.\n\n")
		b.WriteString("| change | handover | followers woken (wake-ups) | followers' requests in the window (not keep-alives) |\n|---|---|---|---|\n")
		for i, c := range h.changes {
			fmt.Fprintf(&b, "| %d | %s | %d (%d) | %s |\n", i+1, fmtDur(c.handover), c.woken, c.wakes, fmtCounts(c.requests))
		}
		b.WriteString("\n" + herdHow[col.name] + "\n")
	}
	return b.String()
}

// herdHow says how each store's followers are woken and counted.
var herdHow = map[string]string{
	"etcd":       "etcd: followers woken = Range requests in the window − 1; wake-ups: watch responses sent. A waiting candidate watches only the key just ahead of it in the queue; when that key goes, it re-reads the queue once (a Range), and the new leader reads its own key once more before it starts its child.",
	"consul":     "Consul: counted at each follower's own proxy; a follower is woken when a blocking query of its returns because the index moved (not at the end of its wait). Waiters queue under `leaderrun/LOCK:queue/`; only the first in line watches the lock key, every other one the queue entry just ahead of it.",
	"postgres":   "PostgreSQL: counted in the server log by role (one per follower); a follower woken is one that sent a statement other than its listening connection's. A release sends one notification on the table's channel, and PostgreSQL delivers it to every listening connection: every waiter wakes and tries the row once; one wins.",
	"kubernetes": "Kubernetes: counted in the apiserver's audit log by source address (one per follower); a follower woken is one that sent a request other than a watch; wake-ups are the watch events the apiserver sent on leases, all watchers together. Every follower watches the one Lease object, and the apiserver sends every change of it (each renewal included) to every watcher.",
	"zookeeper":  "ZooKeeper: counted at each follower's own proxy, which reads ZooKeeper's framing; a follower is woken when the server sends it a watch event. Each candidate watches only the znode just below its own.",
	"redis":      "Redis: counted at each follower's own proxy, which reads the commands it sends and the pub/sub messages it is sent; a follower is woken when the server pushes it a message on its wake channel. Waiters queue in a sorted set, each subscribed to a channel of its own, and the release script publishes to the first waiter's channel alone; a waiter's acquire script, one per retry period, is its keep-alive and is not counted among the window's requests.",
	"azureblob":  "Azure Blob: counted at each follower's own HTTP proxy; a follower is woken when it sends an acquisition, since a waiter acts on a change only by trying to acquire. Every waiter reads the lock blob (HEAD) once per retry period; those whose read lands between the release and the first acquisition try.",
	"mysql":      "MySQL: counted at each follower's own proxy, which reads the MySQL protocol; a follower is woken when the server answers a GET_LOCK of its more than a quarter second before its timeout. Waiters queue on the queue's named lock; only the first in line waits on the holder's, so a change wakes it (it reads the row and takes over); it keeps the queue's named lock as the holder, so the next in line sleeps on.",
	"s3":         "S3: counted at each follower's own HTTP proxy; a follower is woken when it starts a grant, which reads the state object (the token's mark) first. Every waiter reads the lock object once per retry period; those whose read lands between the release and the first grant try.",
}

func toolName(id string) string {
	for _, tl := range append([]*tool{direct, consulLockShell}, wrappers...) {
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

func sortedKeys(r rates) []reqKey {
	keys := make([]reqKey, 0, len(r))
	for k := range r {
		keys = append(keys, k)
	}
	sort.Slice(keys, func(i, j int) bool {
		return r[keys[i]] > r[keys[j]] || r[keys[i]] == r[keys[j]] && keys[i].name < keys[j].name
	})
	return keys
}

func fmtRates(r rates) string {
	var parts []string
	for _, k := range sortedKeys(r) {
		if r[k] >= 0.005 {
			parts = append(parts, fmt.Sprintf("`%s` %.2f", k.name, r[k]))
		}
	}
	if len(parts) == 0 {
		return "none"
	}
	return strings.Join(parts, ", ")
}

func fmtCounts(r rates) string {
	var parts []string
	for _, k := range sortedKeys(r) {
		parts = append(parts, fmt.Sprintf("`%s` %.0f", k.name, r[k]))
	}
	if len(parts) == 0 {
		return "none"
	}
	return strings.Join(parts, ", ")
}

const method = `
## How it is measured

- **start-to-child**: from just before the fork of the wrapper to the child's first reading of the clock in ` + "`main`" + `, on a lock nobody holds; the child exits at once and the wrapper is waited for before the next run. Runs rotate through the tools (and the child alone), so each tool runs right after each other one equally often. The client-go elector: to its OnStartedLeading, after which it is sent SIGTERM.
- **memory as a host pays it**: see the details above: each tool alone on the machine, 1, 5 and 20 leaders of distinct locks, Pss and Private from ` + "`/proc/PID/smaps_rollup`" + ` summed over each wrapper's tree but the child's (the watchdog is the child's parent), the marginal instance between 1 and 20.
- **package init**: ` + "`GODEBUG=inittrace=1`" + ` of ` + "`BINARY version`" + ` (the watchdog: ` + "`leaderrun _leaderrun_watchdog`" + ` with the environment leaderrun gives it, which exits 64 at its first check, after its packages' init), the binaries alternated.
- **pool**: see the pool section above.
- **peak RSS** (secondary): every wrapper leads its own lock at once for 3 s, then VmHWM is read from /proc/PID/status, for the wrapper and for its descendants except the child (leaderrun's watchdog); the largest of 2 rounds. The helpers' figure is the sum of their VmHWM. After 300 renewals: 30 s of leadership renewing every 100 ms (Kubernetes with a 9 s lease: renewals under a second apart count a second less).
- **loss reaction**: the leader's child runs; the store drops the holder from outside (etcd: the holder's lease revoked; Consul: its session destroyed; PostgreSQL: its row deleted; Kubernetes: the Lease given to "operator"; ZooKeeper: its znode deleted). Measured from just before that request to the child's receipt of SIGTERM/SIGINT (client-go: the end of its leading context).
- **graceful handover**: a leader, and a follower that the store shows waiting (its key, session, znode, listening connection or watch exists; the client-go elector: it reported the leader; then 300 ms to settle); SIGTERM to the leader's wrapper process; measured to the follower's child start.
- **crash failover**: the same, with SIGKILL to the leader's wrapper process only; measured to the follower's child start. The old child is checked 1 s after the kill. Every store's trials ran at the same time, each on locks of its own, leaderrun's and the reference's of a round side by side: each waits out a lease, so the machine's noise does not matter there.
- **store cost** and **followers**: see the details above. No other process talked to the measured server, proxy or role during a window; the benchmark's own reads (etcd's and the apiserver's /metrics, the server log, the audit log) are not counted.
`

// ordinal spells n as "1st", "2nd", "27th".
func ordinal(n int) string {
	suffix := "th"
	if n%100 < 11 || n%100 > 13 {
		switch n % 10 {
		case 1:
			suffix = "st"
		case 2:
			suffix = "nd"
		case 3:
			suffix = "rd"
		}
	}
	return strconv.Itoa(n) + suffix
}
