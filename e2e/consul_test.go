//go:build linux

package e2e

import (
	"encoding/json"
	"fmt"
	"io"
	"log"
	"net"
	"net/http"
	"net/http/httptest"
	"net/http/httputil"
	"net/url"
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

	"github.com/hashicorp/consul/api"

	"github.com/leaderrun/leaderrun/internal/testenv"
)

// Timings of a fast Consul run. A Consul session TTL is at least 10 s;
// 10 s > 6 s + 1 s keeps the child dead before the lease can expire.
const (
	consulTTL    = 10 * time.Second
	consulPrefix = "leaderrun/"
)

// consulStore is Consul in the scenarios' matrix: one dev agent (state in
// memory), sessions with the shortest TTL Consul allows and no
// lock-delay: safety does not rest on it (docs/safety.md), and
// TestConsulCrashFailover covers the derived one.
func consulStore() *store {
	return &store{
		name: "consul", start: startConsulStore,
		timings:  timings{lease: consulTTL, deadline: 6 * time.Second, retry: time.Second, grace: time.Second},
		runFlags: []string{"--consul-lock-delay", "0s"},
		// The first waiter, which has seen no renewal for a lease, takes
		// over; waiters block on the key and are told of a release at once.
		takeover: consulTTL + time.Second, handover: 300 * time.Millisecond,
		notice: 100 * time.Millisecond,
		// Consul invalidates a session between TTL and 2 × TTL after its
		// last renewal; the holder's TTL check goes critical a TTL after
		// its last pass, which invalidates it at once.
		statusBound: 2*consulTTL + 5*time.Second,
		expires:     true, waiters: true, ttl: true,
		credentials: []string{"CONSUL_HTTP_TOKEN", "CONSUL_HTTP_AUTH"},
		kept:        []string{"DATABASE_URL=postgres://job@db/app", "PGHOST=db", "KUBECONFIG=/job/kubeconfig"},
	}
}

func startConsulStore(t *testing.T) *target {
	agent := testenv.StartConsul(t, testenv.ConsulOptions{})
	c := consulClient(t, agent.Addr())
	flags := []string{"--consul-addr", agent.Addr()}
	return &target{
		flags: flags, waiting: statusWaiting(flags, nil), key: keyUnder(consulPrefix + "%s"),
		link: agent.Addr(),
		via:  func(addr string) ([]string, []string) { return []string{"--consul-addr", addr}, nil },
		losses: []loss{{name: "SessionDestroyed", do: func(t *testing.T, e *env, lock string) time.Time {
			session := consulHolder(t, c, lock)
			sent := time.Now()
			if _, err := c.Session().Destroy(session, nil); err != nil {
				t.Fatal(err)
			}
			return sent
		}}},
		// Consul's LockIndex starts again at 1 when the key is deleted
		// and created again; the token (the ModifyIndex) does not.
		wipe: func(t *testing.T, lock string) {
			if _, err := c.KV().Delete(consulPrefix+lock, nil); err != nil {
				t.Fatalf("delete the lock key: %v", err)
			}
		},
		loseCommand: func(t *testing.T, lock string) string {
			u := "http://" + agent.Addr() + "/v1"
			return fmt.Sprintf(`s=$(curl -fsS %s/kv/%s%s | tr -d ' \n' | sed -n 's/.*"Session":"\([^"]*\)".*/\1/p') && curl -fsS -o /dev/null -X PUT %s/session/destroy/"$s"`,
				u, consulPrefix, lock, u)
		},
		record: func(t *testing.T, lock string) string {
			return fmt.Sprintf("held by %s, %d sessions", consulHolder(t, c, lock), consulCandidates(t, c, lock))
		},
		stopServer:  func(testing.TB) { agent.Stop() },
		startServer: func(testing.TB) { agent.Start() },
	}
}

// consulArgs are the flags of a Consul run with the shortest TTL Consul
// allows and no lock-delay, then extra.
func consulArgs(addr, lock, id string, extra ...string) []string {
	return append([]string{"--consul-addr", addr, "--lock", lock, "--identity", id,
		"--lease-duration", consulTTL.String(), "--renew-deadline", "6s", "--retry-period", "1s",
		"--kill-grace", "1s", "--consul-lock-delay", "0s"}, extra...)
}

