//go:build linux

package e2e

import (
	"context"
	"fmt"
	"net"
	"path"
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

// etcdTestTimings keep the tests fast: etcd grants the 3 s asked, the
// child is stopped 2 s after the send time of the last acknowledged
// renewal and killed 500 ms later, so it is dead at least 500 ms before
// etcd can let the lease go.
var etcdTestTimings = timings{lease: 3 * time.Second, deadline: 2 * time.Second, retry: 500 * time.Millisecond, grace: 500 * time.Millisecond}

// etcdTimings and etcdLease are etcdTestTimings as flags, and its lease.
var etcdTimings = etcdTestTimings.flags()

const etcdLease = 3 * time.Second

// etcdStore is etcd in the scenarios' matrix: one member. A lock's key is
// leaderrun/<lock>/<lease ID>; a waiter watches the key before its own,
// and is told of its deletion at once.
func etcdStore() *store {
	return &store{
		name: "etcd", start: startEtcdStore, timings: etcdTestTimings,
		// etcd lets the lease go 3 s after the last renewal it saw; the
		// follower is told at once.
		takeover: etcdLease + time.Second, handover: 300 * time.Millisecond,
		notice: 100 * time.Millisecond, statusBound: etcdLease + 5*time.Second,
		expires: true, waiters: true, ttl: true, remaining: true, durable: true, lostTerm: true,
		// etcd's smallest lease (2 s; it raises anything shorter).
		onceTimings: timings{lease: 2 * time.Second, deadline: 1200 * time.Millisecond, retry: 300 * time.Millisecond, grace: 500 * time.Millisecond},
	}
}

func startEtcdStore(t *testing.T) *target {
	cluster := testenv.StartEtcd(t, 1)
	eps := cluster.Endpoints()
	flags := []string{"--etcd-endpoints", strings.Join(eps, ",")}
	cli, err := clientv3.New(clientv3.Config{Endpoints: eps, DialTimeout: 5 * time.Second, Logger: zap.NewNop()})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { cli.Close() })
	// Connect now, so that the operator's requests below are one round
	// trip each.
	if _, err := cli.Get(context.Background(), "warm-up"); err != nil {
		t.Fatal(err)
	}
	// held is the holder's key and lease ID, as status reports them.
	held := func(t *testing.T, e *env, lock string) (string, clientv3.LeaseID) {
		st, code := e.status(t, lock)
		if code != 0 {
			t.Fatalf("status of %s: exit %d, want 0 (held)", lock, code)
		}
		id, err := strconv.ParseInt(path.Base(st.Key), 16, 64)
		if err != nil {
			t.Fatalf("key %s does not end in a lease ID: %v", st.Key, err)
		}
		return st.Key, clientv3.LeaseID(id)
	}
	etcdctl := func(t *testing.T, args ...string) {
		if out, err := testenv.Etcdctl(t, eps, args...); err != nil {
			t.Fatalf("etcdctl %v: %v\n%s", args, err, out)
		}
	}
	member := cluster.Members[0]
	return &target{
		flags: flags, waiting: statusWaiting(flags, nil), key: keyUnder("leaderrun/%s/"),
		link: strings.TrimPrefix(eps[0], "http://"),
		via:  func(addr string) ([]string, []string) { return []string{"--etcd-endpoints", "http://" + addr}, nil },
		// The client API's numbers are the store's and leaderrun's alone;
		// etcdctl's include its own start-up.
		losses: []loss{
			{name: "ClientRevoke", do: func(t *testing.T, e *env, lock string) time.Time {
				_, id := held(t, e, lock)
				sent := time.Now()
				if _, err := cli.Revoke(context.Background(), id); err != nil {
					t.Fatal(err)
				}
				return sent
			}},
			{name: "ClientDelete", do: func(t *testing.T, e *env, lock string) time.Time {
				key, _ := held(t, e, lock)
				sent := time.Now()
				if _, err := cli.Delete(context.Background(), key); err != nil {
					t.Fatal(err)
				}
				return sent
			}},
			{name: "EtcdctlLeaseRevoke", do: func(t *testing.T, e *env, lock string) time.Time {
				key, _ := held(t, e, lock)
				etcdctl(t, "lease", "revoke", path.Base(key))
				return time.Time{}
			}},
			{name: "EtcdctlDel", do: func(t *testing.T, e *env, lock string) time.Time {
				key, _ := held(t, e, lock)
				etcdctl(t, "del", key)
				return time.Time{}
			}},
		},
		loseCommand: func(t *testing.T, lock string) string {
			return testenv.EtcdctlBinary(t) + " --endpoints " + strings.Join(eps, ",") + " del --prefix leaderrun/" + lock + "/ >/dev/null"
		},
		record: func(t *testing.T, lock string) string {
			resp, err := cli.Get(context.Background(), "leaderrun/"+lock, clientv3.WithPrefix(), clientv3.WithKeysOnly())
			if err != nil {
				t.Fatal(err)
			}
			var keys []string
			for _, kv := range resp.Kvs {
				keys = append(keys, fmt.Sprintf("%s@%d", kv.Key, kv.ModRevision))
			}
			return strings.Join(keys, " ")
		},
		stopServer:  member.Stop,
		startServer: member.Start,
	}
}

