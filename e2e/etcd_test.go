//go:build linux

package e2e

import (
	"context"
	"encoding/json"
	"fmt"
	"net"
	"os"
	"path"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	clientv3 "go.etcd.io/etcd/client/v3"
	"go.uber.org/zap"

	"github.com/leaderrun/leaderrun/internal/testenv"
)

// etcdTimings keep the tests fast: etcd grants the 3 s asked, the child is
// stopped 2 s after the send time of the last acknowledged renewal and
// killed 500 ms later, so it is dead at least 500 ms before etcd can let the
// lease go.
var etcdTimings = []string{"--lease-duration", "3s", "--renew-deadline", "2s", "--retry-period", "500ms", "--kill-grace", "500ms"}

const etcdLease = 3 * time.Second

// etcdRun starts leaderrun against endpoints with a child in mode (see
// childMain) that records to events.
func etcdRun(t *testing.T, events, mode string, endpoints []string, lock, id string, extra ...string) *proc {
	t.Helper()
	args := []string{"--etcd-endpoints", strings.Join(endpoints, ","), "--lock", lock, "--identity", id}
	args = append(append(append(args, etcdTimings...), extra...), "--")
	return start(t, childEnv(events, mode), append(args, childArgv(t)...)...)
}

// etcdStatus is `leaderrun status --json` parsed, and its exit code.
type etcdStatus struct {
	Lock      string `json:"lock"`
	Backend   string `json:"backend"`
	Key       string `json:"key"`
	Held      bool   `json:"held"`
	Identity  string `json:"identity"`
	Token     uint64 `json:"token"`
	TTL       int64  `json:"ttl_ns"`
	Remaining int64  `json:"remaining_ns"`
	Waiting   int    `json:"waiting"`
}

func etcdStatusOf(t *testing.T, endpoints []string, lock string) (etcdStatus, int) {
	t.Helper()
	out, code := output(t, "status", "--json", "--lock", lock, "--etcd-endpoints", strings.Join(endpoints, ","))
	var st etcdStatus
	if code == 0 || code == 3 {
		if err := json.Unmarshal([]byte(out), &st); err != nil {
			t.Fatalf("status --json printed %q: %v", out, err)
		}
	}
	return st, code
}

// etcdFind returns the first event of kind recorded by the child of identity id.
func etcdFind(evs []event, kind, id string) (event, bool) {
	for _, e := range evs {
		if e.Kind == kind && e.ID == id {
			return e, true
		}
	}
	return event{}, false
}

func etcdHas(kind, id string) func([]event) bool {
	return func(evs []event) bool { _, ok := etcdFind(evs, kind, id); return ok }
}

func etcdEvents(t *testing.T) string { return filepath.Join(t.TempDir(), "events") }

// TestEtcdHandovers: three instances at a time contend for one lock, each
// running its child for 300 ms, and exited ones are replaced until eight
// children ran. Never two at once; every new leader's token is greater.
func TestEtcdHandovers(t *testing.T) {
	eps := testenv.StartEtcd(t, 1).Endpoints()
	events := etcdEvents(t)
	const total, together = 8, 3
	var procs []*proc
	for len(procs) < together {
		procs = append(procs, etcdRun(t, events, "sleep:300ms", eps, "handover", fmt.Sprintf("i%d", len(procs))))
	}
	waitFor(t, 30*time.Second, "all children to run", func() bool {
		running := 0
		for _, p := range procs {
			if !p.exited() {
				running++
			} else if p.code != 0 {
				t.Fatalf("an instance exited %d:\n%s", p.code, p.stderr.String())
			}
		}
		for ; running < together && len(procs) < total; running++ {
			procs = append(procs, etcdRun(t, events, "sleep:300ms", eps, "handover", fmt.Sprintf("i%d", len(procs))))
		}
		return running == 0
	})
	evs := readEvents(t, events)
	ivs := checkExclusive(t, evs)
	if len(ivs) != total {
		t.Fatalf("%d children ran, want %d:\n%s", len(ivs), total, formatEvents(evs))
	}
	var gaps []time.Duration
	var tokens []uint64
	for i, iv := range ivs {
		tokens = append(tokens, iv.Token)
		if i > 0 {
			gaps = append(gaps, iv.Start.Sub(ivs[i-1].End).Round(time.Microsecond))
		}
	}
	t.Logf("tokens %v; gaps between one child's exit and the next one's start %v", tokens, gaps)
}