// consulRun is consulArgs followed by the recording child.
func consulRun(t *testing.T, addr, lock, id string, extra ...string) []string {
	return append(append(consulArgs(addr, lock, id, extra...), "--"), childArgv(t)...)
}

// consulClient is a client of the agent at addr, playing the operator.
func consulClient(t *testing.T, addr string) *api.Client {
	t.Helper()
	cfg := api.DefaultConfig()
	cfg.Address = addr
	c, err := api.NewClient(cfg)
	if err != nil {
		t.Fatal(err)
	}
	return c
}

// consulHolder returns the session holding lock, or "".
func consulHolder(t *testing.T, c *api.Client, lock string) string {
	t.Helper()
	pair, _, err := c.KV().Get(consulPrefix+lock, nil)
	if err != nil {
		t.Fatalf("read %s: %v", consulPrefix+lock, err)
	}
	if pair == nil {
		return ""
	}
	return pair.Session
}

// consulCandidates counts the sessions leaderrun created for lock: its
// holder's and its waiters'.
func consulCandidates(t *testing.T, c *api.Client, lock string) int {
	t.Helper()
	sessions, _, err := c.Session().List(nil)
	if err != nil {
		t.Fatalf("list sessions: %v", err)
	}
	n := 0
	for _, s := range sessions {
		if s.Name == "leaderrun "+consulPrefix+lock {
			n++
		}
	}
	return n
}

// consulFirst returns the first event of kind from identity id ("": any).
func consulFirst(evs []event, kind, id string) (event, bool) {
	for _, e := range evs {
		if e.Kind == kind && (id == "" || e.ID == id) {
			return e, true
		}
	}
	return event{}, false
}

// consulSaw is a waitEvents condition: an event of kind from id was seen.
func consulSaw(kind, id string) func([]event) bool {
	return func(evs []event) bool { _, ok := consulFirst(evs, kind, id); return ok }
}

// consulTimedArgs are the flags of a Consul run with the given timing
// flags (none: leaderrun's defaults) and no --consul-lock-delay, so that
// the lock-delay is the derived one, then extra.
func consulTimedArgs(addr, lock, id string, timing []string, extra ...string) []string {
	args := append([]string{"--consul-addr", addr, "--lock", lock, "--identity", id}, timing...)
	return append(args, extra...)
}

// TestConsulCrashFailover: when the leading leaderrun is killed with
// SIGKILL, its child dies with it, and the follower first in line, which
// has seen no renewal for a lease, takes over: its child starts within
// lease + lock-delay + 1 s of the kill, the lock-delay being the derived
// --kill-grace + 1 s. Once with short timings, once with the defaults.
func TestConsulCrashFailover(t *testing.T) {
	t.Parallel()
	agent := testenv.StartConsul(t, testenv.ConsulOptions{})
	c := consulClient(t, agent.Addr())
	cases := []struct {
		name                    string
		timing                  []string
		lease, grace, lockDelay time.Duration
	}{
		{name: "lease 10s", timing: []string{"--lease-duration", "10s", "--renew-deadline", "6s", "--retry-period", "2s", "--kill-grace", "2s"},
			lease: 10 * time.Second, grace: 2 * time.Second, lockDelay: 3 * time.Second},
		{name: "defaults", lease: 15 * time.Second, grace: 3 * time.Second, lockDelay: 4 * time.Second},
	}
	trials := trials(t, 3)
	for _, tc := range cases {
		for i := range trials {
			t.Run(fmt.Sprintf("%s/%d", tc.name, i), func(t *testing.T) {
				t.Parallel()
				events := filepath.Join(t.TempDir(), "events")
				lock := fmt.Sprintf("crash-%s-%d", strings.ReplaceAll(tc.name, " ", ""), i)
				run := func(id string) *proc {
					args := append(append(consulTimedArgs(agent.Addr(), lock, id, tc.timing), "--"), childArgv(t)...)
					return start(t, childEnv(events, "forever"), args...)
				}
				leader := run("leader")
				evs := waitEvents(t, events, 10*time.Second, "the leader's child", consulSaw("start", "leader"))
				first, _ := consulFirst(evs, "start", "leader")
				info, _, err := c.Session().Info(consulHolder(t, c, lock), nil)
				if err != nil || info == nil {
					t.Fatalf("the leader's session: %v", err)
				}
				if info.LockDelay != tc.lockDelay {
					t.Errorf("the leader's session has lock-delay %v, want --kill-grace + 1s = %v", info.LockDelay, tc.lockDelay)
				}
				follower := run("follower")
				waitFor(t, 10*time.Second, "the follower to queue", func() bool { return consulWaiting(t, c, lock) == 1 })

				killed := time.Now()
				if err := syscall.Kill(leader.pid(), syscall.SIGKILL); err != nil {
					t.Fatal(err)
				}
				waitFor(t, 5*time.Second, "the leader's child to die", func() bool { return !alive(first.Pid) })
				childGone := time.Since(killed)
				if childGone > time.Second {
					t.Errorf("the leader's child died %v after leaderrun was killed, want within 1s", childGone)
				}
				limit := tc.lease + tc.lockDelay + time.Second
				evs = waitEvents(t, events, limit+10*time.Second, "the follower's child", consulSaw("start", "follower"))
				next, _ := consulFirst(evs, "start", "follower")
				failover := next.At.Sub(killed)
				if failover > limit {
					t.Errorf("follower's child started %v after the kill, want within lease + lock-delay + 1s = %v", failover, limit)
				}
				if failover < tc.lease {
					t.Errorf("follower's child started %v after the kill, within the lease of %v", failover, tc.lease)
				}
				if next.Token <= first.Token {
					t.Errorf("follower's token %d not greater than %d", next.Token, first.Token)
				}
				t.Logf("kill -9, lease %v, lock-delay %v (derived): leader's child gone after %v; follower's child started after %v (bound %v)",
					tc.lease, tc.lockDelay, childGone.Round(time.Millisecond), failover.Round(time.Millisecond), limit)
				follower.signal(syscall.SIGTERM)
				follower.wait(10 * time.Second)
			})
		}
	}
}

