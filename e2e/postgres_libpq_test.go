//go:build linux

package e2e

import (
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"testing"

	"github.com/leaderrun/leaderrun/internal/testenv"
)

// pgRunOnce runs `leaderrun --try` on lock with env, a job that creates a
// file, and returns the exit code, the output, and whether the job ran.
func pgRunOnce(t *testing.T, env []string, lock string, args ...string) (int, string, bool) {
	t.Helper()
	ran := filepath.Join(t.TempDir(), "ran")
	args = append(append([]string{"--lock", lock, "--identity", "libpq"}, args...), "--try", "--shell", "--", "touch "+ran)
	env = append([]string{"HOME=" + t.TempDir(), "PGSYSCONFDIR=" + t.TempDir()}, env...)
	stdout, stderr, code := pgOutput(t, env, args...)
	_, err := os.Stat(ran)
	return code, stdout + stderr, err == nil
}

// testPgTargetSessionAttrs: with a hot standby (pg_basebackup -R, in
// recovery) listed before the primary, target_session_attrs=primary and
// =read-write lead on the primary; without it, the standby is taken and
// refuses the write: exit 69 saying it is read-only.
func testPgTargetSessionAttrs(t *testing.T, e *pgEnv) {
	standby := e.pg.StartStandby(t)
	hosts := fmt.Sprintf("postgres://%s:%s@%s,%s/postgres?sslmode=disable", testenv.PostgresSuperuser, e.pg.Password,
		standby.Addr(), e.pg.Addr())
	for _, tc := range []struct {
		attrs string
		leads bool
	}{{"primary", true}, {"read-write", true}, {"any", false}} {
		t.Run(tc.attrs, func(t *testing.T) {
			lock := "tsa-" + tc.attrs
			code, out, ran := pgRunOnce(t, []string{"LEADERRUN_POSTGRES_URL=" + hosts + "&target_session_attrs=" + tc.attrs}, lock)
			t.Logf("exit %d: %s", code, grep(out, "level=ERROR"))
			if !tc.leads {
				if code != 69 || ran || !strings.Contains(out, "read-only") {
					t.Errorf("on the standby: exit %d (job ran: %v), want 69 saying read-only", code, ran)
				}
				return
			}
			if code != 0 || !ran {
				t.Fatalf("exit %d (job ran: %v), want 0 and the job run:\n%s", code, ran, out)
			}
			if n := e.scalar(t, "SELECT "+pgTermsSQL+"::text", "leaderrun/"+lock); n != "1" {
				t.Errorf("the primary has %s terms of %s, want 1", n, lock)
			}
		})
	}
}

// testPgChannelBinding: channel_binding=require authenticates with
// SCRAM-SHA-256-PLUS over TLS; without TLS there is nothing to bind to,
// and the connection is refused before any password is sent.
func testPgChannelBinding(t *testing.T, e *pgEnv) {
	for _, tc := range []struct {
		name, query string
		leads       bool
	}{
		{"TLS", "sslmode=require&channel_binding=require", true},
		{"TLS, verified", "sslmode=verify-full&sslrootcert=" + e.pg.CAFile() + "&channel_binding=require", true},
		{"no TLS", "sslmode=disable&channel_binding=require", false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			url := fmt.Sprintf("postgres://%s:%s@%s/postgres?%s", testenv.PostgresSuperuser, e.pg.Password, e.pg.Addr(), tc.query)
			code, out, ran := pgRunOnce(t, []string{"LEADERRUN_POSTGRES_URL=" + url}, "channel-binding")
			t.Logf("exit %d: %s", code, grep(out, "level=ERROR"))
			switch {
			case tc.leads && (code != 0 || !ran):
				t.Errorf("exit %d (job ran: %v), want 0:\n%s", code, ran, out)
			case !tc.leads && (code != 69 || ran || !strings.Contains(out, "channel binding")):
				t.Errorf("exit %d (job ran: %v), want 69 saying channel binding", code, ran)
			}
			if strings.Contains(out, e.pg.Password) {
				t.Error("the output shows the password")
			}
		})
	}
}

// testPgServiceFile: service=NAME (or PGSERVICE) reads the connection
// from the user's service file (PGSERVICEFILE), or else from
// pg_service.conf in PGSYSCONFDIR; a service defined in neither is a
// usage error naming both files.
func testPgServiceFile(t *testing.T, e *pgEnv) {
	dir := t.TempDir()
	service := fmt.Sprintf("[ops]\nhost=%s\nport=%d\nuser=%s\ndbname=postgres\nsslmode=disable\n",
		e.pg.Host(), e.pg.Port(), testenv.PostgresSuperuser)
	userFile := filepath.Join(dir, "services.conf")
	if err := os.WriteFile(userFile, []byte(service), 0o600); err != nil {
		t.Fatal(err)
	}
	sysDir := t.TempDir()
	if err := os.WriteFile(filepath.Join(sysDir, "pg_service.conf"), []byte(service), 0o644); err != nil {
		t.Fatal(err)
	}
	pw := "PGPASSWORD=" + e.pg.Password
	for _, tc := range []struct {
		name string
		env  []string
		args []string
		code int
		want string
	}{
		{"service= in the URL flag's variable", []string{pw, "PGSERVICEFILE=" + userFile, "LEADERRUN_POSTGRES_URL=service=ops"}, nil, 0, ""},
		{"PGSERVICE and PGSYSCONFDIR", []string{pw, "PGSERVICE=ops", "PGSYSCONFDIR=" + sysDir}, []string{"--backend", "postgres"}, 0, ""},
		{"an unknown service", []string{pw, "PGSERVICEFILE=" + userFile, "LEADERRUN_POSTGRES_URL=service=nowhere"}, nil, 64,
			`service "nowhere" is not defined in ` + userFile},
	} {
		t.Run(tc.name, func(t *testing.T) {
			code, out, ran := pgRunOnce(t, tc.env, "service-"+strconv.Itoa(tc.code), tc.args...)
			t.Logf("exit %d: %s", code, grep(out, "leaderrun: "))
			if code != tc.code || ran != (tc.code == 0) || !strings.Contains(out, tc.want) {
				t.Errorf("exit %d (job ran: %v), want %d saying %q:\n%s", code, ran, tc.code, tc.want, out)
			}
		})
	}
}