// TestEtcdStoreReportsLoss (S3): an operator revoking the leader's lease,
// or deleting its key, stops the child within 1 s (aim: 100 ms), and
// leaderrun exits 76. etcdctl's numbers include its own start-up; the
// client API's are the store's and leaderrun's alone.
func TestEtcdStoreReportsLoss(t *testing.T) {
	eps := testenv.StartEtcd(t, 1).Endpoints()
	cli, err := clientv3.New(clientv3.Config{Endpoints: eps, DialTimeout: 5 * time.Second, Logger: zap.NewNop()})
	if err != nil {
		t.Fatal(err)
	}
	defer cli.Close()
	// Connect now, so that the client's numbers below are one request.
	if _, err := cli.Get(context.Background(), "warm-up"); err != nil {
		t.Fatal(err)
	}
	leaseID := func(st etcdStatus) clientv3.LeaseID {
		id, err := strconv.ParseInt(path.Base(st.Key), 16, 64)
		if err != nil {
			t.Fatalf("key %s does not end in a lease ID: %v", st.Key, err)
		}
		return clientv3.LeaseID(id)
	}
	etcdctl := func(args ...string) error {
		out, err := testenv.Etcdctl(t, eps, args...)
		if err != nil {
			return fmt.Errorf("etcdctl %v: %w\n%s", args, err, out)
		}
		return nil
	}
	for _, tc := range []struct {
		name string
		drop func(st etcdStatus) error
	}{
		{"EtcdctlLeaseRevoke", func(st etcdStatus) error { return etcdctl("lease", "revoke", path.Base(st.Key)) }},
		{"EtcdctlDel", func(st etcdStatus) error { return etcdctl("del", st.Key) }},
		{"ClientRevoke", func(st etcdStatus) error {
			_, err := cli.Revoke(context.Background(), leaseID(st))
			return err
		}},
		{"ClientDelete", func(st etcdStatus) error {
			_, err := cli.Delete(context.Background(), st.Key)
			return err
		}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			events := etcdEvents(t)
			lock := "loss-" + tc.name
			p := etcdRun(t, events, "forever", eps, lock, "leader")
			waitEvents(t, events, 10*time.Second, "the child", etcdHas("start", "leader"))
			st, code := etcdStatusOf(t, eps, lock)
			if code != 0 {
				t.Fatalf("status exit %d", code)
			}
			before := time.Now()
			if err := tc.drop(st); err != nil {
				t.Fatal(err)
			}
			after := time.Now()
			evs := waitEvents(t, events, 2*time.Second, "the child to be signalled", etcdHas("signal", "leader"))
			sig, _ := etcdFind(evs, "signal", "leader")
			t.Logf("child signalled %v after the request was sent (request took %v)",
				sig.At.Sub(before).Round(time.Microsecond), after.Sub(before).Round(time.Microsecond))
			if d := sig.At.Sub(before); d > time.Second {
				t.Errorf("child signalled %v after the request, want within 1s", d)
			}
			if code := p.wait(5 * time.Second); code != 76 {
				t.Errorf("leaderrun exited %d, want 76", code)
			}
		})
	}
}

