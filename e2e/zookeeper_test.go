//go:build linux

package e2e

import (
	"encoding/json"
	"errors"
	"fmt"
	"net"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/go-zookeeper/zk"

	"github.com/leaderrun/leaderrun/internal/testenv"
)

// zkTimings keep the tests fast on the test servers (tick 200 ms, so a
// minimum session timeout of 400 ms): the ensemble grants the 3.5 s
// asked, and the lease's TTL leaves out the retry period and half a tick,
// 3.5 s − 500 ms − 100 ms = 2.9 s, more than the 2 s deadline + 500 ms
// grace.
var zkTimings = []string{"--lease-duration", "3500ms", "--renew-deadline", "2s", "--retry-period", "500ms", "--kill-grace", "500ms"}

const zkSession = 3500 * time.Millisecond

// zkEnv is one standalone server shared by the subtests of TestZooKeeper
// (a JVM takes seconds to start on a busy machine), and a plain client of
// its own that plays the operator.
type zkEnv struct {
	z       *testenv.ZooKeeper
	servers string
	admin   *zk.Conn
}

type zkQuiet struct{}

func (zkQuiet) Printf(string, ...any) {}

func newZKEnv(t *testing.T, z *testenv.ZooKeeper) *zkEnv {
	t.Helper()
	admin, _, err := zk.Connect(z.Servers(), 10*time.Second, zk.WithLogger(zkQuiet{}), zk.WithLogInfo(false))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(admin.Close)
	// Connect now, so that the timed requests below are one round trip.
	if _, _, err := admin.Exists("/"); err != nil {
		t.Fatal(err)
	}
	return &zkEnv{z: z, servers: strings.Join(z.Servers(), ","), admin: admin}
}

// args are the store flags and the test timings for lock and id, then extra.
func (e *zkEnv) args(lock, id string, extra ...string) []string {
	args := append([]string{"--zk-servers", e.servers, "--lock", lock, "--identity", id}, zkTimings...)
	return append(args, extra...)
}

// run starts leaderrun with a child in mode (see childMain) that records to events.
func (e *zkEnv) run(t *testing.T, events, mode, lock, id string, extra ...string) *proc {
	t.Helper()
	args := append(append(e.args(lock, id, extra...), "--"), childArgv(t)...)
	return start(t, childEnv(events, mode), args...)
}

// status is `leaderrun status --json` parsed (the fields are every
// store's), and its exit code.
func (e *zkEnv) status(t *testing.T, lock string) (etcdStatus, int) {
	t.Helper()
	out, code := output(t, "status", "--json", "--lock", lock, "--zk-servers", e.servers)
	var st etcdStatus
	if code == 0 || code == 3 {
		if err := json.Unmarshal([]byte(out), &st); err != nil {
			t.Fatalf("status --json printed %q: %v", out, err)
		}
	}
	return st, code
}

func (e *zkEnv) waitWaiting(t *testing.T, lock string, n int) {
	t.Helper()
	waitFor(t, 10*time.Second, fmt.Sprintf("%d candidates to queue behind the leader", n), func() bool {
		st, _ := e.status(t, lock)
		return st.Waiting == n
	})
}

// candidates are the candidates' znodes of lock, as the operator's
// client lists them.
func (e *zkEnv) candidates(t *testing.T, lock string) []string {
	t.Helper()
	names, _, err := e.admin.Children("/leaderrun/" + lock)
	if errors.Is(err, zk.ErrNoNode) {
		return nil
	}
	if err != nil {
		t.Fatal(err)
	}
	var cs []string
	for _, n := range names {
		if strings.HasPrefix(n, "_c_") {
			cs = append(cs, n)
		}
	}
	return cs
}

// cli runs ZooKeeper's own command-line client, as an operator would.
func (e *zkEnv) cli(t *testing.T, args ...string) {
	t.Helper()
	out, err := e.z.CLI(t, args...)
	if err != nil || strings.Contains(out, "Exception") || strings.Contains(out, "Node does not exist") {
		t.Fatalf("zkCli %v: %v\n%s", args, err, out)
	}
}

// seqOf is the sequence number a candidate's znode name ends with.
func seqOf(t *testing.T, path string) int {
	t.Helper()
	n, err := strconv.Atoi(path[strings.LastIndex(path, "-")+1:])
	if err != nil {
		t.Fatalf("no sequence number in %s", path)
	}
	return n
}

