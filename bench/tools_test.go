package bench

import (
	"fmt"
	"slices"
	"strings"
	"time"
)

// timings are one store's leaderrun timings, as the rest of the project
// (e2e, faults) runs that store.
type timings struct {
	lease, deadline, retry, grace time.Duration
	// defaults: leaderrun runs with no timing flags (the values above are
	// its defaults, for the report and the bounds).
	defaults bool
}

func (tm timings) args() []string {
	if tm.defaults {
		return nil
	}
	return []string{"--lease-duration", tm.lease.String(), "--renew-deadline", tm.deadline.String(),
		"--retry-period", tm.retry.String(), "--kill-grace", tm.grace.String()}
}

func (tm timings) String() string {
	s := fmt.Sprintf("lease %v, renew deadline %v, retry period %v, kill grace %v", tm.lease, tm.deadline, tm.retry, tm.grace)
	if tm.defaults {
		s += " (leaderrun's defaults: no timing flags)"
	}
	return s
}

// Timings of every store, as e2e/ and faults/ run it.
var (
	// etcd grants whole seconds; the fault suite's settings.
	etcdTimings = timings{lease: 5 * time.Second, deadline: 3 * time.Second, retry: 500 * time.Millisecond, grace: time.Second}
	// Consul: leaderrun's defaults, and with them the derived lock-delay
	// (--kill-grace + 1 s), as a user runs it; `consul lock` with its
	// own (15 s TTL, 15 s lock-delay, no flags for either).
	consulTimings   = timings{lease: 15 * time.Second, deadline: 10 * time.Second, retry: 2 * time.Second, grace: 3 * time.Second, defaults: true}
	consulLockDelay = consulTimings.grace + time.Second
	// consul lock's session: TTL 15 s, Consul's default lock-delay 15 s.
	consulLockTTL, consulLockLockDelay = 15 * time.Second, 15 * time.Second
	postgresTimings                    = timings{lease: 5 * time.Second, deadline: 3 * time.Second, retry: 500 * time.Millisecond, grace: time.Second}
	// Kubernetes writes whole seconds; renewals a second apart, so that a
	// client-go elector sees every one (faults/kubernetes_test.go).
	kubeTimings = timings{lease: 8 * time.Second, deadline: 5 * time.Second, retry: time.Second, grace: 2 * time.Second}
	// ZooKeeper on a tickTime-200 server (faults/zookeeper_test.go).
	zkTimings = timings{lease: 6 * time.Second, deadline: 4 * time.Second, retry: 500 * time.Millisecond, grace: time.Second}
	// Redis: the fault suite's settings, as PostgreSQL's.
	redisTimings = timings{lease: 5 * time.Second, deadline: 3 * time.Second, retry: 500 * time.Millisecond, grace: time.Second}
	localTimings = timings{lease: 15 * time.Second, deadline: 10 * time.Second, retry: 2 * time.Second, grace: 3 * time.Second, defaults: true}
	etcdctlTTL   = "5"
)

// tool is one way of running a command under a lock.
type tool struct {
	id    string // short, used in tags and lock names (lowercase: Kubernetes names)
	name  string // for tables
	store string // a storeColumn's name; "" for the baseline
	// argv runs the child under lock as the candidate tag, talking to the
	// store at addr (see store.addr).
	argv func(b *bench, lock, tag, addr string) []string
	env  []string
	// prefix is where the candidates' keys live (etcd); key is the key
	// the holder's session acquires (Consul); session reports whether a
	// Consul session name is one of this tool's candidates for lock.
	prefix  func(lock string) string
	key     func(lock string) string
	session func(name, lock string) bool
	// elector: the tool runs no child; it is a program that leads in
	// process and prints its events on standard output (the client-go
	// elector: "started", "stopped", "leader"), which the benchmark turns
	// into the events of a child (see bench.spawn).
	elector bool
	// lossBound is how long a loss trial waits for the tool to react;
	// zero: 5 s.
	lossBound time.Duration
	// bin is the leaderrun binary of a comparison column (BENCH_COMPARE);
	// empty: the one under test.
	bin string
}

func (tl *tool) leaderrun() bool { return strings.HasPrefix(tl.name, "leaderrun") }

// leaderrunOn is leaderrun on one store: its store flags for the address,
// and its timings.
func leaderrunOn(id, name, store string, storeArgs func(addr string) []string, tm timings) *tool {
	tl := &tool{id: id, name: name, store: store}
	tl.argv = func(b *bench, lock, tag, addr string) []string {
		bin := b.lr
		if tl.bin != "" {
			bin = tl.bin
		}
		return slices.Concat([]string{bin}, storeArgs(addr), []string{"--lock", lock, "--identity", tag, "--log-format", "json"},
			tm.args(), []string{"--", b.child})
	}
	return tl
}