// TestEtcdKill9Leader: SIGKILL of leaderrun alone takes its child down
// within 1 s (pdeathsig and the watchdog), and a follower's child starts
// within the lease duration + 1 s, once etcd expired the dead leader's lease.
func TestEtcdKill9Leader(t *testing.T) {
	eps := testenv.StartEtcd(t, 1).Endpoints()
	events := etcdEvents(t)
	leader := etcdRun(t, events, "forever", eps, "kill9", "leader")
	evs := waitEvents(t, events, 10*time.Second, "the leader's child", etcdHas("start", "leader"))
	old, _ := etcdFind(evs, "start", "leader")
	follower := etcdRun(t, events, "forever", eps, "kill9", "follower")
	waitFor(t, 10*time.Second, "the follower to queue", func() bool {
		st, _ := etcdStatusOf(t, eps, "kill9")
		return st.Waiting == 1
	})
	killed := time.Now()
	if err := syscall.Kill(leader.pid(), syscall.SIGKILL); err != nil {
		t.Fatal(err)
	}
	waitFor(t, 2*time.Second, "the leader's child to die", func() bool { return !alive(old.Pid) })
	gone := time.Since(killed)
	evs = waitEvents(t, events, etcdLease+3*time.Second, "the follower's child", etcdHas("start", "follower"))
	next, _ := etcdFind(evs, "start", "follower")
	took := next.At.Sub(killed)
	t.Logf("after kill -9: old child gone within %v; follower's child started %v later (lease %v); tokens %d then %d",
		gone.Round(time.Microsecond), took.Round(time.Millisecond), etcdLease, old.Token, next.Token)
	if gone > time.Second {
		t.Errorf("old child outlived leaderrun by %v, want under 1s", gone)
	}
	if took > etcdLease+time.Second {
		t.Errorf("follower's child started %v after the kill, want within the lease + 1s (%v)", took, etcdLease+time.Second)
	}
	if next.Token <= old.Token {
		t.Errorf("follower's token %d not greater than %d", next.Token, old.Token)
	}
	follower.signal(syscall.SIGTERM)
	follower.wait(5 * time.Second)
}

// TestEtcdSigtermHandover (S6, S8): SIGTERM stops the leader's child,
// releases the lease, and the follower's child starts within 300 ms of the
// old child's exit.
func TestEtcdSigtermHandover(t *testing.T) {
	eps := testenv.StartEtcd(t, 1).Endpoints()
	events := etcdEvents(t)
	leader := etcdRun(t, events, "forever", eps, "sigterm", "leader")
	waitEvents(t, events, 10*time.Second, "the leader's child", etcdHas("start", "leader"))
	follower := etcdRun(t, events, "forever", eps, "sigterm", "follower")
	waitFor(t, 10*time.Second, "the follower to queue", func() bool {
		st, _ := etcdStatusOf(t, eps, "sigterm")
		return st.Waiting == 1
	})
	leader.signal(syscall.SIGTERM)
	evs := waitEvents(t, events, 5*time.Second, "the follower's child", etcdHas("start", "follower"))
	exit, ok := etcdFind(evs, "exit", "leader")
	if !ok {
		t.Fatalf("follower's child started before the leader's child exited:\n%s", formatEvents(evs))
	}
	next, _ := etcdFind(evs, "start", "follower")
	gap := next.At.Sub(exit.At)
	t.Logf("follower's child started %v after the leader's child exited", gap.Round(time.Microsecond))
	if gap < 0 || gap > 300*time.Millisecond {
		t.Errorf("gap %v, want between 0 and 300ms", gap)
	}
	if code := leader.wait(5 * time.Second); code != 0 {
		t.Errorf("leader exited %d, want the child's status 0", code)
	}
	checkExclusive(t, evs)
	follower.signal(syscall.SIGTERM)
	follower.wait(5 * time.Second)
}

// TestEtcdStalledLeader (S2): the leader's link to etcd stops forwarding
// without closing. Its child must be stopped before a follower's starts,
// in every trial ($E2E_TRIALS, default 3; the issue asks for 20).
func TestEtcdStalledLeader(t *testing.T) {
	trials := 3
	if s := os.Getenv("E2E_TRIALS"); s != "" {
		n, err := strconv.Atoi(s)
		if err != nil || n < 1 {
			t.Fatalf("E2E_TRIALS=%q: want a positive number", s)
		}
		trials = n
	}
	eps := testenv.StartEtcd(t, 1).Endpoints()
	var gaps []time.Duration
	for i := range trials {
		gaps = append(gaps, stalledTrial(t, eps, i))
	}
	slices.Sort(gaps)
	t.Logf("%d trials: the old child exited before the new one started every time; gaps: smallest %v, median %v, largest %v",
		trials, gaps[0], gaps[len(gaps)/2], gaps[len(gaps)-1])
}