// etcdRun starts leaderrun against endpoints with a child in mode (see
// childMain) that records to events.
func etcdRun(t *testing.T, events, mode string, endpoints []string, lock, id string, extra ...string) *proc {
	t.Helper()
	args := []string{"--etcd-endpoints", strings.Join(endpoints, ","), "--lock", lock, "--identity", id}
	args = append(append(append(args, etcdTimings...), extra...), "--")
	return start(t, childEnv(events, mode), append(args, childArgv(t)...)...)
}

// etcdStatusOf is `leaderrun status --json` of lock on endpoints, parsed,
// and its exit code.
func etcdStatusOf(t *testing.T, endpoints []string, lock string) (etcdStatus, int) {
	t.Helper()
	return statusOf(t, nil, "--lock", lock, "--etcd-endpoints", strings.Join(endpoints, ","))
}

// TestEtcdClusterRollingRestart: on a 3-member cluster, restarting each
// member in turn, the one the leader is connected to included, costs it
// nothing while quorum holds. The leader lists every member, as a
// production config would, so its client fails over.
func TestEtcdClusterRollingRestart(t *testing.T) {
	t.Parallel()
	cluster := testenv.StartEtcd(t, 3)
	eps := cluster.Endpoints()
	events := etcdEvents(t)
	leader := etcdRun(t, events, "forever", eps, "rolling", "leader")
	evs := waitEvents(t, events, 10*time.Second, "the leader's child", etcdHas("start", "leader"))
	old, _ := etcdFind(evs, "start", "leader")
	follower := etcdRun(t, events, "forever", eps, "rolling", "follower")
	waitFor(t, 10*time.Second, "the follower to queue", every(20*time.Millisecond, func() bool {
		st, _ := etcdStatusOf(t, eps, "rolling")
		return st.Waiting == 1
	}))
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
	waitFor(t, 10*time.Second, "status from the restarted cluster", every(20*time.Millisecond, func() bool {
		st, code := etcdStatusOf(t, eps, "rolling")
		return code == 0 && st.Remaining > 0
	}))
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

// TestEtcdUnreachable: a store that refuses connections, or accepts them and
// says nothing, is exit 69 within about the dial timeout, with a message
// naming the endpoint.
func TestEtcdUnreachable(t *testing.T) {
	t.Parallel()
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
		// A waiting run retries until its --wait ends.
		{"Refused", refused, []string{"--wait", "1s"}},
		{"RefusedTry", refused, []string{"--try"}},
		{"Silent", blackhole, []string{"--wait", "1s"}},
		{"Status", refused, []string{"status"}},
		// --timeout shorter than the dial timeout: still 69, naming the
		// endpoint, not a bare "context deadline exceeded" (70).
		{"StatusTimeout", blackhole, []string{"status", "--timeout", "500ms"}},
		// Credentials in the endpoint URL are never printed.
		{"CredentialsInURL", "http://user:secretpw@" + strings.TrimPrefix(refused, "http://"), []string{"--wait", "1s"}},
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
	t.Parallel()
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
	t.Parallel()
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
	t.Parallel()
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
		"--etcd-dial-timeout", "1s", "--wait", "1s", "--", "/bin/true")
	t.Logf("without a client certificate: exit %d after %v", code, time.Since(began).Round(time.Millisecond))
	if code != 69 || !strings.Contains(out, eps[0]) {
		t.Errorf("without a client certificate: exit %d, output %q; want 69 naming %s", code, out, eps[0])
	}
}