// comparison is tl with another leaderrun binary, for BENCH_COMPARE.
func (tl *tool) comparison(label, bin string) *tool {
	c := *tl
	c.id, c.name, c.bin = tl.id+"-"+label, strings.Replace(tl.name, "leaderrun", "leaderrun@"+label, 1), bin
	argv := tl.argv
	c.argv = func(b *bench, lock, tag, addr string) []string {
		a := argv(b, lock, tag, addr)
		a[0] = bin
		return a
	}
	return &c
}

var (
	lrEtcd = func() *tool {
		tl := leaderrunOn("lre", "leaderrun (etcd)", "etcd", func(addr string) []string { return []string{"--etcd-endpoints", addr} }, etcdTimings)
		tl.prefix = func(lock string) string { return "leaderrun/" + lock + "/" }
		return tl
	}()
	etcdctlLock = &tool{id: "ecl", name: "etcdctl lock", store: "etcd",
		argv: func(b *bench, lock, tag, addr string) []string {
			return []string{b.etcdctl, "--endpoints", addr, "lock", "--ttl", etcdctlTTL, lock, b.child}
		},
		prefix: func(lock string) string { return lock + "/" },
	}
	lrConsul = func() *tool {
		tl := leaderrunOn("lrc", "leaderrun (Consul)", "consul", func(addr string) []string { return []string{"--consul-addr", addr} }, consulTimings)
		tl.key = func(lock string) string { return "leaderrun/" + lock }
		// The lock session, and the queue entry's (backends/consul).
		tl.session = func(name, lock string) bool {
			return name == "leaderrun leaderrun/"+lock || name == "leaderrun leaderrun/"+lock+":queue"
		}
		return tl
	}()
	// consulLock runs the child directly (-shell=false), like the other
	// tools. With its default, -shell, it runs `$SHELL -c COMMAND`, and a
	// shell that does not exec the command (dash here) gets the SIGTERM
	// meant for the command: consulLockShell checks that once.
	consulLock = &tool{id: "cnl", name: "consul lock", store: "consul",
		argv: func(b *bench, lock, tag, addr string) []string {
			return []string{b.consul, "lock", "-shell=false", "-http-addr", "http://" + addr, lock, b.child}
		},
		key:     func(lock string) string { return lock + "/.lock" },
		session: func(name, lock string) bool { return strings.HasSuffix(name, " at '"+lock+"'") },
	}
	consulLockShell = &tool{id: "cns", name: "consul lock (default -shell, SHELL=/bin/sh)", store: "consul",
		argv: func(b *bench, lock, tag, addr string) []string {
			return []string{b.consul, "lock", "-http-addr", "http://" + addr, lock, b.child}
		},
		env:     []string{"SHELL=/bin/sh"},
		key:     func(lock string) string { return lock + "/.lock" },
		session: func(name, lock string) bool { return strings.HasSuffix(name, " at '"+lock+"'") },
	}
	lrPostgres = leaderrunOn("lrp", "leaderrun (PostgreSQL)", "postgres", func(addr string) []string { return []string{"--postgres-url", addr} }, postgresTimings)
	lrKube     = leaderrunOn("lrk", "leaderrun (Kubernetes)", "kubernetes", func(addr string) []string { return []string{"--kubeconfig", addr} }, kubeTimings)
	// clientGo is client-go's LeaderElector (internal/testenv/k8selector)
	// on a Lease of the same name, with leaderrun's Kubernetes timings:
	// what a Kubernetes controller runs. It has no child: "child started"
	// is its OnStartedLeading, "signalled" the end of its leading context.
	clientGo = &tool{id: "cgo", name: "client-go elector", store: "kubernetes", elector: true,
		argv: func(b *bench, lock, tag, addr string) []string {
			return []string{b.elector, "-kubeconfig", addr, "-namespace", b.kube().ns, "-lock", lock, "-identity", tag,
				"-lease-duration", kubeTimings.lease.String(), "-renew-deadline", kubeTimings.deadline.String(),
				"-retry-period", kubeTimings.retry.String()}
		},
		// client-go sees another holder at its next renewal and gives up
		// leading once its renew deadline has passed.
		lossBound: kubeTimings.lease + 5*time.Second,
	}
	lrZK    = leaderrunOn("lrz", "leaderrun (ZooKeeper)", "zookeeper", func(addr string) []string { return []string{"--zk-servers", addr} }, zkTimings)
	lrRedis = leaderrunOn("lrr", "leaderrun (Redis)", "redis", func(addr string) []string { return []string{"--redis-url", addr} }, redisTimings)
	lrLocal = leaderrunOn("lrl", "leaderrun (local)", "local", func(addr string) []string { return []string{"--backend", "local", "--state-dir", addr} }, localTimings)
	// direct is no wrapper at all: the cost of starting the child itself.
	direct = &tool{id: "dir", name: "child alone (no lock)",
		argv: func(b *bench, lock, tag, addr string) []string { return []string{b.child} },
	}
)

