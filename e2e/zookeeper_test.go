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
	"testing"
	"time"

	"github.com/go-zookeeper/zk"

	"github.com/leaderrun/leaderrun/internal/testenv"
)

// zkTestTimings keep the tests fast on the test servers (tick 200 ms, so
// a minimum session timeout of 400 ms): the ensemble grants the 3.5 s
// asked, and the lease's TTL leaves out the retry period and half a tick,
// 3.5 s − 500 ms − 100 ms = 2.9 s, more than the 2 s deadline + 500 ms
// grace.
var zkTestTimings = timings{lease: 3500 * time.Millisecond, deadline: 2 * time.Second, retry: 500 * time.Millisecond, grace: 500 * time.Millisecond}

var zkTimings = zkTestTimings.flags()

const zkSession = 3500 * time.Millisecond

// zookeeperStore is ZooKeeper in the scenarios' matrix: one standalone
// server. Candidates are ephemeral sequential znodes under
// /leaderrun/<lock>; each waiter watches the one before it.
func zookeeperStore() *store {
	return &store{
		name: "zookeeper", start: startZooKeeperStore, timings: zkTestTimings,
		// The ensemble expires the dead leader's session within its
		// timeout; the next in line is told at once.
		takeover: zkSession + time.Second, handover: 300 * time.Millisecond,
		notice: 100 * time.Millisecond, statusBound: zkSession + 5*time.Second,
		expires: true, waiters: true, durable: true, lostTerm: true,
		// A session timeout short enough for a takeover after a kill -9
		// inside the fleet's --wait 4s; TTL 2 s − 250 ms − 100 ms =
		// 1.65 s > 1 s + 400 ms.
		onceTimings: timings{lease: 2 * time.Second, deadline: time.Second, retry: 250 * time.Millisecond, grace: 400 * time.Millisecond},
		// TTL 3.6 s − 500 ms − 100 ms = 3 s = deadline 2 s + grace 0.9 s + 0.1 s.
		escapeTimings: timings{lease: 3600 * time.Millisecond, deadline: 2 * time.Second, retry: 500 * time.Millisecond, grace: escapeGrace},
	}
}

func startZooKeeperStore(t *testing.T) *target {
	z := testenv.StartZooKeeper(t, 1)
	e := newZKEnv(t, z)
	flags := []string{"--zk-servers", e.servers}
	znode := func(t *testing.T, e *env, lock string) string {
		st, code := e.status(t, lock)
		if code != 0 {
			t.Fatalf("status of %s: exit %d, want 0 (held)", lock, code)
		}
		return st.Key
	}
	member := z.Members[0]
	return &target{
		flags: flags, waiting: statusWaiting(flags, nil), key: keyUnder("/leaderrun/%s/_c_"),
		link: e.servers,
		via:  func(addr string) ([]string, []string) { return []string{"--zk-servers", addr}, nil },
		// zkCli's figures are counted from its exit: its JVM takes a
		// second or more to start.
		losses: []loss{
			{name: "GoClient", says: []string{"was deleted"}, do: func(t *testing.T, se *env, lock string) time.Time {
				path := znode(t, se, lock)
				sent := time.Now()
				if err := e.admin.Delete(path, -1); err != nil {
					t.Fatal(err)
				}
				return sent
			}},
			{name: "ZkCli", says: []string{"was deleted"}, do: func(t *testing.T, se *env, lock string) time.Time {
				e.cli(t, "delete", znode(t, se, lock))
				return time.Now()
			}},
			// The lock's whole tree deleted while it is held, with a
			// candidate waiting: a loss for the leader and a new queue for
			// the waiter, which takes over with a greater token. Nothing
			// can keep it from starting its child while the old one is
			// being stopped: forcing a held lock open is the operator's
			// decision, and only the token then keeps the resource safe.
			{name: "LockDeletedWhileHeld", takeover: true, do: func(t *testing.T, _ *env, lock string) time.Time {
				e.cli(t, "deleteall", "/leaderrun/"+lock)
				return time.Now()
			}},
		},
		// The sequence numbers start again from 0; the tokens (czxids)
		// go on growing (TestZooKeeper/SequenceAfterDeleteAll).
		wipe: func(t *testing.T, lock string) {
			e.cli(t, "deleteall", "/leaderrun/"+lock)
			if ok, _, _ := e.admin.Exists("/leaderrun/" + lock); ok {
				t.Fatalf("/leaderrun/%s still exists after deleteall", lock)
			}
		},
		loseCommand: func(t *testing.T, lock string) string {
			var cli []string
			for _, a := range z.CLICommand() {
				cli = append(cli, shellQuote(a))
			}
			return fmt.Sprintf(`key=$(%s status --json --lock %s --zk-servers %s | sed -n 's/.*"key":"\([^"]*\)".*/\1/p') && %s delete "$key" >/dev/null 2>&1`,
				testenv.Leaderrun(t), lock, e.servers, strings.Join(cli, " "))
		},
		record:     func(t *testing.T, lock string) string { return strings.Join(e.candidates(t, lock), " ") },
		stopServer: member.Stop, startServer: member.Start,
	}
}

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

