//go:build linux

package e2e

import (
	"errors"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/leaderrun/leaderrun/internal/testenv"
)

// fencingScript is examples/fencing/sqlite-job.sh in this checkout.
func fencingScript() string {
	_, file, _, _ := runtime.Caller(0)
	return filepath.Join(filepath.Dir(file), "..", "examples", "fencing", "sqlite-job.sh")
}

// fenceRow is row 1 of the example's table: the token and value of the last
// accepted write.
func fenceRow(t *testing.T, db string) (token uint64, value string) {
	t.Helper()
	out, err := exec.Command("sqlite3", "-batch", db, "SELECT fence_token || '|' || value FROM job_state WHERE id = 1").CombinedOutput()
	if err != nil {
		t.Fatalf("read %s: %v\n%s", db, err, out)
	}
	tok, value, ok := strings.Cut(strings.TrimSpace(string(out)), "|")
	token, err = strconv.ParseUint(tok, 10, 64)
	if !ok || err != nil {
		t.Fatalf("row 1 of %s is %q, want TOKEN|VALUE", db, out)
	}
	return token, value
}

// TestFencingSQLite runs the SQLite fencing example for real: two runs
// under leaderrun write with increasing tokens, then a paused old leader's
// late write, carrying the first run's token, is rejected and changes
// nothing.
func TestFencingSQLite(t *testing.T) {
	t.Parallel()
	if _, err := exec.LookPath("sqlite3"); err != nil {
		testenv.Missing(t, "sqlite3 not found: apt-get install sqlite3")
	}
	dir := t.TempDir()
	db := filepath.Join(dir, "fence.db")
	script := fencingScript()

	run := func(value string) uint64 {
		t.Helper()
		p := start(t, nil, append(localArgs(dir, "fence"), "--", script, db, value)...)
		if code := p.wait(10 * time.Second); code != 0 {
			t.Fatalf("leaderrun with %s exited %d, want 0:\n%s", value, code, p.stderr.String())
		}
		token, got := fenceRow(t, db)
		if got != value {
			t.Fatalf("after the %s run the row holds %q (token %d), want %q", value, got, token, value)
		}
		return token
	}
	first := run("first")
	second := run("second")
	if second <= first {
		t.Fatalf("second leader wrote with token %d, want more than the first's %d", second, first)
	}

	// The first leader, paused before its write and resumed after the
	// second leader's, still holds its old token. leaderrun would set
	// FENCE_TOKEN itself, so the late write runs the script directly.
	stale := exec.Command(script, db, "stale")
	stale.Env = append(os.Environ(), "FENCE_TOKEN="+strconv.FormatUint(first, 10))
	out, err := stale.CombinedOutput()
	var ee *exec.ExitError
	if !errors.As(err, &ee) || ee.ExitCode() != 3 {
		t.Errorf("stale write with token %d: %v, want exit status 3:\n%s", first, err, out)
	}
	if !strings.Contains(string(out), "rejected") {
		t.Errorf("stale write's output does not say it was rejected:\n%s", out)
	}
	if token, value := fenceRow(t, db); token != second || value != "second" {
		t.Errorf("after the stale write the row holds %q with token %d, want %q with %d", value, token, "second", second)
	}

	// The current leader retrying its own write is accepted: the guard is
	// fence_token <= FENCE_TOKEN, not <.
	retry := exec.Command(script, db, "second, retried")
	retry.Env = append(os.Environ(), "FENCE_TOKEN="+strconv.FormatUint(second, 10))
	if out, err := retry.CombinedOutput(); err != nil {
		t.Errorf("retry with the current token %d: %v\n%s", second, err, out)
	}
	if token, value := fenceRow(t, db); token != second || value != "second, retried" {
		t.Errorf("after the retry the row holds %q with token %d, want %q with %d", value, token, "second, retried", second)
	}
	t.Logf("first leader wrote with token %d, second with %d", first, second)
}