// storeColumn is one store leaderrun is benchmarked on, beside the
// store's own CLI lock or the program its users would otherwise run: its
// tools, timings, goals and server. Adding a store to every phase is one
// entry here, its leaderrunOn tool above and its store (stores_test.go).
type storeColumn struct {
	name  string // the store's name, as --backend takes it
	title string // for the report
	lr    *tool
	// ref is the store's own CLI lock, or the program its users would
	// otherwise run; nil if none.
	ref *tool
	// s2cRatio and exitRatio bound leaderrun's start-to-child and
	// exec-to-exit p50 as a multiple of ref's; 0: no goal.
	s2cRatio, exitRatio float64
	tm                  timings
	// latency: the loss, handover, crash, store-cost and herd phases
	// apply (not to the local backend: one host, no store to measure).
	latency bool
	// crashGoal bounds leaderrun's crash failover (max), as its issue
	// words it (crashGoalText); crashBound is how long a trial waits for
	// the follower, for leaderrun and ref alike.
	crashGoal     time.Duration
	crashGoalText string
	crashBound    time.Duration
	crashTrials   int
	// herdWoken bounds the median followers woken per change of leader
	// with the herd, herdHandover its handover p50; 0: no goal.
	herdWoken    int
	herdHandover time.Duration
	// sessions: a candidate keeps a session or lease of its own alive
	// (keep-alives are expected of an idle follower); otherwise a
	// follower has nothing to renew.
	sessions bool
	// newStore makes the store's servers and probes for one run.
	newStore func() store
}

var storeColumns = []*storeColumn{
	{name: "etcd", title: "etcd", lr: lrEtcd, ref: etcdctlLock, s2cRatio: 1.0, exitRatio: 1.0, tm: etcdTimings, latency: true,
		crashGoal: etcdTimings.lease + 500*time.Millisecond, crashGoalText: "lease + 0.5 s",
		crashBound: etcdTimings.lease + 10*time.Second, crashTrials: 5, herdWoken: 1, sessions: true,
		newStore: func() store { return &etcdStore{} }},
	{name: "consul", title: "Consul", lr: lrConsul, ref: consulLock, s2cRatio: 0.3, tm: consulTimings, latency: true,
		crashGoal: consulTimings.lease + consulLockDelay + time.Second, crashGoalText: "lease + lock-delay + 1 s",
		// consul lock: Consul invalidates its session between TTL and
		// 2×TTL after the last renewal, then the lock-delay.
		crashBound: 2*consulLockTTL + consulLockLockDelay + 15*time.Second, crashTrials: 2,
		herdWoken: 2, herdHandover: 50 * time.Millisecond, sessions: true,
		newStore: func() store { return &consulStore{} }},
	{name: "postgres", title: "PostgreSQL", lr: lrPostgres, tm: postgresTimings, latency: true,
		crashGoal: postgresTimings.lease + postgresTimings.retry + 500*time.Millisecond, crashGoalText: "lease + retry period + 0.5 s",
		crashBound: postgresTimings.lease + 10*time.Second, crashTrials: 5,
		newStore: func() store { return &postgresStore{} }},
	{name: "kubernetes", title: "Kubernetes", lr: lrKube, ref: clientGo, tm: kubeTimings, latency: true,
		crashGoal: kubeTimings.lease + kubeTimings.retry + 500*time.Millisecond, crashGoalText: "lease + retry period + 0.5 s",
		crashBound: kubeTimings.lease + 10*time.Second, crashTrials: 5,
		newStore: func() store { return &kubeStore{} }},
	{name: "zookeeper", title: "ZooKeeper", lr: lrZK, tm: zkTimings, latency: true,
		// The negotiated session timeout is the lease asked (tick 200 ms:
		// 0.4 s to 60 s).
		crashGoal: zkTimings.lease + time.Second, crashGoalText: "session timeout + 1 s",
		crashBound: zkTimings.lease + 10*time.Second, crashTrials: 5, herdWoken: 1, sessions: true,
		newStore: func() store { return &zkStore{} }},
	{name: "redis", title: "Redis", lr: lrRedis, tm: redisTimings, latency: true,
		// The first waiter sleeps until the lease expires by the
		// server's clock: failover within the lease + 0.3 s.
		crashGoal: redisTimings.lease + 300*time.Millisecond, crashGoalText: "lease + 0.3 s",
		crashBound: redisTimings.lease + 10*time.Second, crashTrials: 5, herdWoken: 1, sessions: true,
		newStore: func() store { return &redisStore{} }},
	azureColumn,
	mysqlColumn,
	s3Column,
	{name: "dynamodb", title: "DynamoDB (emulator)", lr: lrDynamo, tm: ddbTimings,
		newStore: func() store { return &ddbStore{} }},
	{name: "local", title: "local", lr: lrLocal, tm: localTimings,
		newStore: func() store { return &localStore{} }},
}