// TestZooKeeper runs the end-to-end tests against one standalone server;
// the tests of timings that need ZooKeeper's default tick, and the
// simulated cron, start servers of their own.
func TestZooKeeper(t *testing.T) {
	e := newZKEnv(t, testenv.StartZooKeeper(t, 1))
	for _, tc := range []struct {
		name string
		run  func(*testing.T, *zkEnv)
	}{
		{"HandoversAcrossDeleteAll", testZKHandovers},
		{"ZnodeDeletedByHand", testZKZnodeDeleted},
		{"LockDeletedWhileHeld", testZKLockDeletedWhileHeld},
		{"Kill9Leader", testZKKill9Leader},
		{"SigtermHandover", testZKSigtermHandover},
		{"Status", testZKStatus},
		{"Check", testZKCheck},
		{"TryAndWait", testZKTryAndWait},
		{"Unreachable", testZKUnreachable},
		{"DigestAuth", testZKAuth},
		{"OnceFailures", testZKOnceFailures},
		{"EscapedHelper", testZKEscapedHelper},
	} {
		t.Run(tc.name, func(t *testing.T) { tc.run(t, e) })
	}
}

// testZKHandovers: three contenders at a time hand the lock over 20 times
// (21 children, each running 200 ms): never two children at once, every
// new token greater than the one before. Halfway, with nobody holding the
// lock, the operator deletes the lock's whole tree with zkCli's deleteall:
// the sequence numbers start again from 0, the tokens (czxids) go on
// growing.
func testZKHandovers(t *testing.T, e *zkEnv) {
	const lock, together = "handovers", 3
	events := etcdEvents(t)
	n := 0
	wave := func(children int) (firstSeq, lastSeq int) {
		firstSeq = -1
		var procs []*proc
		spawn := func() {
			procs = append(procs, e.run(t, events, "sleep:200ms", lock, fmt.Sprintf("i%02d", n)))
			n++
		}
		for range together {
			spawn()
		}
		started := len(procs)
		waitFor(t, 60*time.Second, "the wave's children to run", func() bool {
			if st, code := e.status(t, lock); code == 0 {
				lastSeq = seqOf(t, st.Key)
				if firstSeq < 0 {
					firstSeq = lastSeq
				}
			}
			running := 0
			for _, p := range procs {
				if !p.exited() {
					running++
				} else if p.code != 0 {
					t.Fatalf("an instance exited %d:\n%s", p.code, p.stderr.String())
				}
			}
			for ; running < together && started < children; running++ {
				spawn()
				started++
			}
			return running == 0
		})
		return firstSeq, lastSeq
	}
	_, seqBefore := wave(10)
	e.cli(t, "deleteall", "/leaderrun/"+lock)
	if ok, _, _ := e.admin.Exists("/leaderrun/" + lock); ok {
		t.Fatalf("/leaderrun/%s still exists after deleteall", lock)
	}
	deletedAfter := len(readEvents(t, events))
	seqAfter, _ := wave(11)

	evs := readEvents(t, events)
	ivs := checkExclusive(t, evs)
	if len(ivs) != 21 {
		t.Fatalf("%d children ran, want 21:\n%s", len(ivs), formatEvents(evs))
	}
	var tokens []uint64
	var gaps []time.Duration
	for i, iv := range ivs {
		tokens = append(tokens, iv.Token)
		// Not across the deleteall, which the test waited for.
		if i > 0 && i != 10 {
			gaps = append(gaps, iv.Start.Sub(ivs[i-1].End))
		}
	}
	slices.Sort(gaps)
	t.Logf("20 handovers, tokens %v (deleteall after the 10th child, event %d)", tokens, deletedAfter)
	t.Logf("gaps between a child's exit and the next one's start, child start-up included: smallest %v, median %v, largest %v",
		gaps[0].Round(time.Microsecond), gaps[len(gaps)/2].Round(time.Microsecond), gaps[len(gaps)-1].Round(time.Microsecond))
	t.Logf("leaders' znode sequence numbers, as status saw them: up to %d before the deleteall, from %d after it", seqBefore, seqAfter)
	if seqAfter >= seqBefore {
		t.Errorf("sequence numbers did not start again after the deleteall (%d, then %d): was the tree deleted?", seqBefore, seqAfter)
	}
}

