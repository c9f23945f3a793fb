//go:build linux

package e2e

import (
	"bufio"
	"bytes"
	"encoding/json"
	"fmt"
	"os"
	"os/exec"
	"os/user"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/leaderrun/leaderrun/internal/testenv"
)

// The crontab recipe (examples/cron/leaderrun-billing) names these paths.
const (
	cronJob = "/opt/billing/run"
	// cronPath is the PATH Debian's cron gives every job.
	cronPath = "PATH=/usr/bin:/bin"
)

// cronFile is an /etc/cron.d file as cron reads it: variable lines, and one
// job line.
type cronFile struct {
	env   []string // NAME=value, in order
	sched string   // the five time fields
	user  string
	cmd   string // what cron hands to $SHELL -c
}

var (
	cronVar   = regexp.MustCompile(`^([A-Za-z_][A-Za-z0-9_]*)\s*=\s*(.*)$`)
	cronEntry = regexp.MustCompile(`^((?:\S+\s+){5})(\S+)\s+(.*)$`)
)

func readCronFile(t *testing.T) cronFile {
	t.Helper()
	data, err := os.ReadFile(filepath.Join(exampleDir(t, "cron"), "leaderrun-billing"))
	if err != nil {
		t.Fatal(err)
	}
	var cf cronFile
	sc := bufio.NewScanner(bytes.NewReader(data))
	for sc.Scan() {
		line := strings.TrimSpace(sc.Text())
		if line == "" || strings.HasPrefix(line, "#") {
			continue
		}
		if m := cronVar.FindStringSubmatch(line); m != nil {
			cf.env = append(cf.env, m[1]+"="+strings.Trim(m[2], `"'`))
			continue
		}
		m := cronEntry.FindStringSubmatch(line)
		if m == nil || cf.cmd != "" {
			t.Fatalf("examples/cron/leaderrun-billing: want one job line, got %q", line)
		}
		cf.sched, cf.user, cf.cmd = strings.TrimSpace(m[1]), m[2], m[3]
	}
	if cf.cmd == "" {
		t.Fatal("examples/cron/leaderrun-billing has no job line")
	}
	// cron turns the first unescaped % into a newline, and what follows
	// into the job's stdin.
	if strings.Contains(cf.cmd, "%") {
		t.Fatalf("the job line contains %%, which cron would cut it at: %q", cf.cmd)
	}
	if !strings.HasPrefix(cf.cmd, unitLeaderrun+" ") {
		t.Fatalf("the job line does not start with %s (the path the README installs to): %q", unitLeaderrun, cf.cmd)
	}
	return cf
}

// cronEnviron is the environment cron gives a job of the file: cron's
// own (SHELL, PATH, HOME, LOGNAME), then the file's variables. The store
// variables become the local backend in stateDir.
func cronEnviron(t *testing.T, cf cronFile, stateDir string, withFileVars bool) []string {
	t.Helper()
	u, err := user.Current()
	if err != nil {
		t.Fatal(err)
	}
	env := map[string]string{"SHELL": "/bin/sh", "PATH": strings.TrimPrefix(cronPath, "PATH="), "HOME": u.HomeDir, "LOGNAME": u.Username}
	order := []string{"SHELL", "PATH", "HOME", "LOGNAME"}
	set := func(k, v string) {
		if _, ok := env[k]; !ok {
			order = append(order, k)
		}
		env[k] = v
	}
	for _, kv := range cf.env {
		k, v, _ := strings.Cut(kv, "=")
		switch {
		case strings.HasPrefix(k, "LEADERRUN_ETCD_") || strings.HasPrefix(k, "LEADERRUN_CONSUL_"):
			// The recipe's store is a cluster; the test's is local.
		case withFileVars || k != "PATH":
			set(k, v)
		}
	}
	set("LEADERRUN_BACKEND", "local")
	set("LEADERRUN_STATE_DIR", stateDir)
	var out []string
	for _, k := range order {
		out = append(out, k+"="+env[k])
	}
	return out
}

// cronJobScript is a stand-in for /opt/billing/run: it appends one line
// to out with its fencing token and PATH.
func cronJobScript(t *testing.T, out string) string {
	t.Helper()
	path := filepath.Join(t.TempDir(), "run")
	script := fmt.Sprintf("#!/bin/sh\necho \"ran token=$FENCE_TOKEN $PATH\" >> %s\n", out)
	testenv.WriteExecutable(t, path, []byte(script), 0o755)
	return path
}