func stalledTrial(t *testing.T, eps []string, i int) time.Duration {
	t.Helper()
	events := etcdEvents(t)
	lock := fmt.Sprintf("stall-%d", i)
	proxy := testenv.NewProxy(t, strings.TrimPrefix(eps[0], "http://"))
	leader := etcdRun(t, events, "forever", []string{"http://" + proxy.Addr()}, lock, "leader")
	waitEvents(t, events, 10*time.Second, "the leader's child", etcdHas("start", "leader"))
	follower := etcdRun(t, events, "forever", eps, lock, "follower")
	waitFor(t, 10*time.Second, "the follower to queue", func() bool {
		st, _ := etcdStatusOf(t, eps, lock)
		return st.Waiting == 1
	})
	proxy.Stall()
	stalled := time.Now()
	evs := waitEvents(t, events, etcdLease+5*time.Second, "the follower's child", etcdHas("start", "follower"))
	next, _ := etcdFind(evs, "start", "follower")
	exit, ok := etcdFind(evs, "exit", "leader")
	if !ok {
		t.Fatalf("trial %d: follower's child started while the stalled leader's child still ran:\n%s", i, formatEvents(evs))
	}
	gap := next.At.Sub(exit.At)
	t.Logf("trial %d: old child stopped %v after the stall, new child started %v after the stall: gap %v",
		i, exit.At.Sub(stalled).Round(time.Millisecond), next.At.Sub(stalled).Round(time.Millisecond), gap.Round(time.Millisecond))
	if gap <= 0 {
		t.Errorf("trial %d: children overlapped by %v", i, -gap)
	}
	checkExclusive(t, evs)
	proxy.Resume()
	if code := leader.wait(10 * time.Second); code != 76 {
		t.Errorf("trial %d: stalled leader exited %d, want 76", i, code)
	}
	follower.signal(syscall.SIGTERM)
	follower.wait(5 * time.Second)
	return gap
}

// TestEtcdPausedLeader (S7): leaderrun and its child are stopped (SIGSTOP
// of both process groups) until a follower has taken over; on SIGCONT the
// old child is signalled within 200 ms and leaderrun exits 76.
func TestEtcdPausedLeader(t *testing.T) {
	eps := testenv.StartEtcd(t, 1).Endpoints()
	events := etcdEvents(t)
	leader := etcdRun(t, events, "forever", eps, "pause", "leader")
	evs := waitEvents(t, events, 10*time.Second, "the leader's child", etcdHas("start", "leader"))
	old, _ := etcdFind(evs, "start", "leader")
	follower := etcdRun(t, events, "forever", eps, "pause", "follower")
	waitFor(t, 10*time.Second, "the follower to queue", func() bool {
		st, _ := etcdStatusOf(t, eps, "pause")
		return st.Waiting == 1
	})
	groups := pauseGroups(t, leader.pid(), old.Pid)
	for _, g := range groups {
		if err := syscall.Kill(-g, syscall.SIGSTOP); err != nil {
			t.Fatalf("SIGSTOP group %d: %v", g, err)
		}
	}
	stopped := time.Now()
	evs = waitEvents(t, events, etcdLease+5*time.Second, "the follower's child", etcdHas("start", "follower"))
	next, _ := etcdFind(evs, "start", "follower")
	resumed := time.Now()
	for _, g := range groups {
		_ = syscall.Kill(-g, syscall.SIGCONT)
	}
	evs = waitEvents(t, events, 5*time.Second, "the old child to be signalled", etcdHas("signal", "leader"))
	sig, _ := etcdFind(evs, "signal", "leader")
	d := sig.At.Sub(resumed)
	t.Logf("paused %v; follower took over %v into the pause with token %d (old %d); old child signalled %v after SIGCONT",
		resumed.Sub(stopped).Round(time.Millisecond), next.At.Sub(stopped).Round(time.Millisecond), next.Token, old.Token, d.Round(time.Microsecond))
	if next.Token <= old.Token {
		t.Errorf("follower's token %d not greater than %d", next.Token, old.Token)
	}
	if d > 200*time.Millisecond {
		t.Errorf("old child signalled %v after the resume, want within 200ms", d)
	}
	if code := leader.wait(5 * time.Second); code != 76 {
		t.Errorf("leader exited %d, want 76", code)
	}
	follower.signal(syscall.SIGTERM)
	follower.wait(5 * time.Second)
}

