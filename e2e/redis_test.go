//go:build linux

package e2e

import (
	"context"
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	goredis "github.com/redis/go-redis/v9"

	"github.com/leaderrun/leaderrun/internal/testenv"
)

// redisTimings keep the tests fast: the server expires a lease 3 s after
// its last renewal by its own clock; the child gets the kill signal 2 s
// after the send time of the last acknowledged renewal and SIGKILL 500 ms
// later, so it is dead at least 500 ms before anyone can take the lock.
var redisTimings = []string{"--lease-duration", "3s", "--renew-deadline", "2s", "--retry-period", "500ms", "--kill-grace", "500ms"}

const redisLease = 3 * time.Second

const redisPassword = "e2e-Redis-pa55"

// redisEnv is the server the Redis tests share (a password, AOF with
// appendfsync always, TLS beside plain TCP) and a client of its own that
// plays the operator.
type redisEnv struct {
	r     *testenv.Redis
	admin *goredis.Client
}

// TestRedis runs the binary against a real redis-server: every "Must
// show" of the Redis backend that needs one server. The subtests run one
// after the other: most of them measure reaction times.
func TestRedis(t *testing.T) {
	r := testenv.StartRedis(t, testenv.RedisOptions{Password: redisPassword, AOF: true, TLS: true})
	e := &redisEnv{r: r, admin: r.Client(t)}
	if err := e.admin.Ping(context.Background()).Err(); err != nil {
		t.Fatal(err)
	}
	for _, tc := range []struct {
		name string
		run  func(*testing.T, *redisEnv)
	}{
		{"Handovers", testRedisHandovers},
		{"KeyDeletedByHand", testRedisKeyDeleted},
		{"Kill9Leader", testRedisKill9Leader},
		{"SigtermHandover", testRedisSigtermHandover},
		{"TryAndWait", testRedisTryAndWait},
		{"StatusAndHistory", testRedisStatusAndHistory},
		{"Check", testRedisCheck},
		{"TLSWithPassword", testRedisTLS},
		{"CredentialsStayOut", testRedisCredentials},
		{"Unreachable", testRedisUnreachable},
		{"OnceFailures", testRedisOnceFailures},
		{"OncePerPeriodCron", testRedisOnceCron},
	} {
		t.Run(tc.name, func(t *testing.T) { tc.run(t, e) })
	}
}

// url is the server's URL with the password, for the operator's commands
// (status, history) run by the test.
func (e *redisEnv) url() string { return e.r.URL() }

// run starts leaderrun on lock with the URL in LEADERRUN_REDIS_URL, and
// without the password, which comes from REDISCLI_AUTH (as the flag's help
// recommends: nothing secret on the command line), with the recording
// child in mode.
func (e *redisEnv) run(t *testing.T, events, mode, lock, id string, extra ...string) *proc {
	t.Helper()
	args := append([]string{"--lock", lock, "--identity", id}, redisTimings...)
	args = append(append(args, extra...), "--")
	env := append(childEnv(events, mode), "LEADERRUN_REDIS_URL=redis://"+e.r.Addr(), "REDISCLI_AUTH="+redisPassword)
	return start(t, env, append(args, childArgv(t)...)...)
}

// status is `leaderrun status --json` parsed, and its exit code.
func (e *redisEnv) status(t *testing.T, lock string) (etcdStatus, int) {
	t.Helper()
	out, code := output(t, "status", "--json", "--lock", lock, "--redis-url", e.url())
	var st etcdStatus
	if code == 0 || code == 3 {
		if err := json.Unmarshal([]byte(out), &st); err != nil {
			t.Fatalf("status --json printed %q: %v", out, err)
		}
	}
	return st, code
}

func (e *redisEnv) waitWaiting(t *testing.T, lock string, n int) {
	t.Helper()
	waitFor(t, 10*time.Second, fmt.Sprintf("%d candidates to queue behind the leader", n), func() bool {
		st, _ := e.status(t, lock)
		return st.Waiting == n
	})
}

