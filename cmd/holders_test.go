package cmd

import (
	"bytes"
	"encoding/json"
	"os"
	"strings"
	"testing"
)

// TestHoldersFlagErrors: --holders and --once-per-slot out of range or out
// of place are usage errors (exit 64) that name the flag and the value,
// before anything touches the store, for run, status and history alike.
func TestHoldersFlagErrors(t *testing.T) {
	dir := t.TempDir()
	local := []string{"--backend", "local", "--state-dir", dir, "--lock", "pool"}
	tests := []struct {
		name string
		args []string
		env  string
		want string
	}{
		{"zero", []string{"run", "--holders", "0"}, "", "--holders 0: want 1-100"},
		{"negative", []string{"run", "--holders", "-3"}, "", "--holders -3: want 1-100"},
		{"too many", []string{"run", "--holders", "101"}, "", "--holders 101: want 1-100"},
		{"from the variable", []string{"run"}, "LEADERRUN_HOLDERS=1000", "--holders 1000: want 1-100"},
		{"not a number", []string{"run", "--holders", "three"}, "", "holders"},
		{"once-per-slot alone", []string{"run", "--holders", "3", "--once-per-slot"}, "", "--once-per-slot needs --once-per or --once-key"},
		{"status", []string{"status", "--holders", "0"}, "", "--holders 0: want 1-100"},
		{"history", []string{"history", "--holders", "101"}, "", "--holders 101: want 1-100"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			if tt.env != "" {
				name, value, _ := strings.Cut(tt.env, "=")
				t.Setenv(name, value)
			}
			args := append(append([]string{"leaderrun"}, tt.args...), local...)
			if tt.args[0] == "run" {
				args = append(args, "--", "true")
			}
			var out bytes.Buffer
			if code := run(args, &out, &out); code != ExitUsage || !strings.Contains(out.String(), tt.want) {
				t.Errorf("%q: exit %d, output:\n%s\nwant exit %d naming %q", args, code, out.String(), ExitUsage, tt.want)
			}
			if entries, _ := os.ReadDir(dir); len(entries) != 0 && tt.args[0] == "run" {
				t.Errorf("a refused run touched the state directory: %v", entries)
			}
		})
	}
}

// TestPoolStatusAndHistory: with --holders N, status lists every slot
// with its holder (text and --json; exit 3 while none is held, 0 with
// one), and history merges the terms of all slots with their slot, newest
// first; without it both print what they always did.
func TestPoolStatusAndHistory(t *testing.T) {
	dir := t.TempDir()
	local := []string{"--backend", "local", "--state-dir", dir, "--lock", "pool"}
	leaderrun := func(command string, args ...string) (string, int) {
		var out bytes.Buffer
		code := run(append(append([]string{"leaderrun", command}, local...), args...), &out, &out)
		return out.String(), code
	}
	if out, code := leaderrun("status", "--holders", "3", "--json"); code != ExitNoLeader || !strings.Contains(out, `"held":0`) {
		t.Fatalf("status of an unused pool: exit %d\n%s", code, out)
	}
	// Two runs, one after the other, each in the lowest free slot, 0;
	// the e2e test TestHolders holds several slots at once.
	for _, id := range []string{"a", "b"} {
		if out, code := leaderrun("run", "--holders", "3", "--identity", id, "--quiet", "--", "true"); code != 0 {
			t.Fatalf("run %s: exit %d\n%s", id, code, out)
		}
	}
	out, code := leaderrun("history", "--holders", "3", "--json")
	if code != 0 {
		t.Fatalf("history: exit %d\n%s", code, out)
	}
	var terms []slotTerm
	for _, line := range strings.Split(strings.TrimSpace(out), "\n") {
		var st slotTerm
		if err := json.Unmarshal([]byte(line), &st); err != nil {
			t.Fatalf("history --json line %q: %v", line, err)
		}
		terms = append(terms, st)
	}
	if len(terms) != 2 || terms[0].Identity != "b" || terms[1].Identity != "a" || terms[0].Slot != 0 || terms[0].Token <= terms[1].Token {
		t.Errorf("history of the pool: %+v; want b then a, in slot 0, tokens increasing", terms)
	}
	if !strings.Contains(line(out, 0), `"slot":0`) {
		t.Errorf("history --json does not name the slot: %s", out)
	}
	text, code := leaderrun("history", "--holders", "3")
	if code != 0 || !strings.HasPrefix(text, "SLOT") {
		t.Errorf("history --holders 3: exit %d\n%s; want a table with a SLOT column", code, text)
	}
	plain, code := leaderrun("history")
	if code != 0 || !strings.HasPrefix(plain, "TOKEN") {
		t.Errorf("history without --holders: exit %d\n%s; want the table of one lock", code, plain)
	}
	text, code = leaderrun("status", "--holders", "3")
	if code != ExitNoLeader || !strings.Contains(text, "0 of 3 slots held") || !strings.Contains(text, "SLOT") {
		t.Errorf("status --holders 3 of a free pool: exit %d\n%s", code, text)
	}
}

func line(s string, i int) string { return strings.Split(s, "\n")[i] }