// TestEtcdClusterRollingRestart: on a 3-member cluster, restarting each
// member in turn, the one the leader is connected to included, costs it
// nothing while quorum holds. The leader lists every member, as a
// production config would, so its client fails over.
func TestEtcdClusterRollingRestart(t *testing.T) {
	cluster := testenv.StartEtcd(t, 3)
	eps := cluster.Endpoints()
	events := etcdEvents(t)
	leader := etcdRun(t, events, "forever", eps, "rolling", "leader")
	evs := waitEvents(t, events, 10*time.Second, "the leader's child", etcdHas("start", "leader"))
	old, _ := etcdFind(evs, "start", "leader")
	follower := etcdRun(t, events, "forever", eps, "rolling", "follower")
	waitFor(t, 10*time.Second, "the follower to queue", func() bool {
		st, _ := etcdStatusOf(t, eps, "rolling")
		return st.Waiting == 1
	})
	for _, m := range cluster.Members {
		began := time.Now()
		m.Stop(t)
		stopped := time.Now()
		m.Start(t)
		started := time.Now()
		cluster.WaitHealthy(t)
		t.Logf("restarted %s (%s): stop %v, start %v, cluster healthy %v later", m.Name, m.ClientURL,
			stopped.Sub(began).Round(time.Millisecond), started.Sub(stopped).Round(time.Millisecond), time.Since(started).Round(time.Millisecond))
	}
	// Let a few renewals go through every member again.
	waitFor(t, 10*time.Second, "status from the restarted cluster", func() bool {
		st, code := etcdStatusOf(t, eps, "rolling")
		return code == 0 && st.Remaining > 0
	})
	st, _ := etcdStatusOf(t, eps, "rolling")
	evs = readEvents(t, events)
	if len(evs) != 1 || leader.exited() || st.Identity != "leader" || st.Token != old.Token {
		t.Fatalf("leadership changed during the rolling restart: status %+v, events:\n%s\nleader's log:\n%s",
			st, formatEvents(evs), leader.stderr.String())
	}
	t.Logf("leader kept token %d through the restart of all three members; lease left %v",
		st.Token, time.Duration(st.Remaining))
	leader.signal(syscall.SIGTERM)
	leader.wait(5 * time.Second)
	follower.signal(syscall.SIGTERM)
	follower.wait(5 * time.Second)
}

// TestEtcdStatus: exit 3 and "none" without a leader; exit 0 with the
// leader's identity and token (the child's FENCE_TOKEN), the waiting
// candidates and the lease left; --json parses.
func TestEtcdStatus(t *testing.T) {
	eps := testenv.StartEtcd(t, 1).Endpoints()
	epFlag := strings.Join(eps, ",")
	out, code := output(t, "status", "--lock", "st", "--etcd-endpoints", epFlag)
	if code != 3 || !strings.Contains(out, "none") {
		t.Errorf("status of a free lock: exit %d, output:\n%s\nwant exit 3 and leader none", code, out)
	}
	if st, code := etcdStatusOf(t, eps, "st"); code != 3 || st.Held || st.Waiting != 0 {
		t.Errorf("status --json of a free lock: exit %d, %+v", code, st)
	}

	events := etcdEvents(t)
	etcdRun(t, events, "forever", eps, "st", "holder-1")
	evs := waitEvents(t, events, 10*time.Second, "the holder's child", etcdHas("start", "holder-1"))
	child, _ := etcdFind(evs, "start", "holder-1")
	etcdRun(t, events, "forever", eps, "st", "waiter-1")
	waitFor(t, 10*time.Second, "the waiter to queue", func() bool {
		st, _ := etcdStatusOf(t, eps, "st")
		return st.Waiting == 1
	})
	out, code = output(t, "status", "--lock", "st", "--etcd-endpoints", epFlag)
	if code != 0 || !strings.Contains(out, "holder-1") || !strings.Contains(out, strconv.FormatUint(child.Token, 10)) {
		t.Errorf("status: exit %d, output:\n%s\nwant exit 0 naming holder-1 and token %d", code, out, child.Token)
	}
	t.Logf("status:\n%s", out)
	st, code := etcdStatusOf(t, eps, "st")
	if code != 0 || !st.Held || st.Identity != "holder-1" || st.Token != child.Token || st.Waiting != 1 ||
		st.Backend != "etcd" || time.Duration(st.TTL) != etcdLease || st.Remaining <= 0 || !strings.HasPrefix(st.Key, "leaderrun/st/") {
		t.Errorf("status --json: exit %d, %+v; want held by holder-1 with token %d, 1 waiting, ttl %v", code, st, child.Token, etcdLease)
	}
}

