package cmd

import (
	"bytes"
	"strings"
	"testing"

	"github.com/leaderrun/leaderrun/backends"
)

// TestProgressTimeoutFlag: --progress-timeout and LEADERRUN_PROGRESS_TIMEOUT
// as a user meets them. A value the runner cannot keep is exit 64 naming
// the flag (or the variable) and the value, before anything runs; a good
// one runs the command.
func TestProgressTimeoutFlag(t *testing.T) {
	for _, tc := range []struct {
		name string
		flag []string
		env  string // LEADERRUN_PROGRESS_TIMEOUT
		code int
		want string
	}{
		{name: "under a second", flag: []string{"--progress-timeout", "500ms"}, code: ExitUsage,
			want: "--progress-timeout 500ms: want at least 1s (0 turns it off)"},
		{name: "negative", flag: []string{"--progress-timeout", "-5s"}, code: ExitUsage, want: "--progress-timeout -5s: want at least 1s"},
		{name: "over a year", flag: []string{"--progress-timeout", "9000h"}, code: ExitUsage,
			want: "--progress-timeout 9000h is longer than the 8784h"},
		{name: "no unit", flag: []string{"--progress-timeout", "30"}, code: ExitUsage,
			want: `invalid value "30" for --progress-timeout: a duration needs a unit`},
		{name: "not a duration", flag: []string{"--progress-timeout", "soon"}, code: ExitUsage,
			want: `invalid value "soon" for --progress-timeout`},
		{name: "variable under a second", env: "100ms", code: ExitUsage, want: "--progress-timeout 100ms: want at least 1s"},
		{name: "variable without a unit", env: "30", code: ExitUsage,
			want: `invalid value "30" in LEADERRUN_PROGRESS_TIMEOUT: a duration needs a unit`},
		{name: "flag wins over the variable", flag: []string{"--progress-timeout", "1s"}, env: "1ms", code: 0},
		{name: "zero is off", flag: []string{"--progress-timeout", "0"}, code: 0},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Setenv("LEADERRUN_PROGRESS_TIMEOUT", tc.env)
			args := append([]string{"leaderrun", "--backend", "local", "--state-dir", t.TempDir(), "--lock", "progress", "--try"}, tc.flag...)
			var out bytes.Buffer
			code := run(append(args, "--", "true"), &out, &out)
			if code != tc.code {
				t.Fatalf("exit %d, want %d:\n%s", code, tc.code, out.String())
			}
			if tc.want != "" && !strings.Contains(out.String(), tc.want) {
				t.Errorf("output does not say %q:\n%s", tc.want, out.String())
			}
		})
	}
}

// TestProgressDocumentedInHelp: run's --help shows the flag and its
// variable, check's shows --progress, and the exit code is in --help.
func TestProgressDocumentedInHelp(t *testing.T) {
	for _, tc := range []struct {
		args []string
		want []string
	}{
		{[]string{"run", "--help"}, []string{"--progress-timeout D", "$LEADERRUN_PROGRESS_TIMEOUT", "exit 124"}},
		{[]string{"check", "--help"}, []string{"--progress", "--progress-timeout"}},
		{[]string{"--help"}, []string{"124 no progress"}},
	} {
		var out bytes.Buffer
		if code := run(append([]string{"leaderrun"}, tc.args...), &out, &out); code != 0 {
			t.Fatalf("%v: exit %d", tc.args, code)
		}
		for _, w := range tc.want {
			if !strings.Contains(out.String(), w) {
				t.Errorf("%v does not show %q:\n%s", tc.args, w, out.String())
			}
		}
	}
}

// TestCheckProgressOutsideLeaderrun: check --progress with no socket fails
// as check does (exit 1): no answer is no leadership, and the job's loop
// ends.
func TestCheckProgressOutsideLeaderrun(t *testing.T) {
	t.Setenv("LEADERRUN_SOCKET", "")
	var out bytes.Buffer
	if code := run([]string{"leaderrun", "check", "--progress"}, &out, &out); code != ExitNotLeader {
		t.Fatalf("exit %d, want %d:\n%s", code, ExitNotLeader, out.String())
	}
	if !strings.Contains(out.String(), "LEADERRUN_SOCKET is not set") {
		t.Errorf("output %q does not say why", out.String())
	}
}

// TestHistoryShowsStall: history's text says a stalled term stalled, with
// the command's status and the reason.
func TestHistoryShowsStall(t *testing.T) {
	term := backends.Term{End: backends.EndStalled, ExitCode: 143,
		Reason: "no progress reported for --progress-timeout 5m0s (last report 5m0s ago)"}
	if got, want := how(term), "stalled (exit 143): no progress reported for --progress-timeout 5m0s (last report 5m0s ago)"; got != want {
		t.Errorf("how(%+v) = %q, want %q", term, got, want)
	}
}
