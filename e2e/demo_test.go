//go:build linux

package e2e

import (
	"os"
	"os/exec"
	"strings"
	"testing"
)

// TestDemoMatchesReadme: scripts/demo.sh prints what the README's quick
// start says it prints, line for line and in that order. Not in parallel:
// the order of the third job's first line and the --try's exit, which the
// script takes for granted once status names the job's leaderrun, is a
// race that a busy machine can lose.
func TestDemoMatchesReadme(t *testing.T) {
	readme, err := os.ReadFile("../README.md")
	if err != nil {
		t.Fatal(err)
	}
	want := readmeBlock(t, string(readme), "`scripts/demo.sh` prints")
	out, err := exec.Command("../scripts/demo.sh").CombinedOutput()
	if err != nil {
		t.Fatalf("scripts/demo.sh: %v\n%s", err, out)
	}
	var got []string
	for _, l := range strings.Split(string(out), "\n") {
		if l = strings.TrimSpace(l); l != "" {
			got = append(got, l)
		}
	}
	i := 0
	for _, l := range got {
		if i < len(want) && l == want[i] {
			i++
		}
	}
	if i < len(want) {
		t.Errorf("scripts/demo.sh did not print %q (and what follows it in the README) in order; it printed:\n%s", want[i], out)
	}
}

// readmeBlock returns the non-empty lines, trimmed, of the indented code
// block that follows the paragraph starting with intro.
func readmeBlock(t *testing.T, readme, intro string) []string {
	t.Helper()
	_, rest, ok := strings.Cut(readme, "\n"+intro)
	if !ok {
		t.Fatalf("README has no paragraph starting %q", intro)
	}
	_, rest, _ = strings.Cut(rest, "\n\n")
	var lines []string
	for _, l := range strings.Split(rest, "\n") {
		switch {
		case strings.HasPrefix(l, "    "):
			lines = append(lines, strings.TrimSpace(l))
		case strings.TrimSpace(l) == "":
		default:
			return lines
		}
	}
	return lines
}
