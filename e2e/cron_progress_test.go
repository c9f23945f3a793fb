//go:build linux

package e2e

import (
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"

	"github.com/leaderrun/leaderrun/internal/testenv"
)

// The paths the progress recipe of docs/recipes.md names.
const (
	reindexRun   = "/opt/reindex/run"
	reindexShard = "/opt/reindex/shard"
)

// progressRecipe reads the progress recipe of docs/recipes.md: the
// crontab lines and the job's script; the README's Progress section must
// show the same job line and script.
func progressRecipe(t *testing.T) (cronFile, string) {
	t.Helper()
	data, err := os.ReadFile("../docs/recipes.md")
	if err != nil {
		t.Fatal(err)
	}
	var cf cronFile
	for _, l := range readmeBlock(t, string(data), "Put these lines in the crontab of every host that could run the reindex") {
		if m := cronVar.FindStringSubmatch(l); m != nil {
			cf.env = append(cf.env, m[1]+"="+m[2])
			continue
		}
		fields := strings.Fields(l)
		if len(fields) < 6 || cf.cmd != "" {
			t.Fatalf("docs/recipes.md: want variables and one job line, got %q", l)
		}
		cf.sched, cf.cmd = strings.Join(fields[:5], " "), strings.Join(fields[5:], " ")
	}
	script := readmeBlock(t, string(data), "and make `"+reindexRun+"` report after each shard")
	if cf.cmd == "" || len(script) == 0 || script[0] != "#!/bin/sh" {
		t.Fatalf("docs/recipes.md: no progress recipe (job line %q, script %q)", cf.cmd, script)
	}
	readme, err := os.ReadFile("../README.md")
	if err != nil {
		t.Fatal(err)
	}
	line := readmeBlock(t, string(readme), "without a report is stopped so that another host can take over")
	if len(line) != 1 || strings.Join(strings.Fields(line[0])[5:], " ") != cf.cmd {
		t.Errorf("README's Progress section shows %q, docs/recipes.md's job line is %q", line, cf.cmd)
	}
	code := func(lines []string) []string {
		return slices.DeleteFunc(slices.Clone(lines), func(l string) bool { return strings.HasPrefix(l, "# ") })
	}
	if readmeScript := readmeBlock(t, string(readme), "and `"+reindexRun+"` reports after each shard"); !slices.Equal(code(readmeScript), code(script)) {
		t.Errorf("README's script %q differs from docs/recipes.md's %q", readmeScript, script)
	}
	return cf, strings.Join(script, "\n") + "\n"
}

// TestCronProgressRecipe runs the progress recipe of docs/recipes.md as
// cron runs it (as TestCronRecipe does: verbatim in a private mount
// namespace when the test may, else with the paths replaced), on the local
// store, with a stand-in for /opt/reindex/shard. All shards run and
// report, and nothing is printed; with a shard that hangs (the timeout
// made 5s: each shard before it, and its report, must come within it on a
// busy machine), the job is stopped, leaderrun exits 124, what cron would mail
// says why, and the history records the term as stalled.
func TestCronProgressRecipe(t *testing.T) {
	t.Parallel()
	cf, script := progressRecipe(t)
	if !strings.Contains(cf.cmd, "--progress-timeout 5m") {
		t.Fatalf("the job line %q has no --progress-timeout 5m to shorten", cf.cmd)
	}
	verbatim := privateMounts(t)
	for _, tc := range []struct {
		name   string
		hang   bool
		code   int
		shards int
		output string // in what cron would mail; "" for nothing at all
		end    string
	}{
		{name: "as written", code: 0, shards: 64, end: "exited"},
		{name: "a shard hangs", hang: true, code: 124, shards: 3, output: "no progress reported", end: "stalled"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			dir, state := t.TempDir(), t.TempDir()
			out := filepath.Join(dir, "shards")
			shard := fmt.Sprintf("#!/bin/sh\necho \"shard $1 token=$FENCE_TOKEN\" >> %s\n", out)
			line := cf.cmd
			if tc.hang {
				shard = "#!/bin/sh\nif [ \"$1\" = 3 ]; then exec sleep 3600; fi\n" + strings.TrimPrefix(shard, "#!/bin/sh\n")
				line = strings.Replace(line, "--progress-timeout 5m", "--progress-timeout 5s", 1)
			}
			run, shardPath := filepath.Join(dir, "run"), filepath.Join(dir, "shard")
			job := script
			if !verbatim {
				job = strings.ReplaceAll(strings.ReplaceAll(job, unitLeaderrun, testenv.Leaderrun(t)), reindexShard, shardPath)
				line = strings.ReplaceAll(strings.ReplaceAll(line, unitLeaderrun, testenv.Leaderrun(t)), reindexRun, run)
			}
			for path, text := range map[string]string{run: job, shardPath: shard} {
				testenv.WriteExecutable(t, path, []byte(text), 0o755)
			}
			env := cronEnviron(t, cf, state, true)
			argv := append(append([]string{"env", "-i"}, env...), "/bin/sh", "-c", line)
			if verbatim {
				extra := fmt.Sprintf("mkdir /opt/reindex\ncp %s %s\ncp %s %s", run, reindexRun, shardPath, reindexShard)
				argv = inPrivateMounts(t, run, extra, argv...)
			}
			output, code := runAsCron(t, argv, env)
			t.Logf("sh -c %q (verbatim: %v): exit %d, output %q", line, verbatim, code, output)
			if code != tc.code {
				t.Errorf("exit %d, want %d", code, tc.code)
			}
			if got := strings.TrimSpace(string(output)); (tc.output == "") != (got == "") || !strings.Contains(got, tc.output) {
				t.Errorf("printed %q, want %q", got, tc.output)
			}
			data, _ := os.ReadFile(out)
			if n := strings.Count(string(data), "shard "); n != tc.shards {
				t.Errorf("%d shards ran, want %d: %q", n, tc.shards, data)
			}
			if terms := localHistory(t, state, "reindex"); len(terms) != 1 || terms[0]["end"] != tc.end {
				t.Errorf("history %v, want one term that %s", terms, tc.end)
			}
		})
	}
}