// TestEtcdTryAndWait: --try on a held lock exits 75 at once and leaves no
// candidate behind; --wait gives up after its duration; a waiting
// candidate that gets SIGTERM withdraws at once.
func TestEtcdTryAndWait(t *testing.T) {
	eps := testenv.StartEtcd(t, 1).Endpoints()
	events := etcdEvents(t)
	etcdRun(t, events, "forever", eps, "tw", "holder")
	waitEvents(t, events, 10*time.Second, "the holder's child", etcdHas("start", "holder"))

	began := time.Now()
	if code := etcdRun(t, events, "exit:0", eps, "tw", "try", "--try").wait(10 * time.Second); code != 75 {
		t.Errorf("--try on a held lock exited %d, want 75", code)
	}
	t.Logf("--try on a held lock: exit 75 after %v (process start included)", time.Since(began).Round(time.Millisecond))
	if st, _ := etcdStatusOf(t, eps, "tw"); st.Waiting != 0 {
		t.Errorf("after --try, %d candidates wait, want 0", st.Waiting)
	}

	began = time.Now()
	if code := etcdRun(t, events, "exit:0", eps, "tw", "wait", "--wait", "1s").wait(10 * time.Second); code != 75 {
		t.Errorf("--wait 1s on a held lock exited %d, want 75", code)
	}
	if took := time.Since(began); took < time.Second || took > 3*time.Second {
		t.Errorf("--wait 1s gave up after %v", took)
	}

	w := etcdRun(t, events, "exit:0", eps, "tw", "waiter")
	waitFor(t, 10*time.Second, "the waiter to queue", func() bool {
		st, _ := etcdStatusOf(t, eps, "tw")
		return st.Waiting == 1
	})
	w.signal(syscall.SIGTERM)
	if code := w.wait(3 * time.Second); code != 128+int(syscall.SIGTERM) {
		t.Errorf("waiter interrupted by SIGTERM exited %d, want %d", code, 128+int(syscall.SIGTERM))
	}
	if st, _ := etcdStatusOf(t, eps, "tw"); st.Waiting != 0 {
		t.Errorf("after the waiter withdrew, %d candidates wait, want 0", st.Waiting)
	}
	if evs := readEvents(t, events); count(evs, "start") != 1 {
		t.Errorf("children started:\n%s\nwant only the holder's", formatEvents(evs))
	}
}

// TestEtcdUnreachable: a store that refuses connections, or accepts them and
// says nothing, is exit 69 within about the dial timeout, with a message
// naming the endpoint.
func TestEtcdUnreachable(t *testing.T) {
	refused := fmt.Sprintf("http://127.0.0.1:%d", testenv.FreePort(t, "127.0.0.1"))
	// A listener that never accepts: the kernel completes the handshake
	// and holds what the client sends, and nothing ever answers.
	silent, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer silent.Close()
	blackhole := "http://" + silent.Addr().String()
	for _, tc := range []struct {
		name     string
		endpoint string
		args     []string
	}{
		{"Refused", refused, nil},
		{"RefusedTry", refused, []string{"--try"}},
		{"Silent", blackhole, nil},
		{"Status", refused, []string{"status"}},
		// --timeout shorter than the dial timeout: still 69, naming the
		// endpoint, not a bare "context deadline exceeded" (70).
		{"StatusTimeout", blackhole, []string{"status", "--timeout", "500ms"}},
		// Credentials in the endpoint URL are never printed.
		{"CredentialsInURL", "http://user:secretpw@" + strings.TrimPrefix(refused, "http://"), nil},
	} {
		t.Run(tc.name, func(t *testing.T) {
			args := []string{"--lock", "unreachable", "--etcd-endpoints", tc.endpoint, "--etcd-dial-timeout", "1s"}
			if slices.Contains(tc.args, "status") {
				args = append(append([]string{"status"}, args...), tc.args[1:]...)
			} else {
				args = append(append(append(args, tc.args...), "--"), childArgv(t)...)
			}
			began := time.Now()
			out, code := output(t, args...)
			took := time.Since(began)
			t.Logf("exit %d after %v: %s", code, took.Round(time.Millisecond), strings.TrimSpace(out))
			if code != 69 {
				t.Errorf("exit %d, want 69", code)
			}
			host := tc.endpoint[strings.LastIndexAny(tc.endpoint, "/@")+1:]
			if !strings.Contains(out, host) {
				t.Errorf("message does not name %s", host)
			}
			if strings.Contains(out, "secretpw") {
				t.Errorf("message shows the password in the endpoint URL")
			}
			if took > 3*time.Second {
				t.Errorf("took %v, want about the 1s dial timeout", took)
			}
		})
	}
}

