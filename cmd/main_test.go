package cmd

import (
	"bytes"
	"strings"
	"testing"

	// Runs that get as far as the runner launch this test binary as
	// their watchdog, as leaderrun launches itself.
	_ "github.com/leaderrun/leaderrun/takeover"
)

// TestHelpKeepsCategories: the flags of a command's help are grouped under
// their categories, however help is asked for, although a run that prints
// no help drops the categories to parse faster.
func TestHelpKeepsCategories(t *testing.T) {
	tests := []struct {
		name string
		args []string
		want []string
	}{
		{"run --help", []string{"run", "--help"}, []string{"Lock", "Timing", "Child", "Store", "Logging"}},
		{"default command -h", []string{"--lock", "x", "-h"}, []string{"Lock", "Timing", "Store"}},
		{"status --help", []string{"status", "--help"}, []string{"Lock", "Store", "Logging"}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			var out bytes.Buffer
			if code := run(append([]string{"leaderrun"}, tt.args...), &out, &out); code != 0 {
				t.Fatalf("exit %d:\n%s", code, out.String())
			}
			lines := map[string]bool{}
			for _, l := range strings.Split(out.String(), "\n") {
				lines[strings.TrimSpace(l)] = true
			}
			for _, c := range tt.want {
				if !lines[c] {
					t.Errorf("no %q heading in:\n%s", c, out.String())
				}
			}
		})
	}
}

// TestWantsHelp: only a help flag before "--" asks for help; the
// command's own -h does not.
func TestWantsHelp(t *testing.T) {
	tests := []struct {
		name string
		args []string
		want bool
	}{
		{"run --help", []string{"leaderrun", "run", "--help"}, true},
		{"-h", []string{"leaderrun", "--lock", "x", "-h"}, true},
		{"completion", []string{"leaderrun", "--generate-bash-completion"}, true},
		{"child's -h", []string{"leaderrun", "--lock", "x", "--", "grep", "-h", "x"}, false},
		{"plain run", []string{"leaderrun", "--lock", "x", "--", "true"}, false},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			if got := wantsHelp(tt.args); got != tt.want {
				t.Errorf("wantsHelp(%q) = %v, want %v", tt.args, got, tt.want)
			}
		})
	}
}
