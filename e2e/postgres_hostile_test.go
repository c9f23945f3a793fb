//go:build linux

package e2e

import (
	"net"
	"os"
	"os/exec"
	"os/user"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/leaderrun/leaderrun/internal/testenv"
)

// TestPostgresHostileServer: a server that answers without end cannot
// drive leaderrun's memory: against a fake PostgreSQL that sends data rows
// without end, one row of 1 GiB, or parameter statuses without end at
// start-up, leaderrun (waiting for the lock, as under systemd) exits 69
// within 15 s, naming the bound, with a peak RSS under 64 MiB.
func TestPostgresHostileServer(t *testing.T) {
	t.Parallel()
	const maxRSS = 64 << 10 // KiB, as ru_maxrss counts
	wrapper := rusageWrapper(t)
	for _, tc := range []struct {
		name   string
		answer testenv.HostileAnswer
		want   string
	}{
		// Rows of columns the statement does not return: refused at the
		// first, the connection closed rather than the rest read (a
		// second row of the right columns: TestRowsBounded in
		// backends/postgres).
		{"EndlessRows", testenv.EndlessRows, "the server's answer is not what the statement returns"},
		{"HugeRow", testenv.HugeRow, "invalid body length"},
		{"EndlessParameters", testenv.EndlessParameters, "more than 4 MiB in one answer"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			fake := testenv.StartHostilePostgres(t, tc.answer)
			report := filepath.Join(t.TempDir(), "rusage")
			began := time.Now()
			p := startProgram(t, []string{"LEADERRUN_POSTGRES_URL=" + fake.URL(), "RUSAGE_REPORT=" + report},
				wrapper, testenv.Leaderrun(t), "--lock", "hostile", "--", "/bin/true")
			code := p.wait(30 * time.Second)
			took := time.Since(began)
			data, err := os.ReadFile(report)
			if err != nil {
				t.Fatalf("the wrapper reported nothing: %v\n%s", err, p.stderr.String())
			}
			rss, _ := strconv.Atoi(strings.TrimSpace(string(data)))
			t.Logf("exit %d after %v, peak RSS %d KiB: %s", code, took.Round(time.Millisecond), rss,
				grep(p.stderr.String(), "level=ERROR"))
			if code != 69 || !strings.Contains(p.stderr.String(), tc.want) {
				t.Errorf("exit %d; want 69 saying %q", code, tc.want)
			}
			if took > 15*time.Second {
				t.Errorf("took %v, want under 15 s", took)
			}
			if rss <= 0 || rss >= maxRSS {
				t.Errorf("peak RSS %d KiB, want under %d", rss, maxRSS)
			}
		})
	}
}

// rusageWrapperSource runs its arguments as a command and writes the
// command's peak RSS (ru_maxrss from wait4, KiB) to $RUSAGE_REPORT,
// exiting with the command's status. A command that this test process
// started itself would not do: Go starts it with vfork, and Linux counts
// the test process's own resident set (tens of MiB under -race) in the
// ru_maxrss of a child that execs from its memory. The wrapper is small,
// and so is what it passes on.
const rusageWrapperSource = `package main

import (
	"os"
	"os/exec"
	"strconv"
	"syscall"
)

func main() {
	cmd := exec.Command(os.Args[1], os.Args[2:]...)
	cmd.Stdin, cmd.Stdout, cmd.Stderr = os.Stdin, os.Stdout, os.Stderr
	_ = cmd.Run()
	if cmd.ProcessState == nil {
		os.Exit(127)
	}
	rss := cmd.ProcessState.SysUsage().(*syscall.Rusage).Maxrss
	_ = os.WriteFile(os.Getenv("RUSAGE_REPORT"), []byte(strconv.FormatInt(rss, 10)+"\n"), 0o600)
	os.Exit(cmd.ProcessState.ExitCode())
}
`

// rusageWrapper builds rusageWrapperSource and returns its path.
func rusageWrapper(t *testing.T) string {
	t.Helper()
	dir := t.TempDir()
	if err := os.WriteFile(filepath.Join(dir, "main.go"), []byte(rusageWrapperSource), 0o600); err != nil {
		t.Fatal(err)
	}
	bin := filepath.Join(dir, "rusage")
	cmd := exec.Command("go", "build", "-o", bin, "main.go")
	cmd.Dir = dir
	cmd.Env = append(os.Environ(), "GO111MODULE=off", "CGO_ENABLED=0", "GOFLAGS=")
	if out, err := cmd.CombinedOutput(); err != nil {
		t.Fatalf("build the rusage wrapper: %v\n%s", err, out)
	}
	return bin
}