// consulWaiting counts the live entries of lock's queue of waiters.
func consulWaiting(t *testing.T, c *api.Client, lock string) int {
	t.Helper()
	pairs, _, err := c.KV().List(consulPrefix+lock+":queue/", nil)
	if err != nil {
		t.Fatalf("list the queue of %s: %v", lock, err)
	}
	n := 0
	for _, p := range pairs {
		if p.Session != "" {
			n++
		}
	}
	return n
}

// TestConsulReleaseMeetsNoLockDelay: with Consul's default lock-delay of
// 15 s, a release on SIGTERM still hands the lock over at once: the
// lock-delay applies to a session invalidated, not to a key released.
// While the follower holds, status names the agent's node.
func TestConsulReleaseMeetsNoLockDelay(t *testing.T) {
	t.Parallel()
	agent := testenv.StartConsul(t, testenv.ConsulOptions{})
	c := consulClient(t, agent.Addr())
	var gaps, stores []time.Duration
	for i := range trials(t, 3) {
		events := filepath.Join(t.TempDir(), "events")
		lock := fmt.Sprintf("sigterm-%d", i)
		flags := []string{"--consul-lock-delay", "15s"}
		leader := start(t, childEnv(events, "forever"), consulRun(t, agent.Addr(), lock, "leader", flags...)...)
		waitEvents(t, events, 10*time.Second, "the leader's child", consulSaw("start", "leader"))
		follower := start(t, childEnv(events, "forever"), consulRun(t, agent.Addr(), lock, "follower", flags...)...)
		waitFor(t, 10*time.Second, "the follower to wait", func() bool { return consulCandidates(t, c, lock) == 2 })
		leader.signal(syscall.SIGTERM)
		if code := leader.wait(10 * time.Second); code != 0 {
			t.Errorf("trial %d: leader exited %d after SIGTERM, want its child's 0", i, code)
		}
		evs := waitEvents(t, events, 5*time.Second, "the follower's child", consulSaw("start", "follower"))
		checkExclusive(t, evs)
		exit, _ := consulFirst(evs, "exit", "leader")
		next, _ := consulFirst(evs, "start", "follower")
		gap := next.At.Sub(exit.At)
		gaps = append(gaps, gap)
		// A release that met the lock-delay would take 15 s: one trial
		// slowed by a busy machine (a child's start has taken 3 s under
		// CI's load) must not read as one.
		if gap > 5*time.Second {
			t.Errorf("trial %d: follower's child started %v after the leader's child exited, want within 5s (a release meets no lock-delay of 15s)", i, gap)
		}
		if i == 0 {
			st, code := statusOf(t, nil, "--consul-addr", agent.Addr(), "--lock", lock)
			var node struct {
				Node string `json:"node"`
			}
			out, _ := outputEnv(t, nil, "status", "--json", "--consul-addr", agent.Addr(), "--lock", lock)
			if err := json.Unmarshal([]byte(out), &node); err != nil {
				t.Fatalf("status --json printed %q: %v", out, err)
			}
			if code != 0 || st.Identity != "follower" || st.Token != next.Token || node.Node != agent.Node() {
				t.Errorf("status --json: exit %d, %+v, node %q; want held by follower with token %d on node %s",
					code, st, node.Node, next.Token, agent.Node())
			}
		}
		follower.signal(syscall.SIGTERM)
		follower.wait(10 * time.Second)
		released, ok1 := logLineTime(leader.stderr.String(), "leadership released")
		acquired, ok2 := logLineTime(follower.stderr.String(), "leadership acquired")
		if ok1 && ok2 {
			stores = append(stores, acquired.Sub(released))
		}
	}
	t.Logf("SIGTERM handover with a lock-delay of 15s, old child's exit → new child's start: %s", summary(gaps))
	t.Logf("of which Consul, leader's release logged → follower's grant logged (ms resolution): %s", summary(stores))
}

