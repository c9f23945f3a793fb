package faults

import (
	"testing"
	"time"

	"github.com/leaderrun/leaderrun/internal/testenv"
)

// redisStore is one redis-server with the append-only file and
// appendfsync always (every write on disk before it is acknowledged), as
// docs/backends/redis.md asks of a server whose tokens must only grow.
// Each candidate reaches it through a proxy of its own, so that stalling
// or resetting its proxy cuts its requests and its pub/sub connection
// alike, and no one else's.
type redisStore struct{ r *testenv.Redis }

const redisFaultPassword = "faults-redis-pa55"

func newRedisStore(t testing.TB) *redisStore {
	return &redisStore{r: testenv.StartRedis(t, testenv.RedisOptions{Password: redisFaultPassword, AOF: true})}
}

func (s *redisStore) name() string { return "redis" }

// The same timings as PostgreSQL's: the server grants the lease asked, to
// the millisecond, on its own clock. The renew deadline leaves a restart
// of the server (a tenth of a second with a small append-only file) time
// to finish without a failover.
func (s *redisStore) timings() timing {
	return timing{lease: 5 * time.Second, deadline: 3 * time.Second, retry: 500 * time.Millisecond, grace: time.Second}
}

func (s *redisStore) candidate(t testing.TB) ([]string, []*testenv.Proxy) {
	p := testenv.NewProxy(t, s.r.Addr())
	return []string{"--redis-url", "redis://:" + redisFaultPassword + "@" + p.Addr()}, []*testenv.Proxy{p}
}

// restartNode kills the server with SIGKILL and starts it again on its
// files: with appendfsync always it has lost nothing it acknowledged, so
// the leader's key (with its expiry) and the token counter are as they
// were, and the leader renews on. A restart that took longer than the
// deadline less a retry period proves nothing either way: the trial says
// so instead of counting it.
func (s *redisStore) restartNode(t testing.TB) {
	tm := s.timings()
	began := time.Now()
	s.r.Kill(t)
	s.r.Start(t)
	took := time.Since(began)
	t.Logf("redis kill -9 and start took %v (renew deadline %v)", took.Round(time.Millisecond), tm.deadline)
	if took >= tm.deadline-tm.retry {
		t.Errorf("the restart took %v, too long for the %v renew deadline: this trial cannot tell a false failover from a due one",
			took.Round(time.Millisecond), tm.deadline)
	}
}

// killRaftLeader: a single redis-server elects nothing.
func (s *redisStore) killRaftLeader(t testing.TB) bool { return false }