// TestPostgresNoHostNoTmp: with no host anywhere (not in the URL, no
// PGHOST), a root leaderrun looks for the server's socket in
// /var/run/postgresql only, as Debian's libpq does, and never connects to
// a socket that another user bound in /tmp, even where
// /var/run/postgresql does not exist (pgx's own default would then be
// /tmp). It runs in a mount namespace of its own whose /run is empty, and
// a socket with the port's name waits in /tmp, owned by another user:
// leaderrun must exit 69 naming /var/run/postgresql and the socket in
// /tmp must see no connection. With PGHOST=/tmp, named, it does connect:
// the socket is there to be found.
func TestPostgresNoHostNoTmp(t *testing.T) {
	t.Parallel()
	if os.Geteuid() != 0 || !privateMounts(t) {
		testenv.Missing(t, "the socket in /tmp needs root and unshare(1), to hide /var/run/postgresql in a mount namespace")
	}
	port := testenv.FreePort(t, "127.0.0.1")
	path := filepath.Join("/tmp", ".s.PGSQL."+strconv.Itoa(port))
	accepted := bindAsOther(t, path)
	ns := []string{"unshare", "--mount", "--propagation", "private", "/bin/sh", "-c",
		`set -e; mount -t tmpfs -o mode=0755 tmpfs /run; test ! -e /var/run/postgresql; exec "$@"`, "ns",
		testenv.Leaderrun(t)}
	env := []string{"HOME=" + t.TempDir(), "PGPASSWORD=secret-for-the-server", "PGUSER=app", "PGPORT=" + strconv.Itoa(port),
		"PGHOST=", "PGSERVICE=", "PGSYSCONFDIR=" + t.TempDir(), "LEADERRUN_POSTGRES_URL=", "DATABASE_URL="}
	for _, tc := range []struct {
		name    string
		env     []string
		args    []string
		connect bool
	}{
		{"PG variables", nil, []string{"--backend", "postgres"}, false},
		{"URL without a host", []string{"LEADERRUN_POSTGRES_URL=postgres://app@/postgres?port=" + strconv.Itoa(port)}, nil, false},
		{"PGHOST=/tmp, named", []string{"PGHOST=/tmp"}, []string{"--backend", "postgres"}, true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			args := append(append(append(ns[1:], "--lock", "no-host"), tc.args...), "--try", "--", "/bin/true")
			cmd := exec.Command(ns[0], args...)
			cmd.Env = append(append(os.Environ(), env...), tc.env...)
			out, _ := cmd.CombinedOutput()
			code := cmd.ProcessState.ExitCode()
			t.Logf("exit %d: %s", code, grep(string(out), "level=ERROR"))
			if code != 69 {
				t.Errorf("exit %d, want 69:\n%s", code, out)
			}
			select {
			case <-accepted:
				if !tc.connect {
					t.Errorf("leaderrun connected to %s, a socket another user bound in /tmp", path)
				}
			case <-time.After(100 * time.Millisecond):
				if tc.connect {
					t.Errorf("leaderrun did not connect to %s, named in PGHOST", path)
				}
			}
			if want := "/var/run/postgresql/.s.PGSQL." + strconv.Itoa(port); !tc.connect && !strings.Contains(string(out), want) {
				t.Errorf("the output does not name %s", want)
			}
		})
	}
}

// bindAsOther binds a unix socket at path, owned by nobody and open to
// all, as another user of the host could, and reports each connection it
// accepts (closing it at once) on the returned channel.
func bindAsOther(t *testing.T, path string) <-chan struct{} {
	t.Helper()
	nobody, err := user.Lookup("nobody")
	if err != nil {
		t.Fatal(err)
	}
	uid, _ := strconv.Atoi(nobody.Uid)
	gid, _ := strconv.Atoi(nobody.Gid)
	ln, err := net.Listen("unix", path)
	if err != nil {
		t.Fatal(err)
	}
	accepted := make(chan struct{}, 1)
	done := make(chan struct{})
	t.Cleanup(func() {
		ln.Close()
		<-done
	})
	if err := os.Chown(path, uid, gid); err != nil {
		t.Fatal(err)
	}
	if err := os.Chmod(path, 0o777); err != nil {
		t.Fatal(err)
	}
	go func() {
		defer close(done)
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			c.Close()
			select {
			case accepted <- struct{}{}:
			default:
			}
		}
	}()
	return accepted
}