// privateMounts reports whether this test can give a process a mount
// namespace of its own with leaderrun at /usr/local/bin/leaderrun and
// the job at /opt/billing/run, leaving the host's directories alone
// (root, and unshare(1) allowed).
func privateMounts(t *testing.T) bool {
	if os.Geteuid() != 0 {
		return false
	}
	unshare, err := exec.LookPath("unshare")
	if err != nil {
		return false
	}
	return exec.Command(unshare, "--mount", "--propagation", "private", "true").Run() == nil
}

// inPrivateMounts returns argv that runs argv in a new mount namespace
// where /usr/local/bin holds only leaderrun (the test's binary) and
// /opt/billing/run is job; extra commands run first (as root, in that
// namespace).
func inPrivateMounts(t *testing.T, job string, extra string, argv ...string) []string {
	t.Helper()
	bin := t.TempDir()
	if err := os.Symlink(testenv.Leaderrun(t), filepath.Join(bin, "leaderrun")); err != nil {
		t.Fatal(err)
	}
	setup := fmt.Sprintf(`set -e
mount --bind %s /usr/local/bin
mount -t tmpfs -o mode=0755 tmpfs /opt
mkdir /opt/billing
cp %s %s
%s
exec "$@"`, bin, job, cronJob, extra)
	return append([]string{"unshare", "--mount", "--propagation", "private", "/bin/sh", "-c", setup, "ns"}, argv...)
}

// TestCronRecipe runs the job line of examples/cron/leaderrun-billing as
// Debian's cron runs it: `env -i` with cron's variables (PATH=/usr/bin:/bin)
// and the file's, then `$SHELL -c LINE` in $HOME. Where the test may (root),
// it runs the line verbatim in a mount namespace of its own, where
// /usr/local/bin/leaderrun is the test's binary and /opt/billing/run a
// stand-in job; elsewhere it substitutes those two paths in the line (the
// only change), which proves less: that an absolute path does not depend
// on PATH, not that this one does. The recipe runs the job and prints
// nothing (cron mails nothing), a second run the same day neither runs
// nor prints, and the bare `leaderrun` that the README used to show is
// "not found" under cron's PATH, exit 127.
func TestCronRecipe(t *testing.T) {
	t.Parallel()
	cf := readCronFile(t)
	lr := testenv.Leaderrun(t)
	verbatim := privateMounts(t)
	if verbatim {
		t.Logf("running the line verbatim, in a private mount namespace")
	} else {
		t.Logf("not root (or no unshare): running the line with %s and %s replaced by the test's files", unitLeaderrun, cronJob)
	}
	shared := t.TempDir()
	tests := []struct {
		name     string
		state    string // state dir: "" for a new one
		fileVars bool   // the file's PATH= line applies
		cmd      func(string) string
		code     int
		runs     int    // times the job runs
		path     string // the PATH the job sees
		output   string // what cron would mail: "" for nothing
	}{
		{name: "as written", state: shared, fileVars: true, code: 0, runs: 1, path: "/usr/local/bin:/usr/bin:/bin"},
		{name: "again the same day", state: shared, fileVars: true, code: 0, runs: 0},
		{name: "no PATH line", fileVars: false, code: 0, runs: 1, path: "/usr/bin:/bin"},
		{name: "bare leaderrun", fileVars: false, code: 127, runs: 0, output: "leaderrun: not found",
			cmd: func(c string) string { return "leaderrun " + strings.TrimPrefix(c, unitLeaderrun+" ") }},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			if tt.code == 127 {
				for _, dir := range []string{"/usr/bin", "/bin"} {
					if _, err := os.Stat(filepath.Join(dir, "leaderrun")); err == nil {
						t.Fatalf("%s/leaderrun exists on this host: a bare leaderrun would be found under cron's PATH", dir)
					}
				}
			}
			state := tt.state
			if state == "" {
				state = t.TempDir()
			}
			out := filepath.Join(t.TempDir(), "runs")
			job := cronJobScript(t, out)
			line := cf.cmd
			if tt.cmd != nil {
				line = tt.cmd(line)
			}
			env := cronEnviron(t, cf, state, tt.fileVars)
			shell := "/bin/sh"
			for _, kv := range env {
				if v, ok := strings.CutPrefix(kv, "SHELL="); ok {
					shell = v
				}
			}
			argv := append(append([]string{"env", "-i"}, env...), shell, "-c")
			if verbatim {
				argv = inPrivateMounts(t, job, "", append(argv, line)...)
			} else {
				line = strings.ReplaceAll(strings.ReplaceAll(line, unitLeaderrun, lr), cronJob, job)
				argv = append(argv, line)
			}
			output, code := runAsCron(t, argv, env)
			t.Logf("%s -c %q under %q: exit %d, output %q", shell, line, env, code, output)
			if code != tt.code {
				t.Errorf("exit %d, want %d", code, tt.code)
			}
			got := strings.TrimSpace(string(output))
			if tt.output == "" && got != "" {
				t.Errorf("printed %q: cron would mail it", got)
			}
			if tt.output != "" && !strings.Contains(got, tt.output) {
				t.Errorf("printed %q, want %q", got, tt.output)
			}
			data, _ := os.ReadFile(out)
			runs := strings.Count(string(data), "ran token=")
			if runs != tt.runs {
				t.Errorf("the job ran %d times, want %d: %q", runs, tt.runs, data)
			}
			if tt.runs > 0 && !strings.Contains(string(data), " "+tt.path+"\n") {
				t.Errorf("the job saw %q, want PATH %s", data, tt.path)
			}
		})
	}
}

