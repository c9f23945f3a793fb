//go:build linux

// Package e2e runs the leaderrun binary as users do: real processes, real
// signals, real stores. The test binary doubles as the child command (see
// childMain), which records what it sees in an events file.
//
// The scenarios that every store runs are one table (scenarios_test.go)
// over the stores (stores_test.go): TestStores/<store>/<scenario>. Each
// store's file holds its entry and the tests only it can run.
package e2e

import (
	"fmt"
	"os"
	"testing"

	"github.com/leaderrun/leaderrun/internal/testenv"
)

func TestMain(m *testing.M) {
	if os.Getenv("E2E_CHILD") != "" {
		os.Exit(childMain())
	}
	if _, err := testenv.BuildLeaderrun(); err != nil {
		fmt.Fprintln(os.Stderr, err)
		os.Exit(1)
	}
	code := m.Run()
	// The Kubernetes tests share one apiserver (testenv.SharedKube).
	testenv.StopSharedKube()
	os.Exit(code)
}
