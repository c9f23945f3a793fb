package faults

import (
	"encoding/json"
	"io"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/leaderrun/leaderrun/internal/testenv"
)

// store is one coordination store under test, with what the suite needs to
// reach it and to break it.
type store interface {
	name() string
	// timings are leaderrun's timing flags for this store.
	timings() timing
	// candidate returns the store flags for one candidate, whose traffic
	// goes through proxies that it also returns.
	candidate(t testing.TB) ([]string, []*testenv.Proxy)
	// restartNode restarts one store node, as an operator would; for etcd
	// killRaftLeader kills the raft leader and starts it again (ZooKeeper:
	// the ensemble's leader), and reports false where there is none to
	// kill. Both keep quorum.
	restartNode(t testing.TB)
	killRaftLeader(t testing.TB) bool
}

// candidateEnv is what a store adds to its candidates' environment (an
// env method), after the suite's own: nil for most.
func candidateEnv(st store) []string {
	if e, ok := st.(interface{ env() []string }); ok {
		return e.env()
	}
	return nil
}

// timing is a store's leaderrun flags.
type timing struct {
	lease, deadline, retry, grace time.Duration
	extra                         []string
}

func (tm timing) args() []string {
	return append([]string{
		"--lease-duration", tm.lease.String(), "--renew-deadline", tm.deadline.String(),
		"--retry-period", tm.retry.String(), "--kill-grace", tm.grace.String(),
	}, tm.extra...)
}

// etcdStore is a 3-member cluster; each candidate reaches every member
// through a proxy of its own, so that stalling its proxies cuts it alone off.
type etcdStore struct{ cluster *testenv.Etcd }

func newEtcdStore(t testing.TB) *etcdStore { return &etcdStore{cluster: testenv.StartEtcd(t, 3)} }

func (s *etcdStore) name() string { return "etcd" }

// etcd grants whole seconds; the deadline leaves time for a raft election
// (election timeout 1 s) without a false failover.
func (s *etcdStore) timings() timing {
	return timing{lease: 5 * time.Second, deadline: 3 * time.Second, retry: 500 * time.Millisecond, grace: time.Second}
}

func (s *etcdStore) candidate(t testing.TB) ([]string, []*testenv.Proxy) {
	var eps []string
	var proxies []*testenv.Proxy
	for _, m := range s.cluster.Members {
		p := testenv.NewProxy(t, strings.TrimPrefix(m.ClientURL, "http://"))
		proxies = append(proxies, p)
		eps = append(eps, "http://"+p.Addr())
	}
	return []string{"--etcd-endpoints", strings.Join(eps, ",")}, proxies
}

func (s *etcdStore) restartNode(t testing.TB) {
	// A member that is not the raft leader: a plain rolling restart.
	for _, m := range s.cluster.Members {
		if !etcdIsLeader(m.ClientURL) {
			m.Restart(t)
			return
		}
	}
}

func (s *etcdStore) killRaftLeader(t testing.TB) bool {
	for _, m := range s.cluster.Members {
		if etcdIsLeader(m.ClientURL) {
			m.Kill(t)
			m.Start(t)
			s.cluster.WaitHealthy(t)
			return true
		}
	}
	return false
}

func etcdIsLeader(url string) bool {
	resp, err := http.Get(url + "/metrics")
	if err != nil {
		return false
	}
	defer resp.Body.Close()
	body, _ := io.ReadAll(resp.Body)
	return strings.Contains(string(body), "\netcd_server_is_leader 1")
}

// consulStore is a 3-server cluster. Candidates talk to the first server,
// as they would to their local agent, each through a proxy of its own.
type consulStore struct{ servers []*testenv.ConsulAgent }

func newConsulStore(t testing.TB) *consulStore {
	return &consulStore{servers: testenv.StartConsulCluster(t, 3)}
}

func (s *consulStore) name() string { return "consul" }

// Consul's session TTL is at least 10 s. Lock-delay 0: a silent leader's
// TTL check turns critical a lease after the agent last heard from it, and
// the suite shows that safety rests on that (lease > deadline + grace),
// not on the lock-delay.
func (s *consulStore) timings() timing {
	return timing{lease: 10 * time.Second, deadline: 6 * time.Second, retry: time.Second, grace: 2 * time.Second,
		extra: []string{"--consul-lock-delay", "0s"}}
}

func (s *consulStore) candidate(t testing.TB) ([]string, []*testenv.Proxy) {
	p := testenv.NewProxy(t, s.servers[0].Addr())
	return []string{"--consul-addr", p.Addr()}, []*testenv.Proxy{p}
}

// restartNode restarts a server other than the candidates' own agent.
func (s *consulStore) restartNode(t testing.TB) {
	leader := consulLeader(s.servers[0].URL())
	for _, a := range s.servers[1:] {
		if !strings.HasPrefix(leader, strings.Split(a.Addr(), ":")[0]+":") {
			a.Stop()
			a.Start()
			return
		}
	}
	s.servers[2].Stop()
	s.servers[2].Start()
}

func (s *consulStore) killRaftLeader(t testing.TB) bool { return false }

func consulLeader(url string) string {
	resp, err := http.Get(url + "/v1/status/leader")
	if err != nil {
		return ""
	}
	defer resp.Body.Close()
	var leader string
	_ = json.NewDecoder(resp.Body).Decode(&leader)
	return leader
}