// TestConsulErrors: an unreachable agent or a refused token exits 69 with a
// message that names the address and never shows the token; bad Consul
// flags exit 64 naming the flag.
func TestConsulErrors(t *testing.T) {
	t.Parallel()
	const secret = "6f1c1d5e-not-for-logs"
	agent := testenv.StartConsul(t, testenv.ConsulOptions{ACLToken: "root-" + secret})
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	closed := l.Addr().String()
	l.Close()
	tokenFile := filepath.Join(t.TempDir(), "token")
	if err := os.WriteFile(tokenFile, []byte(secret+"\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	cases := []struct {
		name string
		env  []string
		args []string
		code int
		want []string
	}{
		// A waiting run retries an unreachable agent until its --wait ends.
		{name: "unreachable", args: consulArgs(closed, "x", "a", "--consul-token", secret, "--wait", "1s", "--", "true"),
			code: 69, want: []string{closed, "connection refused", "within --wait 1s"}},
		{name: "unreachable status", args: []string{"status", "--consul-addr", closed, "--lock", "x", "--consul-token", secret},
			code: 69, want: []string{closed}},
		{name: "token refused", args: consulArgs(agent.Addr(), "x", "a", "--consul-token", secret, "--", "true"),
			code: 69, want: []string{agent.Addr(), "403"}},
		{name: "token file refused", args: consulArgs(agent.Addr(), "x", "a", "--consul-token-file", tokenFile, "--", "true"),
			code: 69, want: []string{agent.Addr(), "403"}},
		{name: "token from env refused", env: []string{"CONSUL_HTTP_TOKEN=" + secret, "CONSUL_HTTP_ADDR=" + agent.Addr()},
			args: []string{"--lock", "x", "--lease-duration", "10s", "--renew-deadline", "6s", "--retry-period", "1s", "--kill-grace", "1s", "--", "true"},
			code: 69, want: []string{agent.Addr(), "403"}},
		{name: "missing token file", args: consulArgs(agent.Addr(), "x", "a", "--consul-token-file", tokenFile+".missing", "--", "true"),
			code: 64, want: []string{"--consul-token-file"}},
		{name: "ttl too short", args: consulArgs(agent.Addr(), "x", "a", "--lease-duration", "9s", "--renew-deadline", "5s", "--", "true"),
			code: 64, want: []string{"--lease-duration 9s", "10s"}},
		{name: "ttl too long", args: consulArgs(agent.Addr(), "x", "a", "--lease-duration", "25h", "--", "true"),
			code: 64, want: []string{"--lease-duration 25h", "24h"}},
		{name: "lock-delay too long", args: consulArgs(agent.Addr(), "x", "a", "--consul-lock-delay", "61s", "--", "true"),
			code: 64, want: []string{"--consul-lock-delay 1m1s"}},
		{name: "negative lock-delay", args: consulArgs(agent.Addr(), "x", "a", "--consul-lock-delay", "-1s", "--", "true"),
			code: 64, want: []string{"--consul-lock-delay -1s"}},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			p := start(t, tc.env, tc.args...)
			code := p.wait(20 * time.Second)
			out := p.stderr.String()
			if code != tc.code {
				t.Errorf("exit %d, want %d\n%s", code, tc.code, out)
			}
			for _, w := range tc.want {
				if !strings.Contains(out, w) {
					t.Errorf("output does not say %q:\n%s", w, out)
				}
			}
			if strings.Contains(out, secret) {
				t.Errorf("output shows the token:\n%s", out)
			}
		})
	}
	// The management token works, so the refusals above were about the token.
	ok := start(t, []string{"CONSUL_HTTP_TOKEN=root-" + secret}, consulArgs(agent.Addr(), "x", "a", "--", "true")...)
	if code := ok.wait(20 * time.Second); code != 0 {
		t.Errorf("with the management token: exit %d\n%s", code, ok.stderr.String())
	}
}

