//go:build linux

package e2e

import (
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/leaderrun/leaderrun/internal/testenv"
)

// TestCompanion: leaderrun links no AWS SDK; with the store DynamoDB it
// becomes leaderrun-aws, installed beside it, in the same process:
// the pid that campaigns is the pid that leads and takes the user's
// signals. Without the companion, or with a leaderrun copied under its
// name, a DynamoDB run is exit 69 naming it, and never loops.
func TestCompanion(t *testing.T) {
	t.Parallel()
	bin := testenv.Leaderrun(t)
	companion := filepath.Join(filepath.Dir(bin), "leaderrun-aws")
	t.Run("LinksNoAWSSDK", func(t *testing.T) {
		for _, tc := range []struct {
			path string
			want bool
		}{{bin, false}, {companion, true}} {
			out, err := exec.Command("go", "version", "-m", tc.path).CombinedOutput()
			if err != nil {
				t.Fatalf("go version -m %s: %v\n%s", tc.path, err, out)
			}
			if got := strings.Contains(string(out), "github.com/aws/"); got != tc.want {
				t.Errorf("%s links a module of the AWS SDK: %v, want %v", filepath.Base(tc.path), got, tc.want)
			}
		}
	})
	t.Run("SameProcess", func(t *testing.T) {
		e := newDDBEnv(t)
		events := etcdEvents(t)
		p := e.run(t, events, "forever", "companion", "one")
		evs := waitEvents(t, events, 15*time.Second, "the child", etcdHas("start", "one"))
		child, _ := etcdFind(evs, "start", "one")
		pid := p.cmd.Process.Pid
		exe, err := os.Readlink(fmt.Sprintf("/proc/%d/exe", pid))
		if err != nil {
			t.Fatal(err)
		}
		if filepath.Base(exe) != "leaderrun-aws" {
			t.Errorf("the leading process runs %s, want leaderrun-aws", exe)
		}
		// ps, pgrep -x and killall still know it as leaderrun.
		if comm, _ := os.ReadFile(fmt.Sprintf("/proc/%d/comm", pid)); strings.TrimSpace(string(comm)) != "leaderrun" {
			t.Errorf("the leading process is called %q, want leaderrun", strings.TrimSpace(string(comm)))
		}
		// The command does not see how it came to be run.
		environ, err := os.ReadFile(fmt.Sprintf("/proc/%d/environ", child.Pid))
		if err != nil {
			t.Fatal(err)
		}
		if strings.Contains(string(environ), "LEADERRUN_HANDED_OVER_BY") {
			t.Errorf("the command's environment has LEADERRUN_HANDED_OVER_BY")
		}
		// The command's parent is the watchdog, whose parent is leaderrun.
		dog := parentOf(t, child.Pid)
		if got := parentOf(t, dog); got != pid {
			t.Errorf("the command's grandparent is %d, want the leaderrun started, %d", got, pid)
		}
		// The watchdog that leaderrun launched at its start, before it
		// became leaderrun-aws, is gone and reaped: the watchdog is
		// its only child.
		var children []string
		waitFor(t, 10*time.Second, "leaderrun-aws's only child to be its watchdog", func() bool {
			children = nil
			tasks, _ := os.ReadDir(fmt.Sprintf("/proc/%d/task", pid))
			for _, task := range tasks {
				data, _ := os.ReadFile(fmt.Sprintf("/proc/%d/task/%s/children", pid, task.Name()))
				children = append(children, strings.Fields(string(data))...)
			}
			return slices.Equal(children, []string{strconv.Itoa(dog)})
		})
		p.signal(syscall.SIGTERM)
		if code := p.wait(10 * time.Second); code != 0 {
			t.Errorf("exit %d after SIGTERM, want 0:\n%s", code, p.stderr.String())
		}
	})
	// Nothing listens at the endpoint: leaderrun-aws, once it runs,
	// says so naming the table; leaderrun alone names the companion.
	endpoint := fmt.Sprintf("http://127.0.0.1:%d", testenv.FreePort(t, "127.0.0.1"))
	for _, tc := range []struct {
		name      string
		companion string // what is installed as leaderrun-aws beside leaderrun
		symlink   bool   // leaderrun is a symbolic link to the test's binary
		want      string
	}{
		{name: "Missing", want: "served by leaderrun-aws: leaderrun-aws is not installed beside"},
		{name: "NotTheCompanion", companion: bin, want: "is a leaderrun without that backend"},
		{name: "Symlinked", symlink: true, want: "dynamodb table ops_locks in region " + testenv.DynamoDBRegion + " at " + endpoint},
	} {
		t.Run(tc.name, func(t *testing.T) {
			dir := t.TempDir()
			self := filepath.Join(dir, "leaderrun")
			if tc.symlink {
				if err := os.Symlink(bin, self); err != nil {
					t.Fatal(err)
				}
			} else {
				install(t, bin, self)
			}
			if tc.companion != "" {
				install(t, tc.companion, filepath.Join(dir, "leaderrun-aws"))
			}
			cmd := exec.Command(self, "status", "--backend", "dynamodb", "--dynamodb-table", "ops_locks", "--dynamodb-endpoint", endpoint, "--lock", "companion")
			cmd.Env = append(cmd.Environ(), testenv.DynamoDBEnv(ddbAll)...)
			out, err := cmd.CombinedOutput()
			ee, ok := err.(*exec.ExitError)
			if !ok || ee.ExitCode() != 69 {
				t.Fatalf("exit %v, want 69:\n%s", err, out)
			}
			if !strings.Contains(string(out), tc.want) {
				t.Errorf("output does not say %q:\n%s", tc.want, out)
			}
		})
	}
}

// install puts the binary from at to: a hard link where it can, else a
// copy.
func install(t *testing.T, from, to string) {
	t.Helper()
	if os.Link(from, to) != nil {
		testenv.CopyExecutable(t, from, to)
	}
}