// testZKZnodeDeleted (S3): an operator deleting the leader's znode, with
// the Go client or with zkCli: the child gets its kill signal within 1 s
// (aim: 100 ms) and leaderrun exits 76, saying why. zkCli's figure is
// counted from its exit: its JVM takes a second or more to start.
func testZKZnodeDeleted(t *testing.T, e *zkEnv) {
	for _, tc := range []struct {
		name string
		drop func(t *testing.T, path string) (sent time.Time)
	}{
		{"GoClient", func(t *testing.T, path string) time.Time {
			sent := time.Now()
			if err := e.admin.Delete(path, -1); err != nil {
				t.Fatal(err)
			}
			return sent
		}},
		{"ZkCli", func(t *testing.T, path string) time.Time {
			began := time.Now()
			e.cli(t, "delete", path)
			t.Logf("zkCli ran for %v", time.Since(began).Round(time.Millisecond))
			return time.Now()
		}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			events := etcdEvents(t)
			lock := "deleted-" + tc.name
			p := e.run(t, events, "forever", lock, "leader")
			waitEvents(t, events, 10*time.Second, "the child", etcdHas("start", "leader"))
			st, code := e.status(t, lock)
			if code != 0 {
				t.Fatalf("status exit %d", code)
			}
			from := tc.drop(t, st.Key)
			evs := waitEvents(t, events, 5*time.Second, "the child to be signalled", etcdHas("signal", "leader"))
			sig, _ := etcdFind(evs, "signal", "leader")
			d := sig.At.Sub(from)
			t.Logf("child signalled %v after the delete (%s)", d.Round(time.Microsecond), map[string]string{
				"GoClient": "from the request's send time", "ZkCli": "from zkCli's exit; negative: before it exited"}[tc.name])
			if d > time.Second {
				t.Errorf("child signalled %v after the delete, want within 1s", d)
			}
			if code := p.wait(5 * time.Second); code != 76 {
				t.Errorf("leaderrun exited %d, want 76", code)
			}
			if out := p.stderr.String(); !strings.Contains(out, "was deleted") {
				t.Errorf("leaderrun's log does not say the znode was deleted:\n%s", out)
			}
		})
	}
}

// testZKLockDeletedWhileHeld: deleting the lock's whole tree while it is
// held, with a candidate waiting, is a loss for the leader (signalled
// within 1 s, exit 76) and a new queue for the waiter, which takes over
// with a greater token. Nothing can keep that waiter from starting its
// child while the old one is being stopped: forcing a held lock open is
// the operator's decision, and only the token then keeps the resource
// safe. The test measures how the two children met.
func testZKLockDeletedWhileHeld(t *testing.T, e *zkEnv) {
	const lock = "deleted-held"
	events := etcdEvents(t)
	leader := e.run(t, events, "forever", lock, "leader")
	evs := waitEvents(t, events, 10*time.Second, "the leader's child", etcdHas("start", "leader"))
	old, _ := etcdFind(evs, "start", "leader")
	follower := e.run(t, events, "forever", lock, "follower")
	e.waitWaiting(t, lock, 1)
	began := time.Now()
	e.cli(t, "deleteall", "/leaderrun/"+lock)
	done := time.Now()
	waitEvents(t, events, 5*time.Second, "the follower's child", etcdHas("start", "follower"))
	evs = waitEvents(t, events, 5*time.Second, "the leader's child to exit", etcdHas("exit", "leader"))
	sig, _ := etcdFind(evs, "signal", "leader")
	exit, _ := etcdFind(evs, "exit", "leader")
	next, _ := etcdFind(evs, "start", "follower")
	t.Logf("zkCli deleteall ran %v; old child signalled %v after zkCli's exit, exited %v later; follower's child started %v after the old child's exit (negative: they overlapped)",
		done.Sub(began).Round(time.Millisecond), sig.At.Sub(done).Round(time.Millisecond),
		exit.At.Sub(sig.At).Round(time.Microsecond), next.At.Sub(exit.At).Round(time.Microsecond))
	if d := sig.At.Sub(done); d > time.Second {
		t.Errorf("old child signalled %v after the deleteall, want within 1s", d)
	}
	if next.Token <= old.Token {
		t.Errorf("follower's token %d not greater than %d", next.Token, old.Token)
	}
	if code := leader.wait(5 * time.Second); code != 76 {
		t.Errorf("leader exited %d, want 76", code)
	}
	follower.signal(syscall.SIGTERM)
	follower.wait(5 * time.Second)
}

