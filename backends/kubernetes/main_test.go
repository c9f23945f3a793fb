package kubernetes

import (
	"os"
	"testing"

	"github.com/leaderrun/leaderrun/internal/testenv"
)

// TestMain stops the apiserver that the package's tests share (see
// testenv.SharedKube): one start costs seconds, and every test works in a
// namespace of its own.
func TestMain(m *testing.M) {
	code := m.Run()
	testenv.StopSharedKube()
	os.Exit(code)
}