// TestZooKeeper runs what only ZooKeeper has, on one standalone server:
// its sequence numbers, its errors, its digest authentication.
func TestZooKeeper(t *testing.T) {
	t.Parallel()
	e := newZKEnv(t, testenv.StartZooKeeper(t, 1))
	for _, tc := range []struct {
		name string
		run  func(*testing.T, *zkEnv)
	}{
		{"SequenceAfterDeleteAll", testZKSequenceAfterDeleteAll},
		{"Unreachable", testZKUnreachable},
		{"DigestAuth", testZKAuth},
	} {
		t.Run(tc.name, func(t *testing.T) { tc.run(t, e) })
	}
}

// testZKSequenceAfterDeleteAll: three contenders hand the lock over; with
// nobody holding it, the operator deletes the lock's whole tree with
// zkCli's deleteall; three more hand it over. The znodes' sequence
// numbers start again from 0, the tokens (czxids) go on growing, and two
// children never run at once.
func testZKSequenceAfterDeleteAll(t *testing.T, e *zkEnv) {
	const lock = "sequence"
	events := etcdEvents(t)
	wave := func(first int) (firstSeq, lastSeq int) {
		firstSeq = -1
		var procs []*proc
		for i := range 3 {
			procs = append(procs, e.run(t, events, "sleep:300ms", lock, fmt.Sprintf("i%d", first+i)))
		}
		waitFor(t, 30*time.Second, "the wave's children to run", every(20*time.Millisecond, func() bool {
			if st, code := e.status(t, lock); code == 0 {
				lastSeq = seqOf(t, st.Key)
				if firstSeq < 0 {
					firstSeq = lastSeq
				}
			}
			return !slices.ContainsFunc(procs, func(p *proc) bool { return !p.exited() })
		}))
		for _, p := range procs {
			if p.code != 0 {
				t.Fatalf("an instance exited %d:\n%s", p.code, p.stderr.String())
			}
		}
		return firstSeq, lastSeq
	}
	_, seqBefore := wave(0)
	e.cli(t, "deleteall", "/leaderrun/"+lock)
	seqAfter, _ := wave(3)
	ivs := checkExclusive(t, readEvents(t, events))
	if len(ivs) != 6 {
		t.Fatalf("%d children ran, want 6", len(ivs))
	}
	t.Logf("leaders' znode sequence numbers, as status saw them: up to %d before the deleteall, from %d after it; tokens %d to %d",
		seqBefore, seqAfter, ivs[0].Token, ivs[5].Token)
	if seqAfter >= seqBefore {
		t.Errorf("sequence numbers did not start again after the deleteall (%d, then %d): was the tree deleted?", seqBefore, seqAfter)
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
		// A waiting run retries until its --wait ends.
		{"Refused", []string{refused}, []string{"--wait", "1s"}},
		{"RefusedEnsemble", []string{refused, refused2}, []string{"--wait", "1s"}},
		{"RefusedTry", []string{refused}, []string{"--try"}},
		{"Silent", []string{silent.Addr().String()}, []string{"--wait", "1s"}},
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
			if took > 4*time.Second {
				t.Errorf("took %v, want about the 1s connect timeout (or --wait 1s)", took)
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

func shellQuote(s string) string { return "'" + strings.ReplaceAll(s, "'", `'\''`) + "'" }

// TestZooKeeperDefaultTimings: on a server with ZooKeeper's default tick
// of 2 s, leaderrun's default timings (15 s lease, 10 s deadline, 2 s
// retry, 3 s grace) cannot be kept: a session of 15 s may expire 2 s + 1 s
// earlier than the runner counts, which leaves 12 s, not more than 10 s +
// 3 s. They are refused (exit 64) with a message that says which lease
// duration would do, before anything runs; that one runs.
func TestZooKeeperDefaultTimings(t *testing.T) {
	t.Parallel()
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