// TestConsulBench compares leaderrun with `consul lock` on the same agent:
// the time from starting the tool to its child's start with a free lock,
// and the memory (RSS) the tool's processes take while leading, the child
// excluded. Both run the same child; runs alternate, 20 of each unless
// E2E_TRIALS says otherwise. leaderrun is built without the race
// detector, as shipped. Run with E2E_BENCH=1.
func TestConsulBench(t *testing.T) {
	if os.Getenv("E2E_BENCH") != "1" {
		t.Skip("benchmark: set E2E_BENCH=1")
	}
	agent := testenv.StartConsul(t, testenv.ConsulOptions{})
	bench := filepath.Join(t.TempDir(), "leaderrun-bench")
	build := exec.Command("go", "build", "-o", bench, ".")
	build.Dir = ".."
	if out, err := build.CombinedOutput(); err != nil {
		t.Fatalf("go build: %v\n%s", err, out)
	}
	consulBin := testenv.ConsulBinary(t)
	child := childArgv(t)
	tools := []struct {
		name string
		argv []string
	}{
		{"leaderrun", append([]string{bench, "--consul-addr", agent.Addr(), "--lock", "bench", "--"}, child...)},
		{"consul lock", append([]string{consulBin, "lock", "-http-addr=" + agent.Addr(), "-shell=false", "bench-consul-lock"}, child...)},
	}
	runs := trials(t, 20)
	latency := make([][]time.Duration, len(tools))
	rss := make([][]int, len(tools))
	mainRSS := make([][]int, len(tools))
	for i := range runs {
		for k := range tools {
			j := (i + k) % len(tools) // alternate which tool goes first
			lat, main, total := consulBenchRun(t, tools[j].argv)
			latency[j] = append(latency[j], lat)
			rss[j] = append(rss[j], total)
			mainRSS[j] = append(mainRSS[j], main)
		}
	}
	median := func(ds []time.Duration) time.Duration {
		s := slices.Clone(ds)
		slices.Sort(s)
		return s[len(s)/2]
	}
	medianKB := func(ns []int) int {
		s := slices.Clone(ns)
		slices.Sort(s)
		return s[len(s)/2]
	}
	for j, tool := range tools {
		t.Logf("%-11s start→child: %s; RSS while leading: median %d KiB (min %d, max %d), of which the main process %d KiB",
			tool.name, summary(latency[j]), medianKB(rss[j]), slices.Min(rss[j]), slices.Max(rss[j]), medianKB(mainRSS[j]))
	}
	t.Logf("ratio leaderrun / consul lock: start→child %.2f, RSS %.2f",
		float64(median(latency[0]))/float64(median(latency[1])), float64(medianKB(rss[0]))/float64(medianKB(rss[1])))
}

// consulBenchRun starts argv with the recording child, measures the time until
// the child starts and, half a second later, the RSS of argv's process
// alone and with its consulDescendants other than the child (leaderrun's
// watchdog); then stops it with SIGTERM.
func consulBenchRun(t *testing.T, argv []string) (latency time.Duration, mainKB, totalKB int) {
	t.Helper()
	events := filepath.Join(t.TempDir(), "events")
	cmd := exec.Command(argv[0], argv[1:]...)
	cmd.Env = append(os.Environ(), childEnv(events, "forever")...)
	cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true}
	began := time.Now()
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	done := make(chan struct{})
	go func() { defer close(done); _ = cmd.Wait() }()
	defer func() {
		_ = cmd.Process.Signal(syscall.SIGTERM)
		select {
		case <-done:
		case <-time.After(10 * time.Second):
			_ = syscall.Kill(-cmd.Process.Pid, syscall.SIGKILL)
			<-done
			t.Errorf("%s did not stop on SIGTERM", argv[0])
		}
	}()
	evs := waitEvents(t, events, 10*time.Second, "the child", consulSaw("start", ""))
	latency = evs[0].At.Sub(began)
	time.Sleep(500 * time.Millisecond) // let it settle into leading; a measurement interval, not synchronisation
	for _, pid := range consulDescendants(cmd.Process.Pid) {
		if pid != evs[0].Pid {
			totalKB += consulRSS(pid)
		}
	}
	return latency, consulRSS(cmd.Process.Pid), totalKB
}

