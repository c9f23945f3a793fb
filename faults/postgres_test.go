package faults

import (
	"net/url"
	"testing"
	"time"

	"github.com/leaderrun/leaderrun/internal/testenv"
)

// postgresStore is one PostgreSQL server, as a team runs its primary: the
// lease is a row, and the server's clock decides when it expires. Each
// candidate reaches it through a proxy of its own, so that stalling or
// resetting its proxy cuts its statements and its listening connection
// alike, and no one else's.
type postgresStore struct{ pg *testenv.Postgres }

func newPostgresStore(t testing.TB) *postgresStore {
	return &postgresStore{pg: testenv.StartPostgres(t)}
}

func (s *postgresStore) name() string { return "postgres" }

// The same timings as etcd's: the database grants the lease duration
// asked, to the microsecond. The renew deadline leaves a fast restart of
// the server (well under a second on a small cluster) time to finish
// without a failover.
func (s *postgresStore) timings() timing {
	return timing{lease: 5 * time.Second, deadline: 3 * time.Second, retry: 500 * time.Millisecond, grace: time.Second}
}

func (s *postgresStore) candidate(t testing.TB) ([]string, []*testenv.Proxy) {
	p := testenv.NewProxy(t, s.pg.Addr())
	u := url.URL{Scheme: "postgres", User: url.UserPassword(testenv.PostgresSuperuser, s.pg.Password), Host: p.Addr(),
		Path: "/postgres", RawQuery: "sslmode=disable"}
	return []string{"--postgres-url", u.String()}, []*testenv.Proxy{p}
}

// restartNode is a fast restart of the server (pg_ctl restart -m fast:
// every connection is closed, the data kept). Back within the renew
// deadline, it must cause no failover. A restart that took longer than
// the deadline less a retry period proves nothing either way: the trial
// says so instead of counting it.
func (s *postgresStore) restartNode(t testing.TB) {
	tm := s.timings()
	began := time.Now()
	s.pg.Restart(t)
	took := time.Since(began)
	t.Logf("postgres fast restart took %v (renew deadline %v)", took.Round(time.Millisecond), tm.deadline)
	if took >= tm.deadline-tm.retry {
		t.Errorf("the fast restart took %v, too long for the %v renew deadline: this trial cannot tell a false failover from a due one",
			took.Round(time.Millisecond), tm.deadline)
	}
}

// killRaftLeader: a single PostgreSQL server elects nothing.
func (s *postgresStore) killRaftLeader(t testing.TB) bool { return false }