// TestEtcdUsageErrors: bad etcd flags are exit 64 with a message naming the
// flag, before anything is contacted.
func TestEtcdUsageErrors(t *testing.T) {
	for _, tc := range []struct {
		name string
		args []string
		want string
	}{
		{"BadEndpoint", []string{"--etcd-endpoints", "http://"}, "--etcd-endpoints"},
		{"NoEndpoint", []string{"--backend", "etcd", "--etcd-endpoints", " , "}, "--etcd-endpoints"},
		{"UserWithoutPassword", []string{"--etcd-endpoints", "127.0.0.1:2379", "--etcd-user", "root"}, "--etcd-user"},
		{"CertWithoutKey", []string{"--etcd-endpoints", "127.0.0.1:2379", "--etcd-cert", "/nonexistent.pem"}, "--etcd-cert"},
		{"MissingCA", []string{"--etcd-endpoints", "127.0.0.1:2379", "--etcd-cacert", "/nonexistent.pem"}, "--etcd-cacert"},
		{"DialTimeout", []string{"--etcd-endpoints", "127.0.0.1:2379", "--etcd-dial-timeout", "0s"}, "--etcd-dial-timeout"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			args := append(append([]string{"--lock", "usage"}, tc.args...), "--", "/bin/true")
			out, code := output(t, args...)
			if code != 64 || !strings.Contains(out, tc.want) {
				t.Errorf("exit %d, output %q; want 64 naming %s", code, out, tc.want)
			}
		})
	}
}

// TestEtcdAuth: with etcd's authentication on, --etcd-user USER:PASSWORD
// (or ETCDCTL_USER) gets the lock; a wrong password or none is exit 69 with
// etcd's reason, at once.
func TestEtcdAuth(t *testing.T) {
	eps := testenv.StartEtcd(t, 1).Endpoints()
	for _, args := range [][]string{{"user", "add", "root", "--new-user-password=rootpw"}, {"auth", "enable"}} {
		if out, err := testenv.Etcdctl(t, eps, args...); err != nil {
			t.Fatalf("etcdctl %v: %v\n%s", args, err, out)
		}
	}
	events := etcdEvents(t)
	if code := etcdRun(t, events, "exit:0", eps, "auth", "flag", "--etcd-user", "root:rootpw").wait(10 * time.Second); code != 0 {
		t.Errorf("--etcd-user root:rootpw: exit %d, want 0", code)
	}
	args := append([]string{"--etcd-endpoints", strings.Join(eps, ","), "--lock", "auth", "--identity", "env", "--"}, childArgv(t)...)
	if code := start(t, append(childEnv(events, "exit:0"), "ETCDCTL_USER=root:rootpw"), args...).wait(10 * time.Second); code != 0 {
		t.Errorf("ETCDCTL_USER=root:rootpw: exit %d, want 0", code)
	}
	for _, tc := range []struct {
		name, want string
		extra      []string
	}{
		{"WrongPassword", "authentication failed", []string{"--etcd-user", "root:wrong"}},
		{"NoUser", "user name is empty", nil},
	} {
		t.Run(tc.name, func(t *testing.T) {
			args := append(append([]string{"--etcd-endpoints", strings.Join(eps, ","), "--lock", "auth"}, tc.extra...), "--", "/bin/true")
			began := time.Now()
			out, code := output(t, args...)
			t.Logf("exit %d after %v", code, time.Since(began).Round(time.Millisecond))
			if code != 69 || !strings.Contains(out, tc.want) || !strings.Contains(out, eps[0]) {
				t.Errorf("exit %d, output %q; want 69 with %q and the endpoint", code, out, tc.want)
			}
		})
	}
	if evs := readEvents(t, events); count(evs, "start") != 2 {
		t.Errorf("children started:\n%s\nwant the two authenticated runs'", formatEvents(evs))
	}
	// A user that may only read the lock's keys: "permission denied" is
	// final and said, in every mode, not retried for ever nor taken for
	// a held lock.
	for _, args := range [][]string{{"user", "add", "reader", "--new-user-password=readpw"}, {"role", "add", "readonly"},
		{"role", "grant-permission", "readonly", "--prefix=true", "read", "leaderrun/"}, {"user", "grant-role", "reader", "readonly"}} {
		if out, err := testenv.Etcdctl(t, eps, append([]string{"--user", "root:rootpw"}, args...)...); err != nil {
			t.Fatalf("etcdctl %v: %v\n%s", args, err, out)
		}
	}
	for _, mode := range [][]string{nil, {"--try"}, {"--wait", "5s"}} {
		t.Run(fmt.Sprintf("ReadOnly%v", mode), func(t *testing.T) {
			args := append([]string{"--etcd-endpoints", strings.Join(eps, ","), "--lock", "auth", "--etcd-user", "reader:readpw"}, mode...)
			began := time.Now()
			out, code := output(t, append(args, "--", "/bin/true")...)
			took := time.Since(began)
			t.Logf("exit %d after %v: %s", code, took.Round(time.Millisecond), strings.TrimSpace(out))
			if code != 69 || !strings.Contains(out, "permission denied") || !strings.Contains(out, "leaderrun/auth") {
				t.Errorf("exit %d; want 69 saying permission denied on leaderrun/auth", code)
			}
			if took > 3*time.Second {
				t.Errorf("took %v: a refusal must not be retried", took)
			}
		})
	}
}