// consulDescendants returns pid and every process below it.
func consulDescendants(pid int) []int {
	children := map[int][]int{}
	entries, _ := os.ReadDir("/proc")
	for _, e := range entries {
		p, err := strconv.Atoi(e.Name())
		if err != nil {
			continue
		}
		data, err := os.ReadFile(filepath.Join("/proc", e.Name(), "stat"))
		if err != nil {
			continue
		}
		// Fields after the command name in parentheses: state, ppid, ...
		rest := string(data[strings.LastIndexByte(string(data), ')')+2:])
		fields := strings.Fields(rest)
		if len(fields) > 1 {
			ppid, _ := strconv.Atoi(fields[1])
			children[ppid] = append(children[ppid], p)
		}
	}
	out := []int{pid}
	for i := 0; i < len(out); i++ {
		out = append(out, children[out[i]]...)
	}
	return out
}

// consulRSS is a process's resident set size in KiB, 0 if it is gone.
func consulRSS(pid int) int {
	data, err := os.ReadFile(filepath.Join("/proc", strconv.Itoa(pid), "status"))
	if err != nil {
		return 0
	}
	for _, line := range strings.Split(string(data), "\n") {
		if v, ok := strings.CutPrefix(line, "VmRSS:"); ok {
			n, _ := strconv.Atoi(strings.TrimSuffix(strings.TrimSpace(v), " kB"))
			return n
		}
	}
	return 0
}

// consulProxy is an HTTP proxy in front of the agent for one leaderrun,
// which records every request: what a process costs Consul, and when its
// blocking queries were answered by a change.
type consulProxy struct {
	srv  *httptest.Server
	mu   sync.Mutex
	reqs []consulRequest
}

// consulRequest is one request through a consulProxy. index is the
// request's ?index (0: not a blocking query), got the answer's
// X-Consul-Index; end is zero while it is open.
type consulRequest struct {
	method, path string
	query        string // "?" and the raw query, "" if none
	start, end   time.Time
	index, got   uint64
}

func (r consulRequest) blocking() bool { return r.method == "GET" && r.index > 0 }
func (r consulRequest) woke() bool     { return r.blocking() && r.got != 0 && r.got != r.index }

func newConsulProxy(t *testing.T, agent string) *consulProxy {
	t.Helper()
	target, err := url.Parse("http://" + agent)
	if err != nil {
		t.Fatal(err)
	}
	rp := httputil.NewSingleHostReverseProxy(target)
	rp.ErrorLog = log.New(io.Discard, "", 0)
	p := &consulProxy{}
	p.srv = httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		index, _ := strconv.ParseUint(r.URL.Query().Get("index"), 10, 64)
		p.mu.Lock()
		i := len(p.reqs)
		var query string
		if r.URL.RawQuery != "" {
			query = "?" + r.URL.RawQuery
		}
		p.reqs = append(p.reqs, consulRequest{method: r.Method, path: r.URL.Path, query: query, start: time.Now(), index: index})
		p.mu.Unlock()
		rp.ServeHTTP(w, r)
		got, _ := strconv.ParseUint(w.Header().Get("X-Consul-Index"), 10, 64)
		p.mu.Lock()
		p.reqs[i].end, p.reqs[i].got = time.Now(), got
		p.mu.Unlock()
	}))
	t.Cleanup(func() {
		p.srv.CloseClientConnections()
		p.srv.Close()
	})
	return p
}

func (p *consulProxy) addr() string { return strings.TrimPrefix(p.srv.URL, "http://") }

// answered returns the requests answered in [from, to).
func (p *consulProxy) answered(from, to time.Time) []consulRequest {
	p.mu.Lock()
	defer p.mu.Unlock()
	var out []consulRequest
	for _, r := range p.reqs {
		if !r.end.IsZero() && !r.end.Before(from) && r.end.Before(to) {
			out = append(out, r)
		}
	}
	return out
}

