package faults

import (
	"os"
	"path/filepath"
	"testing"
	"time"

	"github.com/leaderrun/leaderrun/internal/testenv"
)

// mysqlStore is one MariaDB server (Debian's mariadb-server, InnoDB,
// every commit flushed), as a team runs its primary: the lease is a row,
// and the server's clock decides when it expires. Each candidate reaches
// it through a proxy of its own, so that stalling or resetting its proxy
// cuts its statements and the connection it waits on its named lock with
// alike, and no one else's. The password is in a file, as
// docs/backends/mysql.md asks, not in the DSN.
//
// With replicas, a stalled or reset link and a killed leader are the
// same; what a primary's failover does (an asynchronous replica can lose a
// grant) is out of this suite's reach, as with Redis.
type mysqlStore struct {
	db       *testenv.MariaDB
	password string // the password file
}

func newMySQLStore(t testing.TB) *mysqlStore {
	db := testenv.StartMariaDB(t, testenv.MariaDBOptions{})
	file := filepath.Join(t.TempDir(), "mysql-password")
	if err := os.WriteFile(file, []byte(db.RootPassword+"\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	return &mysqlStore{db: db, password: file}
}

func (s *mysqlStore) name() string { return "mysql" }

// The same timings as PostgreSQL's: the database grants the lease asked,
// to the microsecond, on its own clock. The renew deadline leaves a
// restart of the server time to finish without a failover.
func (s *mysqlStore) timings() timing {
	return timing{lease: 5 * time.Second, deadline: 3 * time.Second, retry: 500 * time.Millisecond, grace: time.Second}
}

func (s *mysqlStore) candidate(t testing.TB) ([]string, []*testenv.Proxy) {
	p := testenv.NewProxy(t, s.db.Addr())
	return []string{"--mysql-dsn", "root@tcp(" + p.Addr() + ")/leaderrun", "--mysql-password-file", s.password},
		[]*testenv.Proxy{p}
}

// restartNode kills the server with SIGKILL and starts it again on its
// files, as a crash would: InnoDB recovers every commit it acknowledged
// from its log, so the lease row (with its expiry) and the token counter
// are as they were, and the leader renews on. A restart that took longer
// than the deadline less a retry period proves nothing either way: the
// trial says so instead of counting it.
func (s *mysqlStore) restartNode(t testing.TB) {
	tm := s.timings()
	began := time.Now()
	s.db.Kill(t)
	s.db.Start(t)
	took := time.Since(began)
	t.Logf("mariadbd kill -9 and start took %v (renew deadline %v)", took.Round(time.Millisecond), tm.deadline)
	if took >= tm.deadline-tm.retry {
		t.Errorf("the restart took %v, too long for the %v renew deadline: this trial cannot tell a false failover from a due one",
			took.Round(time.Millisecond), tm.deadline)
	}
}

// killRaftLeader: a single MariaDB server elects nothing.
func (s *mysqlStore) killRaftLeader(t testing.TB) bool { return false }
