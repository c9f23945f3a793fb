package testenv

import (
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
	out  []byte
}

// Leaderrun builds the leaderrun binary once per test process, with the race
// detector, and returns its path. Tests run it as users do: as a separate
// process, with real signals.
func Leaderrun(t testing.TB) string {
	t.Helper()
	build.once.Do(func() {
		dir, err := os.MkdirTemp("", "leaderrun-test-bin-")
		if err != nil {
			build.err = err
			return
		}
		build.path = filepath.Join(dir, "leaderrun")
		_, file, _, _ := runtime.Caller(0)
		root := filepath.Join(filepath.Dir(file), "..", "..")
		cmd := exec.Command("go", "build", "-race", "-o", build.path, ".")
		cmd.Dir = root
		build.out, build.err = cmd.CombinedOutput()
	})
	if build.err != nil {
		t.Fatalf("build leaderrun: %v\n%s", build.err, build.out)
	}
	return build.path
}