// testZKKill9Leader: SIGKILL of leaderrun alone takes its child down
// within 1 s (pdeathsig and the watchdog), and a follower's child starts
// within the negotiated session timeout + 1 s, once the ensemble expired
// the dead leader's session.
func testZKKill9Leader(t *testing.T, e *zkEnv) {
	const lock = "kill9"
	events := etcdEvents(t)
	leader := e.run(t, events, "forever", lock, "leader")
	evs := waitEvents(t, events, 10*time.Second, "the leader's child", etcdHas("start", "leader"))
	old, _ := etcdFind(evs, "start", "leader")
	follower := e.run(t, events, "forever", lock, "follower")
	e.waitWaiting(t, lock, 1)
	killed := time.Now()
	if err := syscall.Kill(leader.pid(), syscall.SIGKILL); err != nil {
		t.Fatal(err)
	}
	waitFor(t, 2*time.Second, "the leader's child to die", func() bool { return !alive(old.Pid) })
	gone := time.Since(killed)
	evs = waitEvents(t, events, zkSession+3*time.Second, "the follower's child", etcdHas("start", "follower"))
	next, _ := etcdFind(evs, "start", "follower")
	took := next.At.Sub(killed)
	t.Logf("after kill -9: old child gone within %v; follower's child started %v later (session timeout %v); tokens %d then %d",
		gone.Round(time.Microsecond), took.Round(time.Millisecond), zkSession, old.Token, next.Token)
	if gone > time.Second {
		t.Errorf("old child outlived leaderrun by %v, want under 1s", gone)
	}
	if took > zkSession+time.Second {
		t.Errorf("follower's child started %v after the kill, want within the session timeout + 1s (%v)", took, zkSession+time.Second)
	}
	if next.Token <= old.Token {
		t.Errorf("follower's token %d not greater than %d", next.Token, old.Token)
	}
	follower.signal(syscall.SIGTERM)
	follower.wait(5 * time.Second)
}

