//go:build linux

package e2e

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	goredis "github.com/redis/go-redis/v9"

	"github.com/leaderrun/leaderrun/internal/testenv"
)

// redisTestTimings keep the tests fast: the server expires a lease 3 s
// after its last renewal by its own clock; the child gets the kill signal
// 2 s after the send time of the last acknowledged renewal and SIGKILL
// 500 ms later, so it is dead at least 500 ms before anyone can take the
// lock.
var redisTestTimings = timings{lease: 3 * time.Second, deadline: 2 * time.Second, retry: 500 * time.Millisecond, grace: 500 * time.Millisecond}

var redisTimings = redisTestTimings.flags()

const redisLease = 3 * time.Second

const redisPassword = "e2e-Redis-pa55"

// redisStore is Redis in the scenarios' matrix: one server with a
// password, the append-only file with appendfsync always (the token
// survives a restart), TLS beside plain TCP. leaderrun gets the URL in
// LEADERRUN_REDIS_URL and the password in REDISCLI_AUTH (as the flag's
// help recommends: nothing secret on the command line).
func redisStore() *store {
	return &store{
		name: "redis", start: startRedisStore, timings: redisTestTimings,
		// The first in line sleeps until the lease expires by the
		// server's clock; a release wakes it at once.
		takeover: redisLease + 300*time.Millisecond, handover: 300 * time.Millisecond,
		notice: 100 * time.Millisecond, statusBound: redisLease + 2*time.Second,
		expires: true, waiters: true, ttl: true, remaining: true, durable: true, lostTerm: true,
		// A lease short enough that a takeover after a kill -9 fits in
		// the fleet's --wait 4s.
		onceTimings:   timings{lease: 2 * time.Second, deadline: 1200 * time.Millisecond, retry: 300 * time.Millisecond, grace: 500 * time.Millisecond},
		escapeTimings: timings{lease: 3 * time.Second, deadline: 2 * time.Second, retry: 500 * time.Millisecond, grace: escapeGrace},
		credentials:   []string{"LEADERRUN_REDIS_URL", "REDISCLI_AUTH"},
		kept:          []string{"REDIS_HOST=cache.internal"},
	}
}

func startRedisStore(t *testing.T) *target {
	r := testenv.StartRedis(t, testenv.RedisOptions{Password: redisPassword, AOF: true})
	admin := r.Client(t)
	vars := []string{"LEADERRUN_REDIS_URL=redis://" + r.Addr(), "REDISCLI_AUTH=" + redisPassword}
	return &target{
		env: vars, waiting: statusWaiting(nil, vars), key: keyUnder("leaderrun/%s"),
		link: r.Addr(),
		via: func(addr string) ([]string, []string) {
			return nil, []string{"LEADERRUN_REDIS_URL=redis://" + addr, "REDISCLI_AUTH=" + redisPassword}
		},
		// Redis announces the DEL to the lease's tracking connection:
		// milliseconds.
		losses: []loss{{name: "KeyDeletedByHand", says: []string{"was deleted"}, takeover: true, do: func(t *testing.T, _ *env, lock string) time.Time {
			sent := time.Now()
			if n, err := admin.Del(context.Background(), "leaderrun/"+lock).Result(); err != nil || n != 1 {
				t.Fatalf("DEL: %d, %v", n, err)
			}
			return sent
		}}},
		// The job lives on for a second: long enough for the lease to see
		// the loss (about half a second) and stop it, so that the history
		// says "lost". A job that exited at once would still exit 76 with
		// no marker written (the marker is fenced by the lock's value),
		// its term "exited 0".
		loseCommand: func(t *testing.T, lock string) string {
			return redisCLI(t) + " -p " + strconv.Itoa(r.Port()) + " -a " + redisPassword +
				" --no-auth-warning DEL leaderrun/" + lock + " >/dev/null && sleep 1"
		},
		record:     func(t *testing.T, lock string) string { return redisRecord(t, admin, lock) },
		stopServer: r.Stop, startServer: r.Start,
	}
}

// redisRecord is the lock's key and its queue of waiters, as an operator
// reads them.
func redisRecord(t *testing.T, admin *goredis.Client, lock string) string {
	t.Helper()
	v, _ := admin.Get(context.Background(), "leaderrun/"+lock).Result()
	n, _ := admin.ZCard(context.Background(), "leaderrun/:waiters:"+lock).Result()
	return fmt.Sprintf("%s, %d queued", v, n)
}

// redisEnv is a server the Redis tests share and a client of its own
// that plays the operator.
type redisEnv struct {
	r     *testenv.Redis
	admin *goredis.Client
}

// TestRedis runs what only Redis has against a real redis-server with a
// password, the append-only file and TLS: TLS, and its errors.
func TestRedis(t *testing.T) {
	t.Parallel()
	r := testenv.StartRedis(t, testenv.RedisOptions{Password: redisPassword, AOF: true, TLS: true})
	e := &redisEnv{r: r, admin: r.Client(t)}
	if err := e.admin.Ping(context.Background()).Err(); err != nil {
		t.Fatal(err)
	}
	for _, tc := range []struct {
		name string
		run  func(*testing.T, *redisEnv)
	}{
		{"TLSWithPassword", testRedisTLS},
		{"Unreachable", testRedisUnreachable},
	} {
		t.Run(tc.name, func(t *testing.T) { tc.run(t, e) })
	}
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

// testRedisUnreachable: nothing listens at the address: exit 69 at once,
// naming the address and not the password; status too.
func testRedisUnreachable(t *testing.T, e *redisEnv) {
	addr := fmt.Sprintf("127.0.0.1:%d", testenv.FreePort(t, "127.0.0.1"))
	url := "redis://:" + redisPassword + "@" + addr
	for _, args := range [][]string{
		{"--lock", "nowhere", "--redis-url", url, "--wait", "1s", "--", "true"},
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

// redisCLI is redis-cli beside the server's binary, or in PATH.
func redisCLI(t *testing.T) string {
	t.Helper()
	p := filepath.Join(filepath.Dir(testenv.RedisBinary(t)), "redis-cli")
	if _, err := os.Stat(p); err != nil {
		t.Fatalf("redis-cli not found beside %s", testenv.RedisBinary(t))
	}
	return p
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
	t.Parallel()
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
