package local_test

import (
	"context"
	"errors"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"testing"

	"github.com/leaderrun/leaderrun/backends"
	"github.com/leaderrun/leaderrun/backends/local"
)

// TestStateDirCheckedWhereItLeads: a state directory reached through a
// symlink of root's is checked where the link leads, not as written. Here
// the link points into a directory that another user (uid 65534) owns, so
// that user can swap what lies there between two runs: were the path
// checked as written, the first run would hold the lock, the user would
// move the state directory aside and put an empty one in its place, and a
// second run would hold the same lock beside the first, its token
// starting again at 1. The state directory is refused, naming the other
// user's directory, as it is when written without the link.
func TestStateDirCheckedWhereItLeads(t *testing.T) {
	requireRoot(t)
	base := t.TempDir()
	// The other user must reach its directory: t.TempDir makes base and
	// the directory above it 0700.
	for _, d := range []string{filepath.Dir(base), base} {
		if err := os.Chmod(d, 0o755); err != nil {
			t.Fatal(err)
		}
	}
	theirs := filepath.Join(base, "theirs")
	if err := os.Mkdir(theirs, 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.Chown(theirs, other, other); err != nil {
		t.Fatal(err)
	}
	// Root's directories, as earlier runs of root would have left them,
	// under the other user's directory.
	for _, d := range []string{"state", "spare"} {
		if err := os.Mkdir(filepath.Join(theirs, d), 0o700); err != nil {
			t.Fatal(err)
		}
	}
	link := filepath.Join(base, "link") // root's, in root's directory
	if err := os.Symlink(filepath.Join(theirs, "state"), link); err != nil {
		t.Fatal(err)
	}
	want := theirs + " is owned by uid 65534"

	first, err := hold(link, "first")
	if err == nil {
		defer first.release()
		// The other user swaps the directory the link leads to.
		swap := exec.Command("sh", "-c", "mv state old && mv spare state")
		swap.Dir = theirs
		swap.SysProcAttr = &syscall.SysProcAttr{Credential: &syscall.Credential{Uid: other, Gid: other}}
		if out, err := swap.CombinedOutput(); err != nil {
			t.Fatalf("swap as uid %d: %v\n%s", other, err, out)
		}
		if second, err := hold(link, "second"); err == nil {
			defer second.release()
			t.Errorf("after uid %d swapped the directory, a second run holds the lock beside the first: tokens %d and %d",
				other, first.Token(), second.Token())
		}
		t.Fatalf("a state directory reached through a symlink into uid %d's directory was used; want it refused saying %q", other, want)
	}
	if !errors.Is(err, backends.ErrUnsafeState) || !strings.Contains(err.Error(), want) {
		t.Errorf("through the symlink: %v, want it refused saying %q", err, want)
	}
	if err := campaign(filepath.Join(theirs, "state"), "direct"); !errors.Is(err, backends.ErrUnsafeState) || !strings.Contains(err.Error(), want) {
		t.Errorf("written without the symlink: %v, want it refused saying %q", err, want)
	}
	if entries, _ := os.ReadDir(filepath.Join(theirs, "state")); len(entries) != 0 {
		t.Errorf("files were made in the refused state directory: %v", entries)
	}
}

// TestStateDirThroughOwnSymlinks: symlinks of this user's or root's,
// relative or absolute, with ".." in their targets, in a chain, are
// followed where every directory they lead through is safe; a loop of them
// is an error, not a hang.
func TestStateDirThroughOwnSymlinks(t *testing.T) {
	base := t.TempDir()
	real := filepath.Join(base, "real")
	if err := os.MkdirAll(filepath.Join(real, "state"), 0o700); err != nil {
		t.Fatal(err)
	}
	links := map[string]string{
		"abs":      real,
		"rel":      "real",
		"dotdot":   "sub/../real",
		"chain":    "abs",
		"loop1":    "loop2",
		"loop2":    "loop1",
		"sub/back": "..",
	}
	if err := os.Mkdir(filepath.Join(base, "sub"), 0o700); err != nil {
		t.Fatal(err)
	}
	for name, target := range links {
		if err := os.Symlink(target, filepath.Join(base, name)); err != nil {
			t.Fatal(err)
		}
	}
	for _, tc := range []struct {
		name, dir string
		ok        bool
	}{
		{"absolute target", "abs/state", true},
		{"relative target", "rel/state", true},
		{"target with ..", "dotdot/state", true},
		{"chain of links", "chain/state", true},
		{"link to .. then down", "sub/back/real/state", true},
		{"missing directory made below a link", "abs/new", true},
		{"loop", "loop1/state", false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			err := campaign(filepath.Join(base, tc.dir), "me")
			if (err == nil) != tc.ok {
				t.Fatalf("campaign in %s: %v, want ok=%v", tc.dir, err, tc.ok)
			}
		})
	}
	if _, err := os.Stat(filepath.Join(real, "new")); err != nil {
		t.Errorf("the directory made below the link is not where the link leads: %v", err)
	}
}

// held is a lease held in a state directory.
type held struct {
	*backends.Lease
	s *local.Store
}

func hold(dir, identity string) (*held, error) {
	s := local.Open(dir)
	l, err := backends.Campaign(context.Background(), s, "job",
		backends.Candidate{Identity: identity, Try: true, Timings: backends.DefaultTimings})
	if err != nil {
		s.Close()
		return nil, err
	}
	return &held{Lease: l, s: s}, nil
}

func (h *held) release() {
	_ = h.Release(context.Background(), nil)
	h.s.Close()
}
