package azureblob_test

import (
	"os/exec"
	"strings"
	"testing"
)

// TestNoApacheArrow: azblob from v1.8.1 on makes its container package
// (which the lease package imports) import Apache Arrow, for a list format
// leaderrun never asks for: 2.5 MB of binary and 1.1 ms of package init on
// every start, whatever the store (docs/backends/azureblob.md). An
// upgrade of the SDK must not bring it in unnoticed.
func TestNoApacheArrow(t *testing.T) {
	out, err := exec.Command("go", "list", "-deps", "github.com/leaderrun/leaderrun").CombinedOutput()
	if err != nil {
		t.Fatalf("go list -deps: %v\n%s", err, out)
	}
	deps := string(out)
	if !strings.Contains(deps, "github.com/Azure/azure-sdk-for-go/sdk/storage/azblob/lease\n") {
		t.Fatalf("leaderrun does not link azblob's lease package:\n%s", deps)
	}
	for _, line := range strings.Split(deps, "\n") {
		if strings.Contains(line, "apache/arrow") || strings.Contains(line, "azidentity") {
			t.Errorf("leaderrun links %s", line)
		}
	}
}
