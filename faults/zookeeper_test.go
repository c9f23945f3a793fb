package faults

import (
	"strings"
	"testing"
	"time"

	"github.com/leaderrun/leaderrun/internal/testenv"
)

// zkStore is a 3-server ensemble (tick 200 ms); each candidate reaches
// every server through a proxy of its own, so that stalling its proxies
// cuts it alone off, and its client can move its session to another
// server when one goes.
type zkStore struct{ ensemble *testenv.ZooKeeper }

func newZooKeeperStore(t testing.TB) *zkStore {
	return &zkStore{ensemble: testenv.StartZooKeeper(t, 3)}
}

func (s *zkStore) name() string { return "zookeeper" }

// The lease's TTL is 6 s − 500 ms − 100 ms (the retry period and half a
// tick, see backends/zookeeper) = 5.4 s, more than 4 s + 1 s. The 4 s
// deadline leaves time for what the ensemble takes to get over a lost
// server or leader without a false failover: a follower gives its leader
// up after syncLimit (10) ticks, 2 s, then elects a new one; a client moves
// to another server at once when its own closes the connection.
func (s *zkStore) timings() timing {
	return timing{lease: 6 * time.Second, deadline: 4 * time.Second, retry: 500 * time.Millisecond, grace: time.Second}
}

func (s *zkStore) candidate(t testing.TB) ([]string, []*testenv.Proxy) {
	var servers []string
	var proxies []*testenv.Proxy
	for _, m := range s.ensemble.Members {
		p := testenv.NewProxy(t, m.Addr)
		proxies = append(proxies, p)
		servers = append(servers, p.Addr())
	}
	return []string{"--zk-servers", strings.Join(servers, ",")}, proxies
}

// restartNode restarts a follower, as a rolling restart would.
func (s *zkStore) restartNode(t testing.TB) {
	leader := s.ensemble.Leader(t)
	for _, m := range s.ensemble.Members {
		if m != leader {
			m.Restart(t)
			s.ensemble.WaitServing(t)
			return
		}
	}
}

// killRaftLeader kills the ensemble's leader (ZooKeeper's ZAB leader, not
// raft's) with SIGKILL and starts it again once the others elected a new
// one.
func (s *zkStore) killRaftLeader(t testing.TB) bool {
	leader := s.ensemble.Leader(t)
	leader.Kill(t)
	if s.ensemble.Leader(t) == leader {
		t.Errorf("member %d still leads after its kill", leader.ID)
	}
	leader.Start(t)
	s.ensemble.WaitServing(t)
	return true
}
