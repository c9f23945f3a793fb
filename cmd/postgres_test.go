package cmd

import (
	"bytes"
	"fmt"
	"net"
	"os"
	"strings"
	"testing"
)

// closedAddr is host:port of a loopback port where nothing listens.
func closedAddr(t *testing.T) string {
	t.Helper()
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	addr := l.Addr().String()
	l.Close()
	return addr
}

// TestPostgresFlags: which settings select the PostgreSQL store, and what
// bad ones say. Nothing listens at the address, so a selected store is
// exit 69 naming it; the password never shows, in errors or in --help.
func TestPostgresFlags(t *testing.T) {
	const secret = "hunter2-secret"
	addr := closedAddr(t)
	url := fmt.Sprintf("postgres://app:%s@%s/ops?sslmode=disable&connect_timeout=2", secret, addr)
	// The libpq variables of a developer's shell must not leak in.
	for _, v := range []string{"DATABASE_URL", "LEADERRUN_POSTGRES_URL", "LEADERRUN_BACKEND", "PGHOST", "PGPORT", "PGPASSWORD",
		"LEADERRUN_ETCD_ENDPOINTS", "ETCDCTL_ENDPOINTS", "LEADERRUN_CONSUL_ADDR", "CONSUL_HTTP_ADDR", "LEADERRUN_POSTGRES_TABLE"} {
		t.Setenv(v, "") // restored when the test ends
		os.Unsetenv(v)
	}
	for _, tc := range []struct {
		name string
		env  map[string]string
		args []string
		code int
		want []string
	}{
		{name: "flag selects", args: []string{"--postgres-url", url}, code: ExitUnavailable, want: []string{"postgres at " + addr}},
		{name: "variable selects", env: map[string]string{"LEADERRUN_POSTGRES_URL": url}, code: ExitUnavailable, want: []string{"postgres at " + addr}},
		{name: "DATABASE_URL alone selects nothing", env: map[string]string{"DATABASE_URL": url}, code: ExitUsage, want: []string{"no store configured", "--backend postgres"}},
		{name: "PGHOST alone selects nothing", env: map[string]string{"PGHOST": "127.0.0.1", "PGPASSWORD": secret}, code: ExitUsage, want: []string{"no store configured"}},
		{name: "DATABASE_URL with --backend postgres", env: map[string]string{"DATABASE_URL": url}, args: []string{"--backend", "postgres"}, code: ExitUnavailable, want: []string{"postgres at " + addr}},
		{name: "PG variables with --backend postgres", args: []string{"--backend", "postgres"}, code: ExitUnavailable, want: []string{"postgres at " + addr},
			env: map[string]string{"PGHOST": "127.0.0.1", "PGPORT": addr[strings.LastIndex(addr, ":")+1:], "PGPASSWORD": secret, "PGSSLMODE": "disable", "PGCONNECT_TIMEOUT": "2"}},
		{name: "flag wins over DATABASE_URL", env: map[string]string{"DATABASE_URL": "postgres://x:" + secret + "@127.0.0.1:1/db"}, args: []string{"--postgres-url", url}, code: ExitUnavailable, want: []string{"postgres at " + addr}},
		{name: "with etcd too", env: map[string]string{"ETCDCTL_ENDPOINTS": "127.0.0.1:2379"}, args: []string{"--postgres-url", url}, code: ExitUsage, want: []string{"several stores", "postgres", "etcd"}},
		{name: "bad URL", args: []string{"--postgres-url", "postgres://app:" + secret + "@127.0.0.1:notaport/db"}, code: ExitUsage, want: []string{"--postgres-url", "invalid port"}},
		{name: "bad key=value string", args: []string{"--postgres-url", "host=127.0.0.1 password=" + secret + " port=x"}, code: ExitUsage, want: []string{"--postgres-url"}},
		{name: "bad DATABASE_URL", env: map[string]string{"DATABASE_URL": "postgres://app:" + secret + "@127.0.0.1:notaport/db"}, args: []string{"--backend", "postgres"}, code: ExitUsage, want: []string{"DATABASE_URL"}},
		{name: "bad table", args: []string{"--postgres-url", url, "--postgres-table", "a.b.c"}, code: ExitUsage, want: []string{"--postgres-table", `"a.b.c"`}},
		{name: "empty table", args: []string{"--postgres-url", url, "--postgres-table", " "}, code: ExitUsage, want: []string{"--postgres-table"}},
	} {
		for _, command := range []string{"run", "status", "history"} {
			t.Run(tc.name+"/"+command, func(t *testing.T) {
				for k, v := range tc.env {
					t.Setenv(k, v)
				}
				args := append([]string{"leaderrun", command, "--lock", "pgflags"}, tc.args...)
				if command == "run" {
					args = append(args, "--try", "--", "true")
				}
				var stdout, stderr bytes.Buffer
				code := run(args, &stdout, &stderr)
				out := stdout.String() + stderr.String()
				if code != tc.code {
					t.Errorf("exit %d, want %d:\n%s", code, tc.code, out)
				}
				// run logs to the process's own stderr, out of reach
				// here: e2e/postgres_test.go reads what it says.
				for _, w := range tc.want {
					if command == "run" && tc.code == ExitUnavailable {
						break
					}
					if !strings.Contains(out, w) {
						t.Errorf("output does not say %q:\n%s", w, out)
					}
				}
				if strings.Contains(out, secret) {
					t.Errorf("output shows the password:\n%s", out)
				}
			})
		}
	}
	t.Run("help", func(t *testing.T) {
		t.Setenv("LEADERRUN_POSTGRES_URL", url)
		t.Setenv("DATABASE_URL", url)
		var stdout, stderr bytes.Buffer
		if code := run([]string{"leaderrun", "run", "--help"}, &stdout, &stderr); code != 0 {
			t.Fatalf("--help: exit %d\n%s", code, stderr.String())
		}
		help := stdout.String()
		for _, w := range []string{"--postgres-url URL", "$LEADERRUN_POSTGRES_URL", "--postgres-table TABLE", `"leaderrun_leases"`,
			"visible to every user", "~/.pgpass"} {
			if !strings.Contains(help, w) {
				t.Errorf("--help does not say %q", w)
			}
		}
		if strings.Contains(help, secret) {
			t.Errorf("--help shows the password from the environment")
		}
	})
}