// testZKSigtermHandover (S6, S8): SIGTERM stops the leader's child, ends
// its session (which deletes its znode), and the follower's child starts
// within 300 ms of the old child's exit.
func testZKSigtermHandover(t *testing.T, e *zkEnv) {
	const lock = "sigterm"
	events := etcdEvents(t)
	leader := e.run(t, events, "forever", lock, "leader")
	waitEvents(t, events, 10*time.Second, "the leader's child", etcdHas("start", "leader"))
	follower := e.run(t, events, "forever", lock, "follower")
	e.waitWaiting(t, lock, 1)
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

// testZKStatus: exit 3 and "none" without a leader; exit 0 with the
// leader's identity and token (the child's FENCE_TOKEN), its znode and
// the waiting candidates; --json parses; the last term shows after a
// release; `history --json` lists the terms, newest first.
func testZKStatus(t *testing.T, e *zkEnv) {
	const lock = "st"
	out, code := output(t, "status", "--lock", lock, "--zk-servers", e.servers)
	if code != 3 || !strings.Contains(out, "none") {
		t.Errorf("status of a free lock: exit %d, output:\n%s\nwant exit 3 and leader none", code, out)
	}
	if st, code := e.status(t, lock); code != 3 || st.Held || st.Waiting != 0 {
		t.Errorf("status --json of a free lock: exit %d, %+v", code, st)
	}
	if out, code := output(t, "history", "--lock", lock, "--zk-servers", e.servers); code != 0 || out != "" {
		t.Errorf("history of an unused lock: exit %d, output %q; want 0 and nothing", code, out)
	}

	events := etcdEvents(t)
	holder := e.run(t, events, "forever", lock, "holder-1")
	evs := waitEvents(t, events, 10*time.Second, "the holder's child", etcdHas("start", "holder-1"))
	child, _ := etcdFind(evs, "start", "holder-1")
	waiters := []*proc{e.run(t, events, "exit:0", lock, "waiter-1"), e.run(t, events, "exit:0", lock, "waiter-2")}
	e.waitWaiting(t, lock, 2)
	out, code = output(t, "status", "--lock", lock, "--zk-servers", e.servers)
	if code != 0 || !strings.Contains(out, "holder-1") || !strings.Contains(out, strconv.FormatUint(child.Token, 10)) {
		t.Errorf("status: exit %d, output:\n%s\nwant exit 0 naming holder-1 and token %d", code, out, child.Token)
	}
	t.Logf("status:\n%s", out)
	st, code := e.status(t, lock)
	if code != 0 || !st.Held || st.Identity != "holder-1" || st.Token != child.Token || st.Waiting != 2 ||
		st.Backend != "zookeeper" || !strings.HasPrefix(st.Key, "/leaderrun/st/_c_") || st.Remaining != -1 {
		t.Errorf("status --json: exit %d, %+v; want held by holder-1 with token %d, 2 waiting, its znode, remaining -1 (ZooKeeper does not tell)",
			code, st, child.Token)
	}

	holder.signal(syscall.SIGTERM)
	for _, p := range append(waiters, holder) {
		if code := p.wait(10 * time.Second); code != 0 {
			t.Errorf("exit %d, want 0:\n%s", code, p.stderr.String())
		}
	}
	evs = readEvents(t, events)
	out, code = output(t, "history", "--json", "--lock", lock, "--zk-servers", e.servers)
	if code != 0 {
		t.Fatalf("history --json: exit %d: %s", code, out)
	}
	terms := parseHistory(t, out)
	t.Logf("history --json:\n%s", out)
	if len(terms) != 3 {
		t.Fatalf("history lists %d terms, want 3", len(terms))
	}
	for i, term := range terms {
		// The holder was stopped by its SIGTERM; the waiters' jobs exited.
		end := map[bool]string{true: "stopped", false: "exited"}[term.Identity == "holder-1"]
		start, ok := etcdFind(evs, "start", term.Identity)
		if !ok || term.Token != start.Token || term.End != end || term.ExitCode != 0 {
			t.Errorf("term %d: %+v; want the child's token %d, %s 0", i, term, start.Token, end)
		}
		if i > 0 && term.Token >= terms[i-1].Token {
			t.Errorf("history not newest first: token %d after %d", term.Token, terms[i-1].Token)
		}
	}
	if terms[2].Identity != "holder-1" {
		t.Errorf("oldest term is %s's, want holder-1's", terms[2].Identity)
	}
	out, code = output(t, "status", "--lock", lock, "--zk-servers", e.servers)
	if code != 3 || !strings.Contains(out, terms[0].Identity) {
		t.Errorf("status after the last release: exit %d, output:\n%s\nwant exit 3 and the last term, %s's", code, out, terms[0].Identity)
	}
}

// testZKCheck: `leaderrun check` in the child exits 0 while leading, and
// 1 within 100 ms of the leader's znode being deleted.
func testZKCheck(t *testing.T, e *zkEnv) {
	const lock = "chk"
	out, job := checkJob(t)
	p := start(t, nil, e.args(lock, "checker", "--kill-grace", "2s", "--lease-duration", "5s", "--shell", "--", job)...)
	waitFor(t, 10*time.Second, "a successful check", func() bool { return len(checks(out, 0)) > 0 })
	st, code := e.status(t, lock)
	if code != 0 {
		t.Fatalf("status exit %d", code)
	}
	deleted := time.Now()
	if err := e.admin.Delete(st.Key, -1); err != nil {
		t.Fatal(err)
	}
	expectCheckFails(t, p, out, deleted)
}

// testZKTryAndWait: --try on a held lock exits 75 at once and leaves no
// candidate behind; --wait gives up after its duration and withdraws; a
// waiting candidate that gets SIGTERM withdraws at once.
func testZKTryAndWait(t *testing.T, e *zkEnv) {
	const lock = "tw"
	events := etcdEvents(t)
	e.run(t, events, "forever", lock, "holder")
	waitEvents(t, events, 10*time.Second, "the holder's child", etcdHas("start", "holder"))

	var took []time.Duration
	for range 3 {
		began := time.Now()
		if code := e.run(t, events, "exit:0", lock, "try", "--try").wait(10 * time.Second); code != 75 {
			t.Errorf("--try on a held lock exited %d, want 75", code)
		}
		took = append(took, time.Since(began))
	}
	slices.Sort(took)
	t.Logf("--try on a held lock: exit 75 after %v (median of 3, process start included; slowest %v)",
		took[1].Round(time.Millisecond), took[2].Round(time.Millisecond))
	if took[1] > time.Second {
		t.Errorf("--try took %v, want well under a second", took[1])
	}
	if cs := e.candidates(t, lock); len(cs) != 1 {
		t.Errorf("after --try, candidates %v, want the holder's alone", cs)
	}

	began := time.Now()
	if code := e.run(t, events, "exit:0", lock, "wait", "--wait", "1s").wait(10 * time.Second); code != 75 {
		t.Errorf("--wait 1s on a held lock exited %d, want 75", code)
	}
	gaveUp := time.Since(began)
	t.Logf("--wait 1s on a held lock: exit 75 after %v (process start included)", gaveUp.Round(time.Millisecond))
	if gaveUp < time.Second || gaveUp > 3*time.Second {
		t.Errorf("--wait 1s gave up after %v", gaveUp)
	}
	if cs := e.candidates(t, lock); len(cs) != 1 {
		t.Errorf("after --wait gave up, candidates %v, want the holder's alone", cs)
	}

	w := e.run(t, events, "exit:0", lock, "waiter")
	e.waitWaiting(t, lock, 1)
	w.signal(syscall.SIGTERM)
	if code := w.wait(3 * time.Second); code != 128+int(syscall.SIGTERM) {
		t.Errorf("waiter interrupted by SIGTERM exited %d, want %d", code, 128+int(syscall.SIGTERM))
	}
	if cs := e.candidates(t, lock); len(cs) != 1 {
		t.Errorf("after the waiter withdrew, candidates %v, want the holder's alone", cs)
	}
	if evs := readEvents(t, events); count(evs, "start") != 1 {
		t.Errorf("children started:\n%s\nwant only the holder's", formatEvents(evs))
	}
}

// testZKUnreachable: an ensemble that refuses connections, or accepts
// them and says nothing, is exit 69 within about the connect timeout,
// with a message naming every server.
func testZKUnreachable(t *testing.T, e *zkEnv) {
	refused := fmt.Sprintf("127.0.0.1:%d", testenv.FreePort(t, "127.0.0.1"))
	// A listener that never accepts: the kernel completes the handshake
	// and holds what the client sends, and nothing ever answers.
	silent, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer silent.Close()
	refused2 := fmt.Sprintf("127.0.0.1:%d", testenv.FreePort(t, "127.0.0.1"))
	for _, tc := range []struct {
		name    string
		servers []string
		args    []string
	}{
		{"Refused", []string{refused}, nil},
		{"RefusedEnsemble", []string{refused, refused2}, nil},
		{"RefusedTry", []string{refused}, []string{"--try"}},
		{"Silent", []string{silent.Addr().String()}, nil},
		{"Status", []string{refused}, []string{"status"}},
		{"StatusTimeout", []string{silent.Addr().String()}, []string{"status", "--timeout", "300ms"}},
		{"History", []string{refused}, []string{"history"}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			args := []string{"--lock", "unreachable", "--zk-servers", strings.Join(tc.servers, ","), "--zk-connect-timeout", "1s"}
			if cmd := tc.args; len(cmd) > 0 && (cmd[0] == "status" || cmd[0] == "history") {
				args = append(slices.Clone(cmd), args...)
			} else {
				args = append(append(append(append(args, zkTimings...), tc.args...), "--"), childArgv(t)...)
			}
			began := time.Now()
			out, code := output(t, args...)
			took := time.Since(began)
			t.Logf("exit %d after %v: %s", code, took.Round(time.Millisecond), strings.TrimSpace(out))
			if code != 69 {
				t.Errorf("exit %d, want 69", code)
			}
			for _, s := range tc.servers {
				if !strings.Contains(out, s) {
					t.Errorf("message does not name %s", s)
				}
			}
			if took > 3*time.Second {
				t.Errorf("took %v, want about the 1s connect timeout", took)
			}
		})
	}
}