// TestCronRecipeUnderCron gives examples/cron/leaderrun-billing to Debian's
// cron itself, in a mount namespace of its own (so that the host's cron
// files and its running cron, if any, are neither seen nor touched), with
// the schedule made every minute, the user made this one and the store
// made local; the job line is the recipe's, verbatim. cron starts it at
// the next minute, with its own environment: the job must run and its
// run be recorded as completed.
func TestCronRecipeUnderCron(t *testing.T) {
	t.Parallel()
	cron := tool(t, "cron", "cron")
	if !privateMounts(t) {
		testenv.Missing(t, "driving cron needs root and unshare(1), for a private mount namespace")
	}
	cf := readCronFile(t)
	u, err := user.Current()
	if err != nil {
		t.Fatal(err)
	}
	state := t.TempDir()
	var file strings.Builder
	for _, kv := range cronEnviron(t, cf, state, true) {
		// cron sets these itself.
		if k, _, _ := strings.Cut(kv, "="); k != "HOME" && k != "LOGNAME" {
			fmt.Fprintln(&file, kv)
		}
	}
	fmt.Fprintf(&file, "* * * * * %s %s\n", u.Username, cf.cmd)
	crond := t.TempDir()
	if err := os.Chmod(crond, 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(crond, "leaderrun-billing"), []byte(file.String()), 0o644); err != nil {
		t.Fatal(err)
	}
	empty := filepath.Join(t.TempDir(), "crontab")
	if err := os.WriteFile(empty, nil, 0o644); err != nil {
		t.Fatal(err)
	}
	out := filepath.Join(t.TempDir(), "runs")
	job := cronJobScript(t, out)
	// /run: cron's pid file, so that a cron already running on the host
	// does not stop this one. /etc/cron.d, /etc/crontab and the spool:
	// this cron sees the recipe and nothing else.
	extra := fmt.Sprintf(`mount -t tmpfs tmpfs /run
mount --bind %s /etc/cron.d
mount --bind %s /etc/crontab
mount -t tmpfs tmpfs /var/spool/cron/crontabs`, crond, empty)
	argv := inPrivateMounts(t, job, extra, cron, "-f")
	cmd := exec.Command(argv[0], argv[1:]...)
	logs := logFile(t, filepath.Join(t.TempDir(), "cron.log"))
	cmd.Stdout, cmd.Stderr = logs.f, logs.f
	started := time.Now()
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { killNamespace(t, cmd) })
	t.Logf("cron started with:\n%s", file.String())

	// cron looks at its files once a minute, on the minute.
	var terms []map[string]any
	waitFor(t, 75*time.Second, "cron to run the recipe to completion", func() bool {
		data, _ := os.ReadFile(out)
		if !strings.Contains(string(data), "ran token=") {
			return false
		}
		terms = localHistory(t, state, "billing")
		return len(terms) > 0 && terms[0]["end"] == "exited"
	})
	data, _ := os.ReadFile(out)
	t.Logf("cron ran the job %v after it started: %q; history: %v", time.Since(started).Round(time.Second), data, terms)
	if !strings.Contains(string(data), " /usr/local/bin:/usr/bin:/bin\n") {
		t.Errorf("the job saw %q, want the file's PATH", data)
	}
	if code, ok := terms[0]["exit_code"].(float64); !ok || code != 0 {
		t.Errorf("the run ended %v, want exit 0", terms[0])
	}
	if terms[0]["once_key"] == nil {
		t.Errorf("the run recorded no once-key: %v", terms[0])
	}
}

