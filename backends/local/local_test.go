package local_test

import (
	"os"
	"testing"

	"github.com/leaderrun/leaderrun/backends"
	"github.com/leaderrun/leaderrun/backends/backendtest"
	"github.com/leaderrun/leaderrun/backends/local"
)

func TestConformance(t *testing.T) {
	dir := t.TempDir()
	backendtest.Run(t, backendtest.Harness{
		New: func(t *testing.T, lock string) backends.Backend {
			return local.New(local.Config{Dir: dir, Lock: lock})
		},
		SlotGrants: 200,
		Drop: func(t *testing.T, l backends.Lease) {
			// Removing the lock file lets a newcomer lock a new one.
			if err := os.Remove(l.(interface{ String() string }).String()); err != nil {
				t.Fatal(err)
			}
		},
	})
}
