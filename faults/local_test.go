package faults

import (
	"testing"
	"time"

	"github.com/leaderrun/leaderrun/internal/testenv"
)

// localStore is the local backend: a state directory on this host, no
// link to stall and no server to restart. It runs the pool rows only
// (poolOnly); its rows of one holder are the e2e tests' (e2e/local_test.go).
type localStore struct{ dir string }

func newLocalStore(t testing.TB) *localStore { return &localStore{dir: t.TempDir()} }

func (s *localStore) name() string { return "local" }

// The kernel drops the flock when the holder's tree is gone; the lease
// timings only bound the renewals, which on a local file always succeed.
func (s *localStore) timings() timing {
	return timing{lease: 5 * time.Second, deadline: 3 * time.Second, retry: 500 * time.Millisecond, grace: time.Second}
}

func (s *localStore) candidate(testing.TB) ([]string, []*testenv.Proxy) {
	return []string{"--backend", "local", "--state-dir", s.dir}, nil
}

func (s *localStore) restartNode(testing.TB)         {}
func (s *localStore) killRaftLeader(testing.TB) bool { return false }

// poolOnly: of the scenarios, only the pool rows apply to the local
// store, which has no link or node to break.
func (s *localStore) poolOnly() bool { return true }