// testZKAuth: with --zk-auth-file, the znodes leaderrun creates are
// writable by that identity only (readable by all): the same credentials
// get the lock again; a wrong password, or none, is exit 69 at once,
// naming the servers and the refusal; status needs no credentials.
func testZKAuth(t *testing.T, e *zkEnv) {
	dir := t.TempDir()
	file := func(name, content string) string {
		p := filepath.Join(dir, name)
		if err := os.WriteFile(p, []byte(content), 0o600); err != nil {
			t.Fatal(err)
		}
		return p
	}
	const password = "zk-s3cret"
	good, wrong := file("good", "leaderrun:"+password+"\n"), file("wrong", "leaderrun:not-it\n")
	events := etcdEvents(t)
	prefix := []string{"--prefix", "authed/"}
	for _, id := range []string{"first", "again"} {
		if code := e.run(t, events, "exit:0", "auth", id, append(prefix, "--zk-auth-file", good)...).wait(10 * time.Second); code != 0 {
			t.Errorf("%s run with the credentials: exit %d, want 0", id, code)
		}
	}
	acl, _, err := e.admin.GetACL("/authed/auth")
	if err != nil {
		t.Fatal(err)
	}
	t.Logf("ACL of /authed/auth: %+v", acl)
	if len(acl) != 2 || acl[0].Scheme != "digest" || !strings.HasPrefix(acl[0].ID, "leaderrun:") || acl[0].Perms != zk.PermAll ||
		acl[1].Scheme != "world" || acl[1].Perms != zk.PermRead {
		t.Errorf("ACL of the lock's znode %+v, want all for leaderrun's digest and read for the world", acl)
	}
	for _, tc := range []struct {
		name  string
		extra []string
	}{
		{"WrongPassword", []string{"--zk-auth-file", wrong}},
		{"NoCredentials", nil},
	} {
		t.Run(tc.name, func(t *testing.T) {
			args := append(append(append(e.args("auth", tc.name), prefix...), tc.extra...), "--", "/bin/true")
			began := time.Now()
			out, code := output(t, args...)
			t.Logf("exit %d after %v: %s", code, time.Since(began).Round(time.Millisecond), strings.TrimSpace(out))
			if code != 69 || !strings.Contains(out, e.servers) || !strings.Contains(out, "refused") {
				t.Errorf("exit %d, output %q; want 69 naming %s and the refusal", code, out, e.servers)
			}
			if strings.Contains(out, password) || strings.Contains(out, "not-it") {
				t.Errorf("the output shows a password: %s", out)
			}
		})
	}
	out, code := output(t, "status", "--lock", "auth", "--zk-servers", e.servers, "--prefix", "authed/")
	if code != 3 {
		t.Errorf("status without credentials: exit %d, want 3 (no leader):\n%s", code, out)
	}
	// The auth file's name, given in the environment, stays out of the
	// job's unless --pass-credentials.
	for _, pass := range []bool{false, true} {
		env := filepath.Join(t.TempDir(), "env")
		args := append(e.args("auth", "env", "--prefix", "authed/"), "--shell")
		if pass {
			args = append(args, "--pass-credentials")
		}
		p := start(t, []string{"LEADERRUN_ZK_AUTH_FILE=" + good}, append(args, "--", "env > "+env)...)
		if code := p.wait(10 * time.Second); code != 0 {
			t.Fatalf("with LEADERRUN_ZK_AUTH_FILE: exit %d:\n%s", code, p.stderr.String())
		}
		data, err := os.ReadFile(env)
		if err != nil {
			t.Fatal(err)
		}
		if got := strings.Contains(string(data), "LEADERRUN_ZK_AUTH_FILE="); got != pass {
			t.Errorf("--pass-credentials %v: LEADERRUN_ZK_AUTH_FILE in the job's environment: %v", pass, got)
		}
	}
	if evs := readEvents(t, events); count(evs, "start") != 2 {
		t.Errorf("children started:\n%s\nwant the two authenticated runs'", formatEvents(evs))
	}
}