// selectStores keeps only the store columns named (BENCH_STORES), for a
// run that proves a column or two: the tool lists follow. The phases
// that compare with a store left out (the pool of holders, on Consul)
// are left out with BENCH_PHASES.
func selectStores(names []string) error {
	var cols []*storeColumn
	for _, n := range names {
		i := slices.IndexFunc(storeColumns, func(c *storeColumn) bool { return c.name == n })
		if i < 0 {
			return fmt.Errorf("BENCH_STORES: no store column %q", n)
		}
		cols = append(cols, storeColumns[i])
	}
	storeColumns = cols
	wrappers, latencyTools, pssTools = toolsOf(storeColumns, false), toolsOf(storeColumns, true), pssToolsOf(storeColumns)
	return nil
}

// toolsOf are the wrappers of cols, store by store: leaderrun, then the
// store's reference; latency: only the stores the loss, handover, crash
// and cost phases measure.
func toolsOf(cols []*storeColumn, latency bool) []*tool {
	var w []*tool
	for _, col := range cols {
		if latency && !col.latency {
			continue
		}
		w = append(w, col.lr)
		if col.ref != nil {
			w = append(w, col.ref)
		}
	}
	return w
}

// column is the store column of tl (nil for the baseline).
func column(tl *tool) *storeColumn {
	for _, col := range storeColumns {
		if col.name == tl.store {
			return col
		}
	}
	return nil
}

// wrappers are the tools under a lock, store by store: leaderrun, then
// the store's reference.
var wrappers = toolsOf(storeColumns, false)

// latencyTools are the wrappers of the stores the loss, handover, crash
// and cost phases measure.
var latencyTools = toolsOf(storeColumns, true)

// start runs tl on lock as the candidate tag with addr.
func (b *bench) start(tl *tool, lock, tag, addr string, hold bool) (*proc, error) {
	p, err := b.spawn(tl, tl.argv(b, lock, tag, addr), tag, hold)
	if p != nil {
		p.addr = addr
	}
	return p, err
}

// waitCandidates waits until the store shows n candidates of tl for lock
// (procs are the candidates' processes). A server in another process
// offers nothing to wait on but its API, so this polls, every 20 ms,
// outside every timed window.
func (b *bench) waitCandidates(tl *tool, lock string, procs []*proc, n int, timeout time.Duration) error {
	deadline := time.Now().Add(timeout)
	st := b.storeOf(tl)
	addr := ""
	if len(procs) > 0 {
		addr = procs[0].addr
	}
	for {
		var got int
		var err error
		if tl.elector {
			got = electorsFollowing(b, procs)
		} else {
			got, err = st.candidates(tl, lock, addr, procs)
		}
		if err == nil && got >= n {
			return nil
		}
		if time.Now().After(deadline) {
			return fmt.Errorf("%s: %d of %d candidates for %s in the store after %v (last error: %v)", tl.name, got, n, lock, timeout, err)
		}
		time.Sleep(20 * time.Millisecond)
	}
}

// electorsFollowing counts the electors among procs that know the
// leader (OnNewLeader) or lead: they read the Lease and wait.
func electorsFollowing(b *bench, procs []*proc) int {
	n := 0
	for _, p := range procs {
		if k, ok := b.hub.get(p.tag); ok && (k.leader != 0 || k.start != 0) {
			n++
		}
	}
	return n
}