// testRedisHandovers: three contenders at a time hand the lock over until
// 15 children ran (200 ms each): never two children at once, every new
// token greater than the one before.
func testRedisHandovers(t *testing.T, e *redisEnv) {
	const lock, together, children = "handovers", 3, 15
	events := etcdEvents(t)
	var procs []*proc
	for i := range children {
		procs = append(procs, e.run(t, events, "sleep:200ms", lock, fmt.Sprintf("h%02d", i)))
		if i >= together-1 {
			// Keep about three candidates at a time.
			waitEvents(t, events, 30*time.Second, "a child to exit", func(evs []event) bool { return count(evs, "exit") >= i-together+2 })
		}
	}
	for _, p := range procs {
		if code := p.wait(30 * time.Second); code != 0 {
			t.Fatalf("an instance exited %d:\n%s", code, p.stderr.String())
		}
	}
	evs := readEvents(t, events)
	if n := count(evs, "start"); n != children {
		t.Fatalf("%d children started, want %d", n, children)
	}
	ivs := checkExclusive(t, evs)
	t.Logf("%d terms, tokens %d..%d", len(ivs), ivs[0].Token, ivs[len(ivs)-1].Token)
}

// testRedisKeyDeletedByHand (S3): an operator deletes the lock's key while
// the leader runs: the child gets its kill signal within 1 s (Redis
// announces the DEL to the lease's tracking connection: milliseconds),
// leaderrun exits 76 saying why, and the follower's child starts with a
// greater token.
func testRedisKeyDeleted(t *testing.T, e *redisEnv) {
	const lock = "deleted"
	events := etcdEvents(t)
	leader := e.run(t, events, "forever", lock, "leader")
	evs := waitEvents(t, events, 10*time.Second, "the leader's child", etcdHas("start", "leader"))
	old, _ := etcdFind(evs, "start", "leader")
	follower := e.run(t, events, "forever", lock, "follower")
	e.waitWaiting(t, lock, 1)
	deleted := time.Now()
	if n, err := e.admin.Del(context.Background(), "leaderrun/"+lock).Result(); err != nil || n != 1 {
		t.Fatalf("DEL: %d, %v", n, err)
	}
	evs = waitEvents(t, events, 5*time.Second, "the leader's child to be signalled", etcdHas("signal", "leader"))
	sig, _ := etcdFind(evs, "signal", "leader")
	t.Logf("the leader's child got %s %v after the DEL", sig.Rest, sig.At.Sub(deleted).Round(time.Millisecond))
	if sig.At.Sub(deleted) > time.Second {
		t.Errorf("the child was signalled %v after the key was deleted, want within 1s (S3)", sig.At.Sub(deleted))
	}
	if code := leader.wait(5 * time.Second); code != 76 {
		t.Errorf("leader exited %d, want 76", code)
	}
	if out := leader.stderr.String(); !strings.Contains(out, "is gone") {
		t.Errorf("the leader does not say its key is gone:\n%s", out)
	}
	evs = waitEvents(t, events, 5*time.Second, "the follower's child", etcdHas("start", "follower"))
	next, _ := etcdFind(evs, "start", "follower")
	if next.Token <= old.Token {
		t.Errorf("follower's token %d not greater than %d", next.Token, old.Token)
	}
	checkExclusive(t, evs)
	follower.signal(syscall.SIGTERM)
	follower.wait(5 * time.Second)
}

