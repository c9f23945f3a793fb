package local_test

import (
	"context"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"testing"

	"github.com/leaderrun/leaderrun/backends"
	"github.com/leaderrun/leaderrun/backends/local"
	"github.com/leaderrun/leaderrun/internal/testenv"
)

// other is the uid that plays another user of the host.
const other = 65534

func requireRoot(t *testing.T) {
	t.Helper()
	if os.Geteuid() != 0 {
		testenv.Missing(t, "this test plays root and another user")
	}
}

// campaign tries once (--try: a failing store is not retried) for lock
// "job" in dir and releases at once.
func campaign(dir string, identity string) error {
	s := local.Open(dir)
	defer s.Close()
	l, err := backends.Campaign(context.Background(), s, "job", backends.Candidate{Identity: identity, Timings: backends.DefaultTimings, Try: true})
	if err != nil {
		return err
	}
	return l.Release(context.Background(), nil)
}

// TestStateDirParentsCheckedBeforeCreated: a state directory below
// another user's symlink is refused before anything is created: the
// missing directories are made one at a time, each only inside a
// directory already found safe, so a root run never makes directories in
// the root-only target the symlink points at.
func TestStateDirParentsCheckedBeforeCreated(t *testing.T) {
	requireRoot(t)
	base := t.TempDir()
	target := filepath.Join(base, "target") // root's, and root's only
	if err := os.Mkdir(target, 0o700); err != nil {
		t.Fatal(err)
	}
	link := filepath.Join(base, "link")
	if err := os.Symlink(target, link); err != nil {
		t.Fatal(err)
	}
	if err := os.Lchown(link, other, other); err != nil {
		t.Fatal(err)
	}
	err := campaign(filepath.Join(link, "a", "b"), "root-run")
	if !errors.Is(err, backends.ErrUnsafeState) || !strings.Contains(err.Error(), link+" is a symbolic link owned by uid 65534") {
		t.Errorf("campaign below another user's symlink: %v, want it refused naming the symlink", err)
	}
	if entries, _ := os.ReadDir(target); len(entries) != 0 {
		t.Errorf("the symlink's target got %d entries (%s...) before the refusal", len(entries), entries[0].Name())
	}
}

// TestStateDirCreated: missing directories are created, mode 0700, and
// the state directory works.
func TestStateDirCreated(t *testing.T) {
	dir := filepath.Join(t.TempDir(), "a", "b", "state")
	if err := campaign(dir, "me"); err != nil {
		t.Fatal(err)
	}
	for _, p := range []string{filepath.Dir(filepath.Dir(dir)), filepath.Dir(dir), dir} {
		fi, err := os.Stat(p)
		if err != nil || fi.Mode().Perm() != 0o700 {
			t.Errorf("%s: %v, %v; want a directory of mode 0700", p, fi.Mode(), err)
		}
	}
}

// TestStateDirWritableByOthersRefused: a state directory that others may
// write to (like /tmp, sticky or not, or a group's) is refused, naming
// it; one only its owner may write to is used.
func TestStateDirWritableByOthersRefused(t *testing.T) {
	cases := []struct {
		name string
		mode os.FileMode
		want string
	}{
		{name: "world-writable and sticky, like /tmp", mode: os.ModeSticky | 0o777, want: "is writable by others (mode 1777)"},
		{name: "world-writable", mode: 0o777, want: "is writable by others (mode 0777)"},
		{name: "group-writable", mode: 0o770, want: "is writable by its group (mode 0770)"},
		{name: "owner's alone", mode: 0o755},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			dir := filepath.Join(t.TempDir(), "state")
			if err := os.Mkdir(dir, 0o700); err != nil {
				t.Fatal(err)
			}
			if err := os.Chmod(dir, tc.mode); err != nil {
				t.Fatal(err)
			}
			err := campaign(dir, "me")
			if tc.want == "" {
				if err != nil {
					t.Fatalf("campaign in a state directory of mode %v: %v", tc.mode, err)
				}
				return
			}
			if !errors.Is(err, backends.ErrUnsafeState) || !strings.Contains(err.Error(), dir+" "+tc.want) {
				t.Fatalf("campaign in a state directory of mode %v: %v, want it refused saying %q", tc.mode, err, dir+" "+tc.want)
			}
			if entries, _ := os.ReadDir(dir); len(entries) != 0 {
				t.Errorf("files were made in the refused state directory: %v", entries)
			}
		})
	}
}

// TestHolderRecordWriteFailure: a grant whose holder record cannot be
// written to the lock file (here: a file size limit below the record's
// size, in a process of its own) is an error, not a lease that status
// would show with a torn record.
func TestHolderRecordWriteFailure(t *testing.T) {
	dir := os.Getenv("LOCAL_TEST_FSIZE_DIR")
	if dir != "" {
		// The helper process: the token file ("1\n") fits under the
		// limit, the record with its long identity does not.
		lim := syscall.Rlimit{Cur: 64, Max: 64}
		if err := syscall.Setrlimit(syscall.RLIMIT_FSIZE, &lim); err != nil {
			t.Fatal(err)
		}
		err := campaign(dir, strings.Repeat("x", 200))
		fmt.Printf("campaign: %v\n", err)
		return
	}
	dir = t.TempDir()
	cmd := exec.Command(os.Args[0], "-test.run=^TestHolderRecordWriteFailure$", "-test.count=1")
	cmd.Env = append(os.Environ(), "LOCAL_TEST_FSIZE_DIR="+dir)
	out, err := cmd.CombinedOutput()
	if err != nil {
		t.Fatalf("helper: %v\n%s", err, out)
	}
	if !strings.Contains(string(out), "campaign: local: record holder") || !strings.Contains(string(out), "file too large") {
		t.Errorf("a holder record that could not be written was not reported:\n%s", out)
	}
}