// sent describes the requests sent in [from, to), as "METHOD path?query".
func (p *consulProxy) sent(from, to time.Time) []string {
	p.mu.Lock()
	defer p.mu.Unlock()
	var out []string
	for _, r := range p.reqs {
		if !r.start.Before(from) && r.start.Before(to) {
			out = append(out, r.method+" "+r.path+r.query)
		}
	}
	return out
}

// blocked reports whether a blocking query on path ("": any) is open.
func (p *consulProxy) blocked(path string) bool {
	p.mu.Lock()
	defer p.mu.Unlock()
	for _, r := range p.reqs {
		if r.blocking() && r.end.IsZero() && (path == "" || r.path == path) {
			return true
		}
	}
	return false
}

// consulIssueTimings are the timings of issue 15's figures.
var consulIssueTimings = []string{"--lease-duration", "10s", "--renew-deadline", "6s", "--retry-period", "2s", "--kill-grace", "2s"}

// TestConsulIdleWaiters counts what two idle leaderrun waiters send their
// agent over a minute (E2E_IDLE_WINDOW) while the leader renews every 2 s.
// The leader's renewals write nothing the waiters watch (its session's
// renewal and its TTL check's pass): the first in line waits on the lock
// key, the second on the first's queue entry, and each sends at most 0.1
// blocking queries/s (`consul lock`'s waiters send 0.05/s), none of them
// ending early for nothing. Neither polls: besides, only its sessions'
// renewals and its check's passes, every TTL/2 for the first in line,
// every 5 minutes for the second (parked: nothing in a minute).
func TestConsulIdleWaiters(t *testing.T) {
	t.Parallel()
	agent := testenv.StartConsul(t, testenv.ConsulOptions{})
	c := consulClient(t, agent.Addr())
	window := time.Minute
	if s := os.Getenv("E2E_IDLE_WINDOW"); s != "" {
		d, err := time.ParseDuration(s)
		if err != nil {
			t.Fatalf("E2E_IDLE_WINDOW=%q: %v", s, err)
		}
		window = d
	}
	const lock = "idle"
	events := filepath.Join(t.TempDir(), "events")
	run := func(addr, id string) *proc {
		args := append(append(consulTimedArgs(addr, lock, id, consulIssueTimings), "--"), childArgv(t)...)
		return start(t, childEnv(events, "forever"), args...)
	}
	leader := run(agent.Addr(), "leader")
	waitEvents(t, events, 10*time.Second, "the leader's child", consulSaw("start", "leader"))
	proxies := []*consulProxy{newConsulProxy(t, agent.Addr()), newConsulProxy(t, agent.Addr())}
	var waiters []*proc
	for i, p := range proxies {
		waiters = append(waiters, run(p.addr(), fmt.Sprintf("waiter%d", i)))
		waitFor(t, 10*time.Second, "the waiter to queue", func() bool { return consulWaiting(t, c, lock) == i+1 })
	}
	waitFor(t, 10*time.Second, "the first waiter to watch the key", func() bool { return proxies[0].blocked("/v1/kv/" + consulPrefix + lock) })
	waitFor(t, 10*time.Second, "the second waiter to watch the first", func() bool { return proxies[1].blocked("") })
	begin := time.Now()
	time.Sleep(window) // the measurement interval, not synchronisation
	end := time.Now()
	secs := end.Sub(begin).Seconds()
	for i, p := range proxies {
		var blocking, woke, short, renewals, passes, other int
		for _, r := range p.answered(begin, end) {
			switch {
			case r.blocking():
				blocking++
				if r.woke() {
					woke++
				} else if r.end.Sub(r.start) < time.Second {
					short++
				}
			case r.method == "PUT" && strings.HasPrefix(r.path, "/v1/session/renew/"):
				renewals++
			case r.method == "PUT" && strings.HasPrefix(r.path, "/v1/agent/check/pass/"):
				passes++
			default:
				other++
			}
		}
		t.Logf("waiter %d over %v: blocking queries %.3f/s (%d, %d answered by a change, %d under 1s for nothing), session renewals %.3f/s, check passes %.3f/s, other %d",
			i, end.Sub(begin).Round(time.Millisecond), float64(blocking)/secs, blocking, woke, short, float64(renewals)/secs, float64(passes)/secs, other)
		if short > 0 || other > 0 {
			t.Errorf("waiter %d: %d blocking queries under 1s for nothing, %d other requests", i, short, other)
		}
		if float64(blocking)/secs > 0.1 {
			t.Errorf("waiter %d: %.3f blocking queries/s, want at most 0.1", i, float64(blocking)/secs)
		}
		// The first in line renews its lock and queue sessions at each
		// pass of its check; the second, parked, its queue session only.
		if sessions := 2 - i; renewals != sessions*passes {
			t.Errorf("waiter %d: %d session renewals for %d check passes, want %d each", i, renewals, passes, sessions)
		}
	}
	for _, p := range append(waiters, leader) {
		p.signal(syscall.SIGTERM)
		p.wait(10 * time.Second)
	}
}