// testRedisKill9Leader: kill -9 of the leader kills its child at once
// (S4), and the follower's child starts within the lease + 0.3 s of the
// kill: the follower, first in the queue, sleeps until the lease expires
// by the server's clock.
func testRedisKill9Leader(t *testing.T, e *redisEnv) {
	const lock = "kill9"
	var took []time.Duration
	for trial := range 3 {
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
		evs = waitEvents(t, events, redisLease+3*time.Second, "the follower's child", etcdHas("start", "follower"))
		next, _ := etcdFind(evs, "start", "follower")
		d := next.At.Sub(killed)
		took = append(took, d)
		t.Logf("trial %d: old child gone within %v; follower's child started %v after the kill (lease %v); tokens %d then %d",
			trial, gone.Round(time.Microsecond), d.Round(time.Millisecond), redisLease, old.Token, next.Token)
		if gone > time.Second {
			t.Errorf("old child outlived leaderrun by %v, want under 1s", gone)
		}
		if d > redisLease+300*time.Millisecond {
			t.Errorf("follower's child started %v after the kill, want within the lease + 0.3s (%v)", d, redisLease+300*time.Millisecond)
		}
		if next.Token <= old.Token {
			t.Errorf("follower's token %d not greater than %d", next.Token, old.Token)
		}
		follower.signal(syscall.SIGTERM)
		follower.wait(5 * time.Second)
	}
	slices.Sort(took)
	t.Logf("kill -9 failover: %v .. %v (lease %v)", took[0].Round(time.Millisecond), took[len(took)-1].Round(time.Millisecond), redisLease)
}