// testZKOnceFailures: a job that exits 1 records nothing and the next
// candidate runs it; a job whose leader's znode an operator deletes (the
// job does it, with zkCli, before it exits 0) records nothing, its
// leaderrun exits 76, and the next candidate runs the job; after a
// success, the next one skips; history shows it all.
func testZKOnceFailures(t *testing.T, e *zkEnv) {
	const lock = "nightly"
	args := append([]string{"--zk-servers", e.servers, "--lock", lock}, zkTimings...)
	var cli []string
	for _, a := range e.z.CLICommand() {
		cli = append(cli, shellQuote(a))
	}
	del := fmt.Sprintf(`key=$(%s status --json --lock %s --zk-servers %s | sed -n 's/.*"key":"\([^"]*\)".*/\1/p') && %s delete "$key" >/dev/null 2>&1`,
		testenv.Leaderrun(t), lock, e.servers, strings.Join(cli, " "))
	onceFailures(t, args, del)
	out, code := output(t, "history", "--zk-servers", e.servers, "--lock", lock)
	if code != 0 || !strings.Contains(out, "exited 1") || !strings.Contains(out, "lost") || !strings.Contains(out, "skipped") {
		t.Errorf("history (exit %d):\n%s", code, out)
	}
	t.Logf("history:\n%s", out)
}

// testZKEscapedHelper (S9): the job's helper that left its group and
// ignores SIGTERM dies within --kill-grace of the first kill signal, with
// a lease whose TTL leaves one grace of margin (3.6 s − 500 ms − 100 ms =
// 3 s = deadline 2 s + grace 0.9 s + 0.1 s). A stalled link keeps the lock
// from the follower until the session expires, after the old tree is
// dead; a deleted znode frees it at once, so there only the one deadline
// is checked (the token protects the resource during the grace).
func testZKEscapedHelper(t *testing.T, e *zkEnv) {
	timings := []string{"--lease-duration", "3600ms", "--renew-deadline", "2s", "--retry-period", "500ms", "--kill-grace", escapeGrace.String()}
	args := func(addr, lock, id string) []string {
		return append([]string{"--zk-servers", addr, "--lock", lock, "--identity", id}, timings...)
	}
	queued := func(lock string) bool {
		st, _ := e.status(t, lock)
		return st.Waiting == 1
	}
	escapeOnStore(t, e.servers, e.servers, args, queued, []escapeFault{
		{name: "stalled link", ordered: true, fault: func(t *testing.T, proxy *testenv.Proxy, lock string) { proxy.Stall() }},
		{name: "znode deleted", fault: func(t *testing.T, proxy *testenv.Proxy, lock string) {
			st, code := e.status(t, lock)
			if code != 0 {
				t.Fatalf("status exit %d", code)
			}
			if err := e.admin.Delete(st.Key, -1); err != nil {
				t.Fatal(err)
			}
		}},
	})
}

