package bench

import (
	"fmt"
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

	"github.com/leaderrun/leaderrun/internal/testenv"
)

// bench is one run of the benchmark: the servers, the binaries, the hub
// the children report to, and every process it started.
type bench struct {
	t      *testing.T
	runs   int
	window time.Duration // store-cost window
	herdN  int           // followers in the herd test

	lr, etcdctl, consul, elector, child string
	// stores are the servers of every store column, by name.
	stores map[string]store

	hub    *hub
	sock   string
	logDir string

	// compare are the columns of BENCH_COMPARE's leaderrun binaries, in
	// the start-up, start-to-child and memory phases.
	compare []*tool

	mu    sync.Mutex
	procs []*proc

	res *results
}

func envInt(name string, def int) int {
	if n, err := strconv.Atoi(os.Getenv(name)); err == nil && n > 0 {
		return n
	}
	return def
}

// TestBench is the benchmark. scripts/bench.sh runs it with BENCH=1,
// BENCH_RUNS (runs per latency figure, default 30), BENCH_OUT (where
// benchmarks.md and benchmarks.svg go) and BENCH_CMD (the command line to
// print in the report). scripts/startup.sh runs some phases only
// (BENCH_PHASES, a comma-separated list of phase names), and may add
// other leaderrun binaries side by side (BENCH_COMPARE=label=path,...).
func TestBench(t *testing.T) {
	if os.Getenv("BENCH") != "1" {
		t.Skip("the benchmark runs through scripts/bench.sh (BENCH=1 not set)")
	}
	if only := os.Getenv("BENCH_STORES"); only != "" {
		if err := selectStores(strings.Split(only, ",")); err != nil {
			t.Fatal(err)
		}
	}
	began := time.Now()
	loadBefore := loadavg()
	out := os.Getenv("BENCH_OUT")
	if out == "" {
		out = t.TempDir()
	}
	if err := os.MkdirAll(out, 0o755); err != nil {
		t.Fatal(err)
	}
	b := &bench{t: t, runs: envInt("BENCH_RUNS", 30), window: time.Duration(envInt("BENCH_COST_SECONDS", 30)) * time.Second,
		herdN: envInt("BENCH_FOLLOWERS", 200), logDir: t.TempDir()}
	b.res = newResults(b.runs)

	// Everything is built or found before anything is timed.
	benchT = t
	b.lr = testenv.Leaderrun(t)
	b.etcdctl = testenv.EtcdctlBinary(t)
	b.consul = testenv.ConsulBinary(t)
	b.elector = testenv.K8sElector(t)
	b.child = buildChild(t)
	b.res.bins = map[string]string{"leaderrun": b.lr, companionInit: filepath.Join(filepath.Dir(b.lr), companionInit), "etcdctl": b.etcdctl, "consul": b.consul, "k8selector": b.elector, "child": b.child, "watchdog": b.lr}
	for _, kv := range strings.Split(os.Getenv("BENCH_COMPARE"), ",") {
		label, path, ok := strings.Cut(strings.TrimSpace(kv), "=")
		if !ok {
			continue
		}
		if _, err := os.Stat(path); err != nil {
			t.Fatalf("BENCH_COMPARE: %v", err)
		}
		b.res.bins["leaderrun@"+label] = path
		b.res.compared = append(b.res.compared, "leaderrun@"+label)
		for _, col := range storeColumns {
			b.compare = append(b.compare, col.lr.comparison(label, path))
		}
	}

	b.stores = map[string]store{}
	for _, col := range storeColumns {
		at := time.Now()
		st := col.newStore()
		st.start(b)
		b.stores[col.name] = st
		t.Logf("%s started in %v", col.title, time.Since(at).Round(10*time.Millisecond))
	}
	b.res.versions = versions(b)
	// A short path: unix socket paths are limited to 108 bytes.
	sockDir, err := os.MkdirTemp("", "lrbench")
	if err != nil {
		t.Fatal(err)
	}
	b.sock = filepath.Join(sockDir, "hub.sock")
	if b.hub, err = newHub(b.sock); err != nil {
		t.Fatal(err)
	}
	// Cleanups run last-in first-out: processes go before the hub and the
	// servers.
	t.Cleanup(func() {
		b.hub.close()
		os.RemoveAll(sockDir)
	})
	t.Cleanup(b.killAll)

	phases := []struct {
		name string
		run  func()
	}{
		{"start-up of each binary", b.measureStartup},
		{"package init", b.measureInit},
		{"binary size", b.measureSize},
		{"start-to-child", b.measureStartToChild},
		{"RSS while leading", b.measureRSS},
		{"RSS after a long leadership", b.measureRSSLong},
		{"Pss per instance", b.measurePss},
		{"pool of holders", b.measurePool},
		{"loss reaction", b.measureLoss},
		{"graceful handover", b.measureHandover},
		{"crash failover", b.measureCrash},
		{"store cost", b.measureCost},
		{"herd of followers", b.measureHerd},
	}
	only := os.Getenv("BENCH_PHASES")
	for _, ph := range phases {
		if only != "" && !slices.Contains(strings.Split(only, ","), ph.name) {
			continue
		}
		at := time.Now()
		b.res.loads = append(b.res.loads, fmt.Sprintf("%s: %s", ph.name, loadavg()))
		ph.run()
		b.killAll()
		t.Logf("phase %q took %v", ph.name, time.Since(at).Round(100*time.Millisecond))
	}

	b.res.machine = describeMachine(loadBefore, loadavg(), began)
	b.res.command = os.Getenv("BENCH_CMD")
	if b.res.command == "" {
		b.res.command = "BENCH=1 go test -count=1 -timeout 0 -run '^TestBench$' -v ./bench/"
	}
	b.res.took = time.Since(began)
	fmt.Println()
	fmt.Print(b.res.table())
	// The must-show tables of the details, printed too (bench.sh prints
	// every table line of the test's output).
	for _, tbl := range []string{b.res.initTable(), b.res.pssTable(), b.res.poolTable()} {
		fmt.Println()
		fmt.Print(tbl)
	}
	if err := os.WriteFile(filepath.Join(out, "benchmarks.md"), []byte(b.res.markdown()), 0o644); err != nil {
		t.Error(err)
	}
	if err := os.WriteFile(filepath.Join(out, "benchmarks.svg"), []byte(b.res.plot()), 0o644); err != nil {
		t.Error(err)
	}
	// The figures of docs/choosing-a-store.md, when the report goes there.
	if page := filepath.Join(out, "choosing-a-store.md"); fileExists(page) {
		if err := writeFigures(page, b.res.figures()); err != nil {
			t.Error(err)
		}
	}
	t.Logf("report written to %s in %v", out, b.res.took.Round(time.Second))
}

