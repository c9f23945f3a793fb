//go:build linux

package e2e

import (
	"encoding/json"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/leaderrun/leaderrun/internal/testenv"
)

// statusStore is one store as TestStatusAfterLeaderKilled uses it.
type statusStore struct {
	name string
	// start starts the store and returns the flags and the environment
	// that reach it, for run and status alike.
	start func(t *testing.T) (flags, env []string)
	// timings are run's timing flags.
	timings []string
	// bound is how long after its leader's SIGKILL status may still say
	// the lease is held: the lease by the store's own measure, and the
	// store's slack in noticing (see each store's page in docs/backends).
	bound time.Duration
}

var statusStores = []statusStore{
	{name: "etcd", timings: etcdTimings, bound: etcdLease + 5*time.Second, start: func(t *testing.T) ([]string, []string) {
		return []string{"--etcd-endpoints", strings.Join(testenv.StartEtcd(t, 1).Endpoints(), ",")}, nil
	}},
	// Consul invalidates a session between TTL and 2 × TTL after its last
	// renewal; the holder's TTL check goes critical a TTL after its last
	// pass, which invalidates it at once.
	{name: "consul", timings: []string{"--lease-duration", consulTTL.String(), "--renew-deadline", "6s", "--retry-period", "1s",
		"--kill-grace", "1s"}, bound: 2*consulTTL + 5*time.Second, start: func(t *testing.T) ([]string, []string) {
		return []string{"--consul-addr", testenv.StartConsul(t, testenv.ConsulOptions{}).Addr(), "--consul-lock-delay", "0s"}, nil
	}},
	{name: "postgres", timings: pgTimings, bound: 3*time.Second + 5*time.Second, start: func(t *testing.T) ([]string, []string) {
		return nil, []string{"LEADERRUN_POSTGRES_URL=" + testenv.StartPostgres(t).SuperuserURL()}
	}},
	{name: "kubernetes", timings: kubeTimings, bound: 3*time.Second + 5*time.Second, start: func(t *testing.T) ([]string, []string) {
		return []string{"--kubeconfig", newKubeEnv(t).kubeconfig}, nil
	}},
	{name: "zookeeper", timings: zkTimings, bound: zkSession + 5*time.Second, start: func(t *testing.T) ([]string, []string) {
		return []string{"--zk-servers", strings.Join(testenv.StartZooKeeper(t, 1).Servers(), ",")}, nil
	}},
	{name: "redis", timings: redisTimings, bound: 5 * time.Second, start: func(t *testing.T) ([]string, []string) {
		r := testenv.StartRedis(t, testenv.RedisOptions{Password: redisPassword})
		return []string{"--redis-url", "redis://" + r.Addr()}, []string{"REDISCLI_AUTH=" + redisPassword}
	}},
	{name: "dynamodb", timings: ddbTimings, bound: ddbLease + 5*time.Second, start: func(t *testing.T) ([]string, []string) {
		e := newDDBEnv(t)
		return []string{"--dynamodb-endpoint", e.emu.URL, "--dynamodb-table", e.table}, testenv.DynamoDBEnv(ddbAll)
	}},
	{name: "azureblob", timings: azTimings, bound: azLease + 5*time.Second, start: func(t *testing.T) ([]string, []string) {
		az := testenv.StartAzurite(t)
		return []string{"--azure-container", "status-after-kill"}, []string{"AZURE_STORAGE_CONNECTION_STRING=" + az.ConnectionString()}
	}},
	// The kernel drops the flock with the last descriptor of the lock
	// file: leaderrun's at once, the watchdog's once it has killed the
	// tree.
	{name: "local", timings: nil, bound: 5 * time.Second, start: func(t *testing.T) ([]string, []string) {
		return []string{"--backend", "local", "--state-dir", t.TempDir()}, nil
	}},
}

// TestStatusAfterLeaderKilled (issue 26): on every store, once the lease of
// a leader killed with SIGKILL has run out by the store's own measure,
// `leaderrun status` says the lock is not held, and exits 3. Before the
// kill it says who holds it, and exits 0.
func TestStatusAfterLeaderKilled(t *testing.T) {
	for _, s := range statusStores {
		t.Run(s.name, func(t *testing.T) {
			flags, env := s.start(t)
			status := func() (etcdStatus, int) { return statusOf(t, env, append([]string{"--lock", "dead"}, flags...)...) }
			events := filepath.Join(t.TempDir(), "events")
			args := append(append(append([]string{"--lock", "dead", "--identity", "leader"}, flags...), s.timings...), "--")
			leader := start(t, append(childEnv(events, "forever"), env...), append(args, childArgv(t)...)...)
			waitEvents(t, events, 30*time.Second, "the leader's child", etcdHas("start", "leader"))
			if st, code := status(); code != 0 || !st.Held || st.Identity != "leader" {
				t.Fatalf("status while the leader runs: exit %d, %+v; want held by leader", code, st)
			}
			if err := syscall.Kill(leader.pid(), syscall.SIGKILL); err != nil {
				t.Fatal(err)
			}
			killed := time.Now()
			leader.wait(10 * time.Second)
			var st etcdStatus
			code := 0
			for code != 3 && time.Since(killed) < s.bound {
				st, code = status()
			}
			if code != 3 || st.Held {
				t.Fatalf("status %v after the leader's SIGKILL: exit %d, %+v; want exit 3, not held, once the lease ran out", s.bound, code, st)
			}
			t.Logf("status says not held %v after the leader's SIGKILL", time.Since(killed).Round(time.Millisecond))
		})
	}
}

// statusOf is `leaderrun status --json` with args, in env, parsed, and its
// exit code; any other exit fails the test.
func statusOf(t *testing.T, env []string, args ...string) (etcdStatus, int) {
	t.Helper()
	cmd := exec.Command(testenv.Leaderrun(t), append([]string{"status", "--json"}, args...)...)
	cmd.Env = append(os.Environ(), env...)
	var stderr syncBuffer
	cmd.Stderr = &stderr
	out, err := cmd.Output()
	code := 0
	if ee, ok := err.(*exec.ExitError); ok {
		code = ee.ExitCode()
	} else if err != nil {
		t.Fatal(err)
	}
	var st etcdStatus
	if code != 0 && code != 3 {
		t.Fatalf("status: exit %d\n%s%s", code, out, stderr.String())
	}
	if err := json.Unmarshal(out, &st); err != nil {
		t.Fatalf("status --json printed %q: %v", out, err)
	}
	return st, code
}
