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

// ReleaseFlags are the go build flags of a release (.goreleaser.yaml): no
// file paths or symbol tables in the binary, and none of urfave/cli's
// documentation generators; it is built with CGO_ENABLED=0 too, as a
// release is (a static binary: no libc mapped, 1.4 MiB less resident).
// Keep the two in step.
var ReleaseFlags = []string{"-trimpath", "-ldflags=-s -w", "-tags=urfave_cli_no_docs"}

var build struct {
	once sync.Once
	path string
	err  error
}

// Leaderrun builds the leaderrun binary once per test process and returns
// its path; leaderrun-aws, which leaderrun hands a DynamoDB run over
// to, is built beside it, as a release installs it. Tests run it as users
// do: as a separate process, with real signals. It is built as releases are built (ReleaseFlags), without the
// race detector, so that the latencies and memory the tests and the
// benchmark measure are the ones users get; the runner's own tests cover
// races in-process.
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
		cmd := exec.Command("go", append(append([]string{"build"}, ReleaseFlags...), "-o", dir+"/", ".", "./cmd/leaderrun-aws")...)
		cmd.Dir = root
		cmd.Env = append(os.Environ(), "CGO_ENABLED=0")
		if out, err := cmd.CombinedOutput(); err != nil {
			build.err = fmt.Errorf("build leaderrun: %w\n%s", err, out)
		}
	})
	return build.path, build.err
}
