package mysql_test

import (
	"context"
	"testing"
	"time"

	"github.com/leaderrun/leaderrun/backends"
	"github.com/leaderrun/leaderrun/backends/backendtest"
	"github.com/leaderrun/leaderrun/backends/mysql"
	"github.com/leaderrun/leaderrun/internal/testenv"
)

const prefix = "leaderrun-test/"

// env is the shared server, and the operator's own connection to it.
type env struct {
	m *testenv.MariaDB
}

// TestMySQL runs every test that needs one server against the same one;
// tests that restart or kill a server start their own.
func TestMySQL(t *testing.T) {
	m := testenv.StartMariaDB(t, testenv.MariaDBOptions{TLS: true})
	e := &env{m: m}
	for _, tc := range []struct {
		name string
		run  func(*testing.T, *env)
	}{
		{"Conformance", testConformance},
	} {
		t.Run(tc.name, func(t *testing.T) { tc.run(t, e) })
	}
}

// newStore opens a store on e's server as root; cfg.DSN defaults to
// root's, cfg.Prefix to prefix.
func newStore(t testing.TB, e *env, cfg mysql.Config) *mysql.Store {
	t.Helper()
	if cfg.DSN == "" {
		cfg.DSN = e.m.RootDSN()
	}
	if cfg.Prefix == "" {
		cfg.Prefix = prefix
	}
	s, err := mysql.Open(cfg)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { s.Close() })
	return s
}

func testConformance(t *testing.T, e *env) {
	backendtest.Run(t, backendtest.Harness{
		Open: func(t *testing.T) backends.Store {
			s, err := mysql.Open(mysql.Config{DSN: e.m.RootDSN(), Prefix: prefix})
			if err != nil {
				t.Fatal(err)
			}
			return s
		},
		Drop: func(t *testing.T, lock string, _ *backends.Lease) {
			e.m.Exec(t, "DELETE FROM leaderrun_locks WHERE name = '"+prefix+lock+"'")
		},
	})
}

var _ = context.Background
var _ = time.Second
