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
	"flag"
	"fmt"
	"os"
	"strconv"
	"testing"

	"github.com/leaderrun/leaderrun/internal/testenv"
)

// defaultParallel is how many tests run at once unless -parallel (or
// $E2E_PARALLEL) says otherwise, instead of go test's GOMAXPROCS: the
// tests that own their servers run side by side, and they spend their
// time waiting on leases and lease-sized timeouts, not on the CPU.
const defaultParallel = 8

func TestMain(m *testing.M) {
	if os.Getenv("E2E_CHILD") != "" {
		os.Exit(childMain())
	}
	flag.Parse()
	explicit := false
	flag.Visit(func(f *flag.Flag) { explicit = explicit || f.Name == "test.parallel" })
	if !explicit {
		n := defaultParallel
		if s := os.Getenv("E2E_PARALLEL"); s != "" {
			var err error
			if n, err = strconv.Atoi(s); err != nil || n < 1 {
				fmt.Fprintf(os.Stderr, "E2E_PARALLEL=%q: want a positive number\n", s)
				os.Exit(2)
			}
		}
		_ = flag.Set("test.parallel", strconv.Itoa(n))
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
