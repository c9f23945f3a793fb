package faults

import (
	"slices"
	"testing"
	"time"

	"github.com/leaderrun/leaderrun/internal/testenv"
)

// localStore is the local backend: a state directory on this host, no
// link to stall and no server to restart. It runs the rows where a
// process dies or is told to stop, and the pool rows (applies).
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

// localRows are the rows of one holder that apply to the local store. It
// has no link or node to break; a paused or stopped holder keeps its flock
// (nobody can take over until it resumes, by design), so the pause rows
// would only prove that. The kill -9 rows are where the local store is
// most exposed: the kernel drops the flock when the last descriptor
// closes, and the watchdog holds one until the whole tree is dead.
var localRows = []string{"kill -9 leader", "kill -9 child", "SIGTERM handover", "kill -9 leader, escaped helper"}

func (s *localStore) applies(f fault) bool {
	return f.holders > 0 || slices.Contains(localRows, f.name)
}