// localHistory is `leaderrun history --json` of a local lock.
func localHistory(t *testing.T, state, lock string) []map[string]any {
	t.Helper()
	out, code := output(t, "history", "--json", "--backend", "local", "--state-dir", state, "--lock", lock)
	if code != 0 {
		return nil
	}
	var terms []map[string]any
	for _, line := range strings.Split(strings.TrimSpace(out), "\n") {
		var term map[string]any
		if line != "" && json.Unmarshal([]byte(line), &term) == nil {
			terms = append(terms, term)
		}
	}
	return terms
}

// killNamespace ends cmd and every process in its mount namespace (jobs
// cron started and left behind), all of which this test started.
func killNamespace(t *testing.T, cmd *exec.Cmd) {
	t.Helper()
	ns, err := os.Readlink(fmt.Sprintf("/proc/%d/ns/mnt", cmd.Process.Pid))
	if err == nil {
		if own, _ := os.Readlink("/proc/self/ns/mnt"); own != ns {
			entries, _ := os.ReadDir("/proc")
			for _, e := range entries {
				pid, err := strconv.Atoi(e.Name())
				if err != nil || pid == cmd.Process.Pid {
					continue
				}
				if link, _ := os.Readlink(fmt.Sprintf("/proc/%d/ns/mnt", pid)); link == ns {
					_ = syscall.Kill(pid, syscall.SIGKILL)
				}
			}
		}
	}
	_ = cmd.Process.Kill()
	_ = cmd.Wait()
}

// TestCronRecipesInDocs: the crontab lines that the README and
// docs/recipes.md show are the recipe that TestCronRecipe and
// TestCronRecipeUnderCron run (examples/cron/leaderrun-billing): the same
// variables, the store's address among them (without one, the line
// exits 64 on every host), and the same job line, in a user's crontab
// form (no user field). So they run as written under cron's environment.
func TestCronRecipesInDocs(t *testing.T) {
	t.Parallel()
	example := readCronFile(t)
	var want []string
	for _, kv := range example.env {
		if !strings.HasPrefix(kv, "SHELL=") {
			want = append(want, kv)
		}
	}
	for _, doc := range []string{"../README.md", "../docs/recipes.md"} {
		t.Run(filepath.Base(doc), func(t *testing.T) {
			data, err := os.ReadFile(doc)
			if err != nil {
				t.Fatal(err)
			}
			block := readmeBlock(t, string(data), "Put the same lines in the crontab of every host")
			var env []string
			var job string
			for _, l := range block {
				if m := cronVar.FindStringSubmatch(l); m != nil {
					env = append(env, m[1]+"="+m[2])
					continue
				}
				fields := strings.Fields(l)
				if len(fields) < 6 || job != "" {
					t.Fatalf("%s: want variables and one job line, got %q", doc, l)
				}
				if sched := strings.Join(fields[:5], " "); sched != example.sched {
					t.Errorf("%s: schedule %q, the recipe's is %q", doc, sched, example.sched)
				}
				job = strings.Join(fields[5:], " ")
			}
			if strings.Join(env, "\n") != strings.Join(want, "\n") {
				t.Errorf("%s: variables\n%s\nthe recipe's (less SHELL):\n%s", doc, strings.Join(env, "\n"), strings.Join(want, "\n"))
			}
			if job != example.cmd {
				t.Errorf("%s: job line %q, the recipe's %q", doc, job, example.cmd)
			}
		})
	}
}

// runAsCron runs argv as cron runs a job: in the home directory that env
// names, output and exit code collected.
func runAsCron(t *testing.T, argv, env []string) ([]byte, int) {
	t.Helper()
	cmd := exec.Command(argv[0], argv[1:]...)
	for _, kv := range env {
		if home, ok := strings.CutPrefix(kv, "HOME="); ok {
			if fi, err := os.Stat(home); err == nil && fi.IsDir() {
				cmd.Dir = home
			}
		}
	}
	output, err := cmd.CombinedOutput()
	code := 0
	if ee, ok := err.(*exec.ExitError); ok {
		code = ee.ExitCode()
	} else if err != nil {
		t.Fatal(err)
	}
	return output, code
}