// buildChild builds bench/child, the command every tool under test
// starts, as releases are built (testenv.ReleaseFlags, CGO_ENABLED=0).
func buildChild(t *testing.T) string {
	path := filepath.Join(t.TempDir(), "child")
	cmd := exec.Command("go", append(append([]string{"build"}, testenv.ReleaseFlags...), "-o", path, "./child")...)
	cmd.Env = append(os.Environ(), "CGO_ENABLED=0")
	if out, err := cmd.CombinedOutput(); err != nil {
		t.Fatalf("build bench/child: %v\n%s", err, out)
	}
	return path
}

func (b *bench) track(p *proc) {
	b.mu.Lock()
	defer b.mu.Unlock()
	b.procs = append(b.procs, p)
}

// killAll kills every process the benchmark started that still runs, and
// every child still alive (an orphan of a wrapper killed with -9 lives
// on), and forgets them.
func (b *bench) killAll() {
	b.mu.Lock()
	procs := b.procs
	b.procs = nil
	b.mu.Unlock()
	var wg sync.WaitGroup
	for _, p := range procs {
		if !p.exited() {
			wg.Add(1)
			go func() {
				defer wg.Done()
				p.kill()
			}()
		}
	}
	wg.Wait()
	for _, k := range b.hub.live() {
		_ = syscall.Kill(-k.pid, syscall.SIGKILL)
		_ = syscall.Kill(k.pid, syscall.SIGKILL)
	}
	b.hub.wait(5*time.Second, func() bool {
		for _, k := range b.hub.kids {
			if k.start != 0 && k.exit == 0 {
				return false
			}
		}
		return true
	})
}

// versions asks each binary for its version, for the report.
func versions(b *bench) map[string]string {
	first := func(argv ...string) string {
		out, _ := exec.Command(argv[0], argv[1:]...).CombinedOutput()
		line, _, _ := strings.Cut(strings.TrimSpace(string(out)), "\n")
		return line
	}
	return map[string]string{
		"leaderrun":      first(b.lr, "version"),
		"etcdctl":        first(b.etcdctl, "version"),
		"etcd":           first(testenv.EtcdBinary(b.t), "--version"),
		"consul":         first(b.consul, "version"),
		"postgres":       first(filepath.Join(testenv.PostgresBinDir(b.t), "postgres"), "--version"),
		"zookeeper":      zookeeperVersion(b),
		"kube-apiserver": first(testenv.KubeAPIServerBinary(b.t), "--version"),
		"redis":          first(testenv.RedisBinary(b.t), "--version"),
		"mariadb":        first(testenv.MariaDBBinary(b.t), "--version"),
	}
}

// zookeeperVersion asks the running server (srvr: "Zookeeper version: ...").
func zookeeperVersion(b *bench) string {
	zs, ok := b.stores["zookeeper"].(*zkStore)
	if !ok || zs.zk == nil {
		return ""
	}
	out, _ := zs.zk.Members[0].FourLetter("srvr")
	line, _, _ := strings.Cut(out, "\n")
	return strings.TrimSpace(line)
}

func loadavg() string {
	data, _ := os.ReadFile("/proc/loadavg")
	f := strings.Fields(string(data))
	if len(f) < 3 {
		return "unknown"
	}
	return strings.Join(f[:3], " ")
}

func fileExists(path string) bool {
	_, err := os.Stat(path)
	return err == nil
}