// testRedisSigtermHandover (S6, S8): SIGTERM stops the leader's child,
// releases the lock (which wakes the first waiter), and the follower's
// child starts within 300 ms of the old child's exit.
func testRedisSigtermHandover(t *testing.T, e *redisEnv) {
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

// testRedisTryAndWait: --try on a held lock exits 75 at once and joins no
// queue; --wait gives up after its duration and leaves the queue; a
// waiting candidate that gets SIGTERM leaves at once.
func testRedisTryAndWait(t *testing.T, e *redisEnv) {
	const lock = "tw"
	events := etcdEvents(t)
	e.run(t, events, "forever", lock, "holder")
	waitEvents(t, events, 10*time.Second, "the holder's child", etcdHas("start", "holder"))
	queue := func() int64 {
		n, _ := e.admin.ZCard(context.Background(), "leaderrun/:waiters:"+lock).Result()
		return n
	}
	var took []time.Duration
	for range 3 {
		began := time.Now()
		if code := e.run(t, events, "exit:0", lock, "try", "--try").wait(10 * time.Second); code != 75 {
			t.Errorf("--try on a held lock exited %d, want 75", code)
		}
		took = append(took, time.Since(began))
	}
	slices.Sort(took)
	t.Logf("--try on a held lock: exit 75 after %v (median of 3, process start included)", took[1].Round(time.Millisecond))
	if took[1] > time.Second {
		t.Errorf("--try took %v, want well under a second", took[1])
	}
	if n := queue(); n != 0 {
		t.Errorf("after --try, %d queued", n)
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
	if n := queue(); n != 0 {
		t.Errorf("after --wait gave up, %d queued", n)
	}
	w := e.run(t, events, "exit:0", lock, "waiter")
	e.waitWaiting(t, lock, 1)
	w.signal(syscall.SIGTERM)
	if code := w.wait(3 * time.Second); code != 128+int(syscall.SIGTERM) {
		t.Errorf("waiter interrupted by SIGTERM exited %d, want %d", code, 128+int(syscall.SIGTERM))
	}
	if n := queue(); n != 0 {
		t.Errorf("after the waiter withdrew, %d queued", n)
	}
	if evs := readEvents(t, events); count(evs, "start") != 1 {
		t.Errorf("children started:\n%s\nwant only the holder's", formatEvents(evs))
	}
}

// testRedisStatusAndHistory: exit 3 without a leader; exit 0 with the
// leader's identity and token (the child's FENCE_TOKEN), its lease and
// what is left of it by the server's clock, and the waiting candidates;
// the terms, newest first, once released.
func testRedisStatusAndHistory(t *testing.T, e *redisEnv) {
	const lock = "st"
	out, code := output(t, "status", "--lock", lock, "--redis-url", e.url())
	if code != 3 || !strings.Contains(out, "none") {
		t.Errorf("status of a free lock: exit %d, output:\n%s\nwant exit 3 and leader none", code, out)
	}
	if out, code := output(t, "history", "--lock", lock, "--redis-url", e.url()); code != 0 || out != "" {
		t.Errorf("history of an unused lock: exit %d, output %q; want 0 and nothing", code, out)
	}
	events := etcdEvents(t)
	holder := e.run(t, events, "forever", lock, "holder-1")
	evs := waitEvents(t, events, 10*time.Second, "the holder's child", etcdHas("start", "holder-1"))
	child, _ := etcdFind(evs, "start", "holder-1")
	waiters := []*proc{e.run(t, events, "exit:0", lock, "waiter-1"), e.run(t, events, "exit:0", lock, "waiter-2")}
	e.waitWaiting(t, lock, 2)
	out, code = output(t, "status", "--lock", lock, "--redis-url", e.url())
	if code != 0 || !strings.Contains(out, "holder-1") || !strings.Contains(out, strconv.FormatUint(child.Token, 10)) {
		t.Errorf("status: exit %d, output:\n%s\nwant exit 0 naming holder-1 and token %d", code, out, child.Token)
	}
	t.Logf("status:\n%s", out)
	st, code := e.status(t, lock)
	if code != 0 || !st.Held || st.Identity != "holder-1" || st.Token != child.Token || st.Waiting != 2 ||
		st.Backend != "redis" || st.Key != "leaderrun/"+lock || st.TTL != int64(redisLease) ||
		st.Remaining <= 0 || st.Remaining > int64(redisLease) {
		t.Errorf("status --json: exit %d, %+v; want held by holder-1 with token %d, 2 waiting, TTL 3s and 0 < remaining <= 3s", code, st, child.Token)
	}
	holder.signal(syscall.SIGTERM)
	for _, p := range append(waiters, holder) {
		if code := p.wait(10 * time.Second); code != 0 {
			t.Errorf("exit %d, want 0:\n%s", code, p.stderr.String())
		}
	}
	evs = readEvents(t, events)
	out, code = output(t, "history", "--json", "--lock", lock, "--redis-url", e.url())
	if code != 0 {
		t.Fatalf("history --json: exit %d: %s", code, out)
	}
	terms := parseHistory(t, out)
	t.Logf("history --json:\n%s", out)
	if len(terms) != 3 {
		t.Fatalf("history lists %d terms, want 3", len(terms))
	}
	for i, term := range terms {
		end := map[bool]string{true: "stopped", false: "exited"}[term.Identity == "holder-1"]
		start, ok := etcdFind(evs, "start", term.Identity)
		if !ok || term.Token != start.Token || term.End != end || term.ExitCode != 0 {
			t.Errorf("term %d: %+v; want the child's token %d, %s 0", i, term, start.Token, end)
		}
		if i > 0 && term.Token >= terms[i-1].Token {
			t.Errorf("history not newest first: token %d after %d", term.Token, terms[i-1].Token)
		}
	}
}

// testRedisCheck: `leaderrun check` in the child exits 0 while leading,
// and 1 within 100 ms of the lock's key being deleted (the lease tracks
// its key: Redis announces the DEL); leaderrun exits 76.
func testRedisCheck(t *testing.T, e *redisEnv) {
	const lock = "chk"
	out, job := checkJob(t)
	p := start(t, []string{"REDISCLI_AUTH=" + redisPassword}, append(append([]string{"--redis-url", "redis://" + e.r.Addr(),
		"--lock", lock, "--identity", "checker"}, redisTimings...), "--kill-grace", "2s", "--lease-duration", "5s", "--shell", "--", job)...)
	waitFor(t, 10*time.Second, "a successful check", func() bool { return len(checks(out, 0)) > 0 })
	deleted := time.Now()
	if err := e.admin.Del(context.Background(), "leaderrun/"+lock).Err(); err != nil {
		t.Fatal(err)
	}
	expectCheckFails(t, p, out, deleted)
}

// testRedisTLS: rediss:// with the server's certificate checked against
// the test's CA (--redis-cacert), the password from REDISCLI_AUTH, with
// and without a client certificate; status and history over TLS too. A
// wrong password or no CA is exit 69 without showing the password.
func testRedisTLS(t *testing.T, e *redisEnv) {
	const lock = "tls"
	tlsURL := "rediss://" + e.r.TLSAddr()
	events := etcdEvents(t)
	for _, tc := range []struct {
		name  string
		extra []string
	}{
		{"server certificate", []string{"--redis-cacert", e.r.CAFile()}},
		{"client certificate", []string{"--redis-cacert", e.r.CAFile(), "--redis-cert", e.r.ClientCertFile(), "--redis-key", e.r.ClientKeyFile()}},
	} {
		id := strings.ReplaceAll(tc.name, " ", "-")
		args := append(append([]string{"--redis-url", tlsURL, "--lock", lock, "--identity", id}, redisTimings...), tc.extra...)
		p := start(t, append(childEnv(events, "exit:0"), "REDISCLI_AUTH="+redisPassword), append(append(args, "--"), childArgv(t)...)...)
		if code := p.wait(20 * time.Second); code != 0 {
			t.Errorf("%s: exit %d:\n%s", tc.name, code, p.stderr.String())
		}
	}
	if n := count(readEvents(t, events), "start"); n != 2 {
		t.Errorf("%d children ran over TLS, want 2", n)
	}
	out, code := output(t, "history", "--lock", lock, "--redis-url", "rediss://:"+redisPassword+"@"+e.r.TLSAddr(), "--redis-cacert", e.r.CAFile())
	if code != 0 || strings.Count(out, "exited 0") != 2 {
		t.Errorf("history over TLS: exit %d:\n%s", code, out)
	}
	for _, tc := range []struct {
		name string
		env  []string
		args []string
		want string
	}{
		{"wrong password", []string{"REDISCLI_AUTH=wrong-" + redisPassword}, []string{"--redis-cacert", e.r.CAFile()}, "WRONGPASS"},
		{"no CA", []string{"REDISCLI_AUTH=" + redisPassword}, nil, "certificate"},
	} {
		args := append([]string{"--redis-url", tlsURL, "--lock", lock, "--try"}, tc.args...)
		p := start(t, tc.env, append(args, "--", "true")...)
		code := p.wait(20 * time.Second)
		out := p.stderr.String()
		if code != 69 || !strings.Contains(out, tc.want) || strings.Contains(out, redisPassword) {
			t.Errorf("%s: exit %d, want 69 saying %s and not the password:\n%s", tc.name, code, tc.want, out)
		}
	}
}

// testRedisCredentials: the URL in LEADERRUN_REDIS_URL and the password in
// REDISCLI_AUTH, whose only purpose here is the lock, do not reach the
// job unless --pass-credentials.
func testRedisCredentials(t *testing.T, e *redisEnv) {
	for _, pass := range []bool{false, true} {
		t.Run(map[bool]string{false: "default", true: "--pass-credentials"}[pass], func(t *testing.T) {
			out := filepath.Join(t.TempDir(), "env")
			args := append([]string{"--lock", "creds"}, redisTimings...)
			if pass {
				args = append(args, "--pass-credentials")
			}
			env := []string{"LEADERRUN_REDIS_URL=redis://" + e.r.Addr(), "REDISCLI_AUTH=" + redisPassword, "REDIS_HOST=cache.internal"}
			p := start(t, env, append(args, "--shell", "--", "env > "+out)...)
			if code := p.wait(20 * time.Second); code != 0 {
				t.Fatalf("exit %d:\n%s", code, p.stderr.String())
			}
			data, err := os.ReadFile(out)
			if err != nil {
				t.Fatal(err)
			}
			got := map[string]bool{}
			for _, line := range strings.Split(string(data), "\n") {
				name, _, _ := strings.Cut(line, "=")
				got[name] = true
			}
			for _, name := range []string{"LEADERRUN_REDIS_URL", "REDISCLI_AUTH"} {
				if got[name] != pass {
					t.Errorf("%s in the command's environment: %v, want %v", name, got[name], pass)
				}
			}
			for _, name := range []string{"REDIS_HOST", "FENCE_TOKEN"} {
				if !got[name] {
					t.Errorf("%s missing from the command's environment", name)
				}
			}
		})
	}
}

// testRedisUnreachable: nothing listens at the address: exit 69 at once,
// naming the address and not the password; status too.
func testRedisUnreachable(t *testing.T, e *redisEnv) {
	addr := fmt.Sprintf("127.0.0.1:%d", testenv.FreePort(t, "127.0.0.1"))
	url := "redis://:" + redisPassword + "@" + addr
	for _, args := range [][]string{
		{"--lock", "nowhere", "--redis-url", url, "--", "true"},
		{"--lock", "nowhere", "--redis-url", url, "--try", "--", "true"},
	} {
		began := time.Now()
		p := start(t, nil, args...)
		code := p.wait(10 * time.Second)
		out := p.stderr.String()
		if code != 69 || !strings.Contains(out, addr) || strings.Contains(out, redisPassword) {
			t.Errorf("%v: exit %d after %v, want 69 naming %s and not the password:\n%s", args, code, time.Since(began), addr, out)
		}
	}
	out, code := output(t, "status", "--lock", "nowhere", "--redis-url", url)
	if code != 69 || !strings.Contains(out, addr) || strings.Contains(out, redisPassword) {
		t.Errorf("status: exit %d:\n%s", code, out)
	}
}

// testRedisOnceFailures: --once-key on Redis (see onceFailures); the job
// that loses the lock deletes its leader's key with redis-cli, and lives
// on for a second: long enough for the lease to see the loss (about half
// a second) and stop it, so that the history says "lost". A job that
// exited at once would still exit 76 with no marker written (the marker
// is fenced by the lock's value), its term "exited 0".
func testRedisOnceFailures(t *testing.T, e *redisEnv) {
	args := append([]string{"--redis-url", e.url(), "--lock", "nightly"}, redisTimings...)
	del := redisCLI(t) + " -p " + strconv.Itoa(e.r.Port()) + " -a " + redisPassword +
		" --no-auth-warning DEL leaderrun/nightly >/dev/null && sleep 1"
	onceFailures(t, args, del)
	out, code := output(t, "history", "--redis-url", e.url(), "--lock", "nightly")
	if code != 0 || !strings.Contains(out, "exited 1") || !strings.Contains(out, "lost") || !strings.Contains(out, "skipped") {
		t.Errorf("history (exit %d):\n%s", code, out)
	}
	t.Logf("history:\n%s", out)
}

// redisCLI is redis-cli beside the server's binary, or in PATH.
func redisCLI(t *testing.T) string {
	t.Helper()
	p := filepath.Join(filepath.Dir(testenv.RedisBinary(t)), "redis-cli")
	if _, err := os.Stat(p); err != nil {
		t.Fatalf("redis-cli not found beside %s", testenv.RedisBinary(t))
	}
	return p
}

// redisOnceTimings: a lease short enough that a takeover after a kill -9
// fits in the fleet's --wait 3s.
var redisOnceTimings = []string{"--lease-duration", "2s", "--renew-deadline", "1200ms", "--retry-period", "300ms", "--kill-grace", "500ms"}

// testRedisOnceCron: the fleet's crontab (--wait, --once-per) on Redis.
func testRedisOnceCron(t *testing.T, e *redisEnv) {
	const lock = "cron"
	cronFleet{
		args: func(int) []string {
			return append([]string{"--redis-url", e.url(), "--lock", lock}, redisOnceTimings...)
		},
		period: 4 * time.Second, wait: 3 * time.Second, periods: 10, kills: []int{2, 5, 8}, jobTime: time.Second,
		history: func(t *testing.T) []historyTerm {
			out, code := output(t, "history", "--json", "--limit", "100", "--redis-url", e.url(), "--lock", lock)
			if code != 0 {
				t.Fatalf("history exit %d: %s", code, out)
			}
			return parseHistory(t, out)
		},
	}.run(t)
}

// TestRedisSentinel: one primary, one replica, one Sentinel on loopback,
// leaderrun finding the primary through the Sentinel.
//
//   - --redis-min-replicas 0 with a replica connected: leaderrun says once
//     what asynchronous replication risks.
//   - --redis-min-replicas 1 with the replica stopped: no child starts
//     (--wait gives up, exit 75), and leaderrun says why.
//   - the replica back: the child starts, and the replica holds the grant.
func TestRedisSentinel(t *testing.T) {
	primary := testenv.StartRedis(t, testenv.RedisOptions{Password: redisPassword, AOF: true})
	replica := testenv.StartRedis(t, testenv.RedisOptions{Password: redisPassword, AOF: true, ReplicaOf: primary})
	testenv.WaitReplicaSynced(t, replica)
	sentinel := testenv.StartSentinel(t, primary, "mymaster")
	env := []string{"LEADERRUN_REDIS_SENTINELS=" + sentinel.Addr(), "LEADERRUN_REDIS_SENTINEL_MASTER=mymaster",
		"REDISCLI_AUTH=" + redisPassword}
	run := func(events, mode, lock, id string, extra ...string) *proc {
		args := append(append([]string{"--lock", lock, "--identity", id}, redisTimings...), extra...)
		return start(t, append(childEnv(events, mode), env...), append(append(args, "--"), childArgv(t)...)...)
	}
	events := etcdEvents(t)

	p := run(events, "exit:0", "warned", "unreplicated")
	if code := p.wait(20 * time.Second); code != 0 {
		t.Fatalf("exit %d:\n%s", code, p.stderr.String())
	}
	if out := p.stderr.String(); strings.Count(out, "--redis-min-replicas is 0") != 1 || !strings.Contains(out, "connected_replicas=1") {
		t.Errorf("with a replica and --redis-min-replicas 0, leaderrun does not warn once:\n%s", out)
	}

	replica.Stop(t)
	p = run(events, "exit:0", "replicated", "refused", "--redis-min-replicas", "1", "--wait", "2s")
	if code := p.wait(20 * time.Second); code != 75 {
		t.Errorf("--redis-min-replicas 1 with the replica stopped: exit %d, want 75:\n%s", code, p.stderr.String())
	}
	if out := p.stderr.String(); !strings.Contains(out, "not starting the command") || !strings.Contains(out, "0 of the 1 replicas") {
		t.Errorf("leaderrun does not say why it did not start the command:\n%s", out)
	}
	if _, ok := etcdFind(readEvents(t, events), "start", "refused"); ok {
		t.Errorf("a child started with the only replica stopped")
	}

	replica.Start(t)
	testenv.WaitReplicaSynced(t, replica)
	p = run(events, "forever", "replicated", "accepted", "--redis-min-replicas", "1")
	evs := waitEvents(t, events, 20*time.Second, "the child", etcdHas("start", "accepted"))
	child, _ := etcdFind(evs, "start", "accepted")
	v, err := replica.Client(t).Get(context.Background(), "leaderrun/replicated").Result()
	if err != nil || !strings.Contains(v, fmt.Sprintf(`"token":%d,`, child.Token)) {
		t.Errorf("the replica holds %q (%v), want the grant of token %d", v, err, child.Token)
	}
	p.signal(syscall.SIGTERM)
	if code := p.wait(10 * time.Second); code != 0 {
		t.Errorf("exit %d:\n%s", code, p.stderr.String())
	}
}
