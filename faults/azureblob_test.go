package faults

import (
	"os"
	"testing"
	"time"

	"github.com/leaderrun/leaderrun/internal/testenv"
)

// azureStore is one Azurite blob service (the Azure Storage emulator).
// Each candidate
// reaches it through a proxy of its own (--azure-account-url); the
// account's name and key are in the suite's environment, where leaderrun
// reads credentials from (never from a flag), and so in every
// candidate's.
type azureStore struct{ az *testenv.Azurite }

func newAzureStore(t testing.TB) *azureStore {
	az := testenv.StartAzurite(t)
	// Process-wide, not t.Setenv: stores run in parallel subtests. No
	// other store reads these.
	os.Setenv("AZURE_STORAGE_ACCOUNT", az.Account)
	os.Setenv("AZURE_STORAGE_KEY", az.Key)
	return &azureStore{az: az}
}

func (s *azureStore) name() string { return "azureblob" }

// Azure's shortest lease is 15 s. Renewals a second apart, so that a
// lease checks itself half a second after each; the 6 s deadline leaves
// a restart of the service (Node starts in a second or two) time to
// finish without a failover, and the child is dead 8 s after the last
// acknowledged renewal, 7 s before the lease can expire.
func (s *azureStore) timings() timing {
	return timing{lease: 15 * time.Second, deadline: 6 * time.Second, retry: time.Second, grace: 2 * time.Second}
}

func (s *azureStore) candidate(t testing.TB) ([]string, []*testenv.Proxy) {
	p := testenv.NewProxy(t, s.az.Addr())
	return []string{"--azure-container", "faults", "--azure-account-url", s.az.AccountURLVia(p.Addr())}, []*testenv.Proxy{p}
}

// restartNode restarts the service (SIGTERM, as a service manager would)
// with its data. The suite does not run it on this store: Azurite 3.35
// reports every lease expired when it starts again, so a restart hands
// the lock to a waiter while its holder's lease should still run, which
// Azure Storage never does (docs/backends/azureblob.md).
func (s *azureStore) restartNode(t testing.TB) {
	began := time.Now()
	s.az.Restart()
	t.Logf("azurite restart took %v (renew deadline %v)", time.Since(began).Round(time.Millisecond), s.timings().deadline)
}

// killRaftLeader: a single blob service elects nothing.
func (s *azureStore) killRaftLeader(t testing.TB) bool { return false }