func shellQuote(s string) string { return "'" + strings.ReplaceAll(s, "'", `'\''`) + "'" }

// zkOnceTimings: a session timeout short enough for a takeover after a
// kill -9 inside the fleet's --wait 3s; TTL 2 s − 250 ms − 100 ms =
// 1.65 s > 1 s + 400 ms.
var zkOnceTimings = []string{"--lease-duration", "2s", "--renew-deadline", "1s", "--retry-period", "250ms", "--kill-grace", "400ms"}

// TestZooKeeperOncePerPeriod: the fleet's crontab on ZooKeeper (issue 16's
// simulated cron: 10 periods of 4 s, kill -9 of the leader in 3 of them).
func TestZooKeeperOncePerPeriod(t *testing.T) {
	servers := strings.Join(testenv.StartZooKeeper(t, 1).Servers(), ",")
	const lock = "cron"
	cronFleet{
		args: func(int) []string {
			return append([]string{"--zk-servers", servers, "--lock", lock}, zkOnceTimings...)
		},
		period: 4 * time.Second, wait: 3 * time.Second, periods: 10, kills: []int{2, 5, 8}, jobTime: time.Second,
		history: func(t *testing.T) []historyTerm {
			out, code := output(t, "history", "--json", "--limit", "100", "--zk-servers", servers, "--lock", lock)
			if code != 0 {
				t.Fatalf("history exit %d: %s", code, out)
			}
			return parseHistory(t, out)
		},
	}.run(t)
}

// TestZooKeeperDefaultTimings: on a server with ZooKeeper's default tick
// of 2 s, leaderrun's default timings (15 s lease, 10 s deadline, 2 s
// retry, 3 s grace) cannot be kept: a session of 15 s may expire 2 s + 1 s
// earlier than the runner counts, which leaves 12 s, not more than 10 s +
// 3 s. They are refused (exit 64) with a message that says which lease
// duration would do, before anything runs; that one runs.
func TestZooKeeperDefaultTimings(t *testing.T) {
	servers := strings.Join(testenv.StartZooKeeperTick(t, 1, 2*time.Second).Servers(), ",")
	events := etcdEvents(t)
	base := []string{"--zk-servers", servers, "--lock", "defaults"}
	began := time.Now()
	out, code := output(t, append(append(append(base, "--identity", "defaults"), "--"), childArgv(t)...)...)
	t.Logf("default timings: exit %d after %v:\n%s", code, time.Since(began).Round(time.Millisecond), out)
	if code != 64 {
		t.Errorf("default timings on a tick of 2s: exit %d, want 64", code)
	}
	for _, want := range []string{"granted a lease of 12s", "--lease-duration 15s", "--renew-deadline (10s)", "--kill-grace (3s)", "raise --lease-duration above 16s"} {
		if !strings.Contains(out, want) {
			t.Errorf("the refusal does not say %q", want)
		}
	}
	for _, lease := range []string{"16500ms", "20s"} {
		p := start(t, childEnv(events, "exit:0"), append(append(base, "--identity", "lease-"+lease, "--lease-duration", lease, "--"), childArgv(t)...)...)
		code := p.wait(30 * time.Second)
		log := p.stderr.String()
		ttl := log[strings.Index(log, "ttl="):]
		t.Logf("--lease-duration %s: exit %d, %s", lease, code, ttl[:strings.IndexAny(ttl, " \n")])
		if code != 0 {
			t.Errorf("--lease-duration %s: exit %d, want 0:\n%s", lease, code, log)
		}
	}
	if evs := readEvents(t, events); count(evs, "start") != 2 || count(readEvents(t, events), "exit") != 2 {
		t.Errorf("children:\n%s\nwant one per adequate lease duration, none for the defaults", formatEvents(evs))
	}
	if terms := parseHistory(t, mustOutput(t, "history", "--json", "--zk-servers", servers, "--lock", "defaults")); len(terms) != 3 ||
		terms[2].End != "not-started" {
		t.Errorf("history %+v: want the refused term (not-started) and the two runs", terms)
	}
}

func mustOutput(t *testing.T, args ...string) string {
	t.Helper()
	out, code := output(t, args...)
	if code != 0 {
		t.Fatalf("leaderrun %v: exit %d: %s", args, code, out)
	}
	return out
}
