package testenv

import (
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"sync"
	"testing"
)

var build struct {
	once sync.Once
	path string
	err  error
}

// Leaderrun builds the leaderrun binary once per test process and returns
// its path. Tests run it as users do: as a separate process, with real
// signals. It is built as users build it, without the race detector, so that
// the latencies the tests assert are the ones users get; the runner's own
// tests cover races in-process.
func Leaderrun(t testing.TB) string {
	t.Helper()
	path, err := BuildLeaderrun()
	if err != nil {
		t.Fatal(err)
	}
	return path
}

// BuildLeaderrun builds the binary, once; a TestMain calls it so that no
// test's timing includes the build.
func BuildLeaderrun() (string, error) {
	build.once.Do(func() {
		dir, err := os.MkdirTemp("", "leaderrun-test-bin-")
		if err != nil {
			build.err = err
			return
		}
		build.path = filepath.Join(dir, "leaderrun")
		_, file, _, _ := runtime.Caller(0)
		root := filepath.Join(filepath.Dir(file), "..", "..")
		cmd := exec.Command("go", "build", "-o", build.path, ".")
		cmd.Dir = root
		if out, err := cmd.CombinedOutput(); err != nil {
			build.err = fmt.Errorf("build leaderrun: %w\n%s", err, out)
		}
	})
	return build.path, build.err
}