// TestConsulFewWoken: N leaderrun waiters (E2E_WAITERS, default 20) on one
// lock, each through a proxy of its own; at each change of leader (SIGTERM
// to the leader) only two followers are woken: the next in line, which
// becomes the leader, and the one behind it, which moves up.
func TestConsulFewWoken(t *testing.T) {
	t.Parallel()
	agent := testenv.StartConsul(t, testenv.ConsulOptions{})
	c := consulClient(t, agent.Addr())
	n := 20
	if s := os.Getenv("E2E_WAITERS"); s != "" {
		v, err := strconv.Atoi(s)
		if err != nil || v < 3 {
			t.Fatalf("E2E_WAITERS=%q: want a number of at least 3", s)
		}
		n = v
	}
	changes := min(5, n-2)
	const lock = "herd"
	key := "/v1/kv/" + consulPrefix + lock
	events := filepath.Join(t.TempDir(), "events")
	procs := make([]*proc, n+1)
	proxies := make([]*consulProxy, n+1)
	for i := range procs {
		proxies[i] = newConsulProxy(t, agent.Addr())
		args := append(append(consulTimedArgs(proxies[i].addr(), lock, fmt.Sprintf("p%03d", i), consulIssueTimings), "--"), childArgv(t)...)
		procs[i] = start(t, childEnv(events, "forever"), args...)
		if i == 0 {
			waitEvents(t, events, 10*time.Second, "the first child", consulSaw("start", "p000"))
		} else {
			waitFor(t, 20*time.Second, "the waiter to queue", func() bool { return consulWaiting(t, c, lock) == i })
		}
	}
	waitFor(t, 10*time.Second, "the first waiter to watch the key", func() bool { return proxies[1].blocked(key) })
	var woken []int
	var handovers []time.Duration
	for k := range changes {
		stopped := time.Now()
		procs[k].signal(syscall.SIGTERM)
		next := fmt.Sprintf("p%03d", k+1)
		evs := waitEvents(t, events, 10*time.Second, next+"'s child", consulSaw("start", next))
		waitFor(t, 10*time.Second, "the next in line to watch the key", func() bool { return proxies[k+2].blocked(key) })
		end := time.Now()
		exit, _ := consulFirst(evs, "exit", fmt.Sprintf("p%03d", k))
		st, _ := consulFirst(evs, "start", next)
		handovers = append(handovers, st.At.Sub(exit.At))
		var who []int
		for i, p := range proxies {
			if i == k {
				continue // the old leader, not a follower
			}
			for _, r := range p.answered(stopped, end) {
				if r.woke() {
					who = append(who, i)
					break
				}
			}
		}
		woken = append(woken, len(who))
		t.Logf("change %d: p%03d → %s, handover (old child's exit → new child's start) %v; processes woken: %v", k, k, next, st.At.Sub(exit.At).Round(time.Microsecond), who)
		for _, i := range who {
			if i != k+1 && i != k+2 {
				t.Errorf("change %d: p%03d was woken; want only the new leader p%03d and the next in line p%03d", k, i, k+1, k+2)
			}
		}
	}
	checkExclusive(t, readEvents(t, events))
	slices.Sort(woken)
	t.Logf("%d waiters, %d changes: processes woken per change %v (median %d); handover %s", n, changes, woken, woken[len(woken)/2], summary(handovers))
	if woken[len(woken)/2] > 2 {
		t.Errorf("median %d processes woken per change, want at most 2", woken[len(woken)/2])
	}
	for _, p := range procs {
		p.signalIfRunning(syscall.SIGTERM)
	}
	for _, p := range procs {
		p.wait(10 * time.Second)
	}
}