// TestEtcdTLS: against an etcd that serves https and requires a client
// certificate, the TLS flags (or etcdctl's variables) get the lock; without
// a client certificate the store refuses, exit 69 naming the endpoint.
func TestEtcdTLS(t *testing.T) {
	e := testenv.StartEtcdTLS(t)
	eps := e.Endpoints()
	tlsFlags := []string{"--etcd-cacert", e.TLS.CACert, "--etcd-cert", e.TLS.Cert, "--etcd-key", e.TLS.Key}
	events := etcdEvents(t)
	if code := etcdRun(t, events, "exit:0", eps, "tls", "flags", tlsFlags...).wait(10 * time.Second); code != 0 {
		t.Errorf("with the TLS flags: exit %d, want 0", code)
	}
	env := append(childEnv(events, "exit:0"), "ETCDCTL_CACERT="+e.TLS.CACert, "ETCDCTL_CERT="+e.TLS.Cert, "ETCDCTL_KEY="+e.TLS.Key)
	args := append([]string{"--etcd-endpoints", strings.Join(eps, ","), "--lock", "tls", "--identity", "env", "--"}, childArgv(t)...)
	if code := start(t, env, args...).wait(10 * time.Second); code != 0 {
		t.Errorf("with ETCDCTL_CACERT, ETCDCTL_CERT, ETCDCTL_KEY: exit %d, want 0", code)
	}
	if evs := readEvents(t, events); count(evs, "start") != 2 {
		t.Errorf("children started:\n%s\nwant two", formatEvents(evs))
	}
	out, code := output(t, append([]string{"status", "--lock", "tls", "--etcd-endpoints", eps[0]}, tlsFlags...)...)
	if code != 3 {
		t.Errorf("status over TLS: exit %d, want 3 (no leader):\n%s", code, out)
	}
	began := time.Now()
	out, code = output(t, "--lock", "tls", "--etcd-endpoints", eps[0], "--etcd-cacert", e.TLS.CACert,
		"--etcd-dial-timeout", "1s", "--", "/bin/true")
	t.Logf("without a client certificate: exit %d after %v", code, time.Since(began).Round(time.Millisecond))
	if code != 69 || !strings.Contains(out, eps[0]) {
		t.Errorf("without a client certificate: exit %d, output %q; want 69 naming %s", code, out, eps[0])
	}
}
