package cmd

import (
	"bytes"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"

	"github.com/urfave/cli/v2"
)

// mysqlVars are the variables of the MySQL store, and those of other
// stores that would select them; a developer's shell must not leak in.
var mysqlVars = []string{"LEADERRUN_MYSQL_DSN", "LEADERRUN_MYSQL_PASSWORD_FILE", "LEADERRUN_MYSQL_TABLE", "LEADERRUN_MYSQL_SSL_CA",
	"LEADERRUN_MYSQL_SSL_CERT", "LEADERRUN_MYSQL_SSL_KEY", "MYSQL_PWD", "LEADERRUN_BACKEND", "LEADERRUN_ETCD_ENDPOINTS",
	"ETCDCTL_ENDPOINTS", "LEADERRUN_CONSUL_ADDR", "CONSUL_HTTP_ADDR", "LEADERRUN_POSTGRES_URL", "LEADERRUN_REDIS_URL", "LEADERRUN_ZK_SERVERS"}

func clearMySQLVars(t *testing.T) {
	for _, v := range mysqlVars {
		t.Setenv(v, "") // restored when the test ends
		os.Unsetenv(v)
	}
}

// TestMySQLFlags: which settings select the MySQL store, and what bad
// ones say, through run, status and history. Nothing listens at the
// address, so a selected store is exit 69; MYSQL_PWD alone selects
// nothing; no message shows a password, one that holds "/", ",", ":" and
// "@" included.
func TestMySQLFlags(t *testing.T) {
	const secret = "ab/cd,ef:SE@CRET"
	clearMySQLVars(t)
	addr := closedAddr(t)
	dsn := "app:" + secret + "@tcp(" + addr + ")/ops?timeout=1s"
	dir := t.TempDir()
	pwFile, emptyFile := filepath.Join(dir, "pw"), filepath.Join(dir, "empty")
	if err := os.WriteFile(pwFile, []byte(secret+"\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(emptyFile, []byte("\n"+secret), 0o600); err != nil {
		t.Fatal(err)
	}
	noPass := "app@tcp(" + addr + ")/ops?timeout=1s"
	for _, tc := range []struct {
		name string
		env  map[string]string
		args []string
		code int
		want []string
	}{
		{name: "flag selects", args: []string{"--mysql-dsn", dsn}, code: ExitUnavailable, want: []string{"mysql at tcp(" + addr + ")"}},
		{name: "variable selects", env: map[string]string{"LEADERRUN_MYSQL_DSN": dsn}, code: ExitUnavailable, want: []string{"mysql at tcp(" + addr + ")"}},
		{name: "password file", args: []string{"--mysql-dsn", noPass, "--mysql-password-file", pwFile}, code: ExitUnavailable, want: []string{"mysql at"}},
		{name: "MYSQL_PWD", env: map[string]string{"MYSQL_PWD": secret}, args: []string{"--mysql-dsn", noPass}, code: ExitUnavailable, want: []string{"mysql at"}},
		{name: "MYSQL_PWD alone selects nothing", env: map[string]string{"MYSQL_PWD": secret}, code: ExitUsage, want: []string{"no store configured", "--mysql-dsn"}},
		{name: "with --backend and no DSN", args: []string{"--backend", "mysql"}, code: ExitUsage, want: []string{"--mysql-dsn"}},
		{name: "with etcd too", env: map[string]string{"ETCDCTL_ENDPOINTS": "127.0.0.1:2379"}, args: []string{"--mysql-dsn", dsn}, code: ExitUsage,
			want: []string{"several stores", "mysql", "etcd"}},
		{name: "flag of another store", args: []string{"--backend", "mysql", "--mysql-dsn", dsn, "--redis-url", "redis://127.0.0.1:1"}, code: ExitUsage,
			want: []string{"--redis-url", "redis store"}},
		{name: "bad DSN", args: []string{"--mysql-dsn", "app:" + secret + "@tcp(127.0.0.1:1/ops"}, code: ExitUsage, want: []string{"--mysql-dsn", "DSN"}},
		{name: "no database", args: []string{"--mysql-dsn", "app:" + secret + "@tcp(" + addr + ")/"}, code: ExitUsage, want: []string{"--mysql-dsn", "no database"}},
		{name: "table with a database", args: []string{"--mysql-dsn", "app:" + secret + "@tcp(" + addr + ")/?timeout=1s", "--mysql-table", "ops.locks"},
			code: ExitUnavailable, want: []string{"mysql at"}},
		{name: "bad table", args: []string{"--mysql-dsn", dsn, "--mysql-table", "a;b"}, code: ExitUsage, want: []string{"--mysql-table", `"a;b"`}},
		{name: "empty table", args: []string{"--mysql-dsn", dsn, "--mysql-table", " "}, code: ExitUsage, want: []string{"--mysql-table"}},
		{name: "missing password file", args: []string{"--mysql-dsn", noPass, "--mysql-password-file", filepath.Join(dir, "none")}, code: ExitUsage,
			want: []string{"--mysql-password-file"}},
		{name: "empty password file", args: []string{"--mysql-dsn", noPass, "--mysql-password-file", emptyFile}, code: ExitUsage,
			want: []string{"--mysql-password-file", "first line is empty"}},
		{name: "two passwords", args: []string{"--mysql-dsn", dsn, "--mysql-password-file", pwFile}, code: ExitUsage,
			want: []string{"--mysql-dsn", "--mysql-password-file"}},
		{name: "CA with skip-verify", args: []string{"--mysql-dsn", dsn + "&tls=skip-verify", "--mysql-ssl-ca", pwFile}, code: ExitUsage,
			want: []string{"--mysql-ssl-ca", "tls=skip-verify"}},
		{name: "CA not PEM", args: []string{"--mysql-dsn", dsn, "--mysql-ssl-ca", pwFile}, code: ExitUsage, want: []string{"--mysql-ssl-ca", "no PEM"}},
		{name: "certificate without key", args: []string{"--mysql-dsn", dsn, "--mysql-ssl-cert", pwFile}, code: ExitUsage, want: []string{"--mysql-ssl-cert", "key"}},
		{name: "unknown TLS name", args: []string{"--mysql-dsn", dsn + "&tls=custom"}, code: ExitUsage, want: []string{"--mysql-dsn", "custom"}},
	} {
		for _, command := range []string{"run", "status", "history"} {
			t.Run(tc.name+"/"+command, func(t *testing.T) {
				for k, v := range tc.env {
					t.Setenv(k, v)
				}
				args := append([]string{"leaderrun", command, "--lock", "myflags"}, tc.args...)
				if command == "run" {
					args = append(args, "--try", "--", "true")
				}
				var stdout, stderr bytes.Buffer
				code := run(args, &stdout, &stderr)
				out := stdout.String() + stderr.String()
				if code != tc.code {
					t.Errorf("exit %d, want %d:\n%s", code, tc.code, out)
				}
				// run logs to the process's own stderr, out of reach here.
				for _, w := range tc.want {
					if command == "run" && tc.code == ExitUnavailable {
						break
					}
					if !strings.Contains(out, w) {
						t.Errorf("output does not say %q:\n%s", w, out)
					}
				}
				for _, p := range []string{"CRET", "ab/cd", "cd,ef", "ef:", "SE@"} {
					if strings.Contains(out, p) {
						t.Errorf("output shows %q, a piece of the password:\n%s", p, out)
					}
				}
			})
		}
	}
}

// TestMySQLHelp: the store's flags are in the Store category of run's
// help, with their variables, the password's other sources, the default
// table and the warning about argv.
func TestMySQLHelp(t *testing.T) {
	clearMySQLVars(t)
	t.Setenv("LEADERRUN_MYSQL_DSN", "app:hunter2-help@tcp(127.0.0.1:3306)/ops")
	var stdout, stderr bytes.Buffer
	if code := run([]string{"leaderrun", "run", "--help"}, &stdout, &stderr); code != 0 {
		t.Fatalf("run --help: exit %d: %s", code, stderr.String())
	}
	help := stdout.String()
	store := help[strings.Index(help, "Store"):]
	for _, w := range []string{"--mysql-dsn DSN", "$LEADERRUN_MYSQL_DSN", "--mysql-password-file FILE", "$LEADERRUN_MYSQL_PASSWORD_FILE",
		"MYSQL_PWD", "--mysql-table TABLE", `"leaderrun_locks"`, "--mysql-ssl-ca FILE", "--mysql-ssl-cert FILE", "--mysql-ssl-key FILE",
		"visible to every user", "tls=true", "mysql"} {
		if !strings.Contains(store, w) {
			t.Errorf("the Store section of run --help does not mention %q", w)
		}
	}
	if strings.Contains(help, "hunter2-help") {
		t.Error("--help shows the password from the environment")
	}
}

// TestMySQLRisks: the warnings at start, as the command line gives the
// settings; none quotes the password.
func TestMySQLRisks(t *testing.T) {
	const secret = "hunter2-risky"
	for _, tc := range []struct {
		name string
		env  map[string]string
		args []string
		want []string // a piece of each warning, in order
	}{
		{name: "password in argv to localhost", args: []string{"--mysql-dsn", "app:" + secret + "@tcp(127.0.0.1:3306)/ops"},
			want: []string{"--mysql-dsn holds a secret in the arguments"}},
		{name: "password in the variable, to a remote host", env: map[string]string{"LEADERRUN_MYSQL_DSN": "app:" + secret + "@tcp(db.example:3306)/ops"},
			want: []string{"the MySQL login and every statement cross the network to db.example:3306 in clear text"}},
		{name: "MYSQL_PWD to a remote host, with TLS", env: map[string]string{"MYSQL_PWD": secret}, args: []string{"--mysql-dsn", "app@tcp(db.example:3306)/ops?tls=true"}},
		{name: "password file to a remote host, with a CA", args: []string{"--mysql-dsn", "app@tcp(db.example:3306)/ops", "--mysql-password-file", "/x", "--mysql-ssl-ca", "/ca"}},
		{name: "password file to a remote host", args: []string{"--mysql-dsn", "app@tcp(db.example:3306)/ops", "--mysql-password-file", "/x"},
			want: []string{"in clear text"}},
		{name: "unix socket", env: map[string]string{"MYSQL_PWD": secret}, args: []string{"--mysql-dsn", "app@unix(/run/mysqld/mysqld.sock)/ops"}},
		{name: "no password, remote", args: []string{"--mysql-dsn", "app@tcp(db.example:3306)/ops"}},
		{name: "skip-verify", env: map[string]string{"LEADERRUN_MYSQL_DSN": "app@tcp(db.example:3306)/ops?tls=skip-verify"},
			want: []string{"tls=skip-verify in --mysql-dsn: the server's certificate is not checked"}},
		{name: "preferred, password in argv", args: []string{"--mysql-dsn", "app:" + secret + "@tcp(db.example:3306)/ops?tls=preferred"},
			want: []string{"--mysql-dsn holds a secret", "tls=preferred"}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			clearMySQLVars(t)
			for k, v := range tc.env {
				t.Setenv(k, v)
			}
			args := append([]string{"leaderrun"}, tc.args...)
			var got []string
			app := &cli.App{Flags: storeFlags(), Metadata: map[string]any{argsKey: args},
				Action: func(c *cli.Context) error { got = mysqlRisks(c, commandLineFlags(c)); return nil }}
			if err := app.Run(args); err != nil {
				t.Fatal(err)
			}
			if len(got) != len(tc.want) {
				t.Fatalf("risks %q, want %d like %q", got, len(tc.want), tc.want)
			}
			for i, w := range tc.want {
				if !strings.Contains(got[i], w) {
					t.Errorf("risk %d: %q, want it to say %q", i, got[i], w)
				}
			}
			if slices.ContainsFunc(got, func(r string) bool { return strings.Contains(r, secret) }) {
				t.Errorf("a warning shows the password: %q", got)
			}
		})
	}
}

// TestMySQLCredentialsNotPassed: the variables that carry the store's
// credentials are removed from the command's environment; MYSQL_PWD,
// the mysql client's own, stays for the job.
func TestMySQLCredentialsNotPassed(t *testing.T) {
	want := []string{"LEADERRUN_MYSQL_DSN", "LEADERRUN_MYSQL_PASSWORD_FILE", "LEADERRUN_MYSQL_SSL_CERT", "LEADERRUN_MYSQL_SSL_KEY"}
	if !slices.Equal(mysqlStore.credentials, want) {
		t.Errorf("credentials removed: %v, want %v", mysqlStore.credentials, want)
	}
}
