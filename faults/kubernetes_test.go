package faults

import (
	"testing"
	"time"

	"github.com/leaderrun/leaderrun/internal/testenv"
)

// kubeStore is a highly available control plane: two kube-apiservers on
// one etcd. Each candidate reaches them through a load balancer of its own
// (TLS passes through) that sends each new connection to the next server
// whose /readyz says ready, as the user KubeLimited, which may get, create,
// update and watch leases in a namespace of the suite's own.
type kubeStore struct {
	servers []*testenv.Kube
	ns      string
}

func newKubeStore(t testing.TB) *kubeStore {
	k := testenv.StartKube(t)
	ns := k.Namespace(t)
	k.Grant(t, ns, testenv.KubeLimited, "get", "create", "update", "watch")
	return &kubeStore{servers: []*testenv.Kube{k, k.StartPeer(t)}, ns: ns}
}

func (s *kubeStore) name() string { return "kubernetes" }

// Renewals 1 s apart, so that a client-go elector would see every one and
// all of the lease counts; the deadline leaves time for a reconnection to
// the other apiserver when one restarts.
func (s *kubeStore) timings() timing {
	return timing{lease: 8 * time.Second, deadline: 5 * time.Second, retry: time.Second, grace: 2 * time.Second}
}

func (s *kubeStore) candidate(t testing.TB) ([]string, []*testenv.Proxy) {
	ready := func(target string) bool {
		for _, k := range s.servers {
			if k.Addr() == target {
				return k.Ready()
			}
		}
		return false
	}
	var addrs []string
	for _, k := range s.servers {
		addrs = append(addrs, k.Addr())
	}
	p := testenv.NewBalancer(t, ready, addrs...)
	kc := s.servers[0].KubeconfigVia(t, "https://"+p.Addr(), testenv.KubeLimited, s.ns)
	return []string{"--kubeconfig", kc}, []*testenv.Proxy{p}
}

// restartNode restarts the first apiserver (SIGTERM, as a service manager
// would), the one every candidate's first connection went to: their
// connections break, and the balancer sends the new ones to the other.
func (s *kubeStore) restartNode(t testing.TB) {
	s.servers[0].Stop(t)
	s.servers[0].Start(t)
}

func (s *kubeStore) killRaftLeader(t testing.TB) bool { return false }
