package local

import (
	"bytes"
	"context"
	"errors"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"golang.org/x/sys/unix"

	"github.com/leaderrun/leaderrun/backends"
	"github.com/leaderrun/leaderrun/internal/testenv"
)

// TestPlantedFilesRefused: the checks of each file, beneath the check of
// the state directory. A state directory that another user can write to is
// refused (TestStateDirWritableByOthersRefused); were it not, what that
// user plants under the names leaderrun uses must still be refused, naming
// the file, and leave every file outside the directory as it was. The
// directory's own check is bypassed here to reach them.
func TestPlantedFilesRefused(t *testing.T) {
	if os.Geteuid() != 0 {
		testenv.Missing(t, "this test plays root and another user")
	}
	const other = 65534
	plant := func(t *testing.T, p string, data []byte, link string) {
		t.Helper()
		var err error
		if link != "" {
			err = os.Symlink(link, p)
		} else {
			err = os.WriteFile(p, data, 0o666)
			if err == nil {
				err = os.Chmod(p, 0o666)
			}
		}
		if err == nil {
			err = os.Lchown(p, other, other)
		}
		if err != nil {
			t.Fatal(err)
		}
	}
	cases := []struct {
		name   string
		attack func(t *testing.T, dir, victim string)
		status bool
		want   string
	}{
		{name: "symlink as the token's temporary file", want: "job.token.tmp", attack: func(t *testing.T, dir, v string) {
			plant(t, filepath.Join(dir, "job.token.tmp"), nil, v)
		}},
		{name: "symlink as the lock file", want: "job.lock is a symbolic link", attack: func(t *testing.T, dir, v string) {
			plant(t, filepath.Join(dir, "job.lock"), nil, v)
		}},
		{name: "symlink as the token file", want: "job.token is a symbolic link", attack: func(t *testing.T, dir, v string) {
			plant(t, filepath.Join(dir, "job.token"), nil, v)
		}},
		{name: "pre-created token file", want: "job.token is owned by uid 65534", attack: func(t *testing.T, dir, v string) {
			plant(t, filepath.Join(dir, "job.token"), []byte("0\n"), "")
		}},
		{name: "pre-created lock file", want: "job.lock is owned by uid 65534", attack: func(t *testing.T, dir, v string) {
			plant(t, filepath.Join(dir, "job.lock"), []byte("identity=fake-leader\ntoken=999\npid=1\n"), "")
		}},
		{name: "status of a pre-created lock file", status: true, want: "job.lock is owned by uid 65534", attack: func(t *testing.T, dir, v string) {
			plant(t, filepath.Join(dir, "job.lock"), []byte("identity=fake-leader\ntoken=999\npid=1\n"), "")
		}},
		{name: "hard link to the victim", want: "job.token has 2 hard links", attack: func(t *testing.T, dir, v string) {
			if err := os.Link(v, filepath.Join(dir, "job.token")); err != nil {
				t.Fatal(err)
			}
		}},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			shared := filepath.Join(t.TempDir(), "shared")
			if err := os.Mkdir(shared, 0o700); err != nil {
				t.Fatal(err)
			}
			if err := os.Chmod(shared, os.ModeSticky|0o777); err != nil {
				t.Fatal(err)
			}
			victim := filepath.Join(t.TempDir(), "shadow")
			secret := []byte("db_password=hunter2\n")
			if err := os.WriteFile(victim, secret, 0o600); err != nil {
				t.Fatal(err)
			}
			tc.attack(t, shared, victim)
			fd, err := unix.Open(shared, unix.O_RDONLY|unix.O_DIRECTORY|unix.O_CLOEXEC, 0)
			if err != nil {
				t.Fatal(err)
			}
			s := Open(shared)
			s.d = &dir{path: shared, f: os.NewFile(uintptr(fd), shared), euid: os.Geteuid()}
			defer s.Close()
			if tc.status {
				_, err = backends.ReadStatus(context.Background(), s, "job")
			} else {
				var l *backends.Lease
				if l, err = backends.Campaign(context.Background(), s, "job",
					backends.Candidate{Identity: "root-run", Timings: backends.DefaultTimings}); err == nil {
					_ = l.Release(context.Background(), nil)
				}
			}
			if !errors.Is(err, backends.ErrUnsafeState) || !strings.Contains(err.Error(), tc.want) || !strings.Contains(err.Error(), shared) {
				t.Errorf("got %v, want it refused naming the path and %q", err, tc.want)
			}
			if err != nil && (strings.Contains(err.Error(), "hunter2") || strings.Contains(err.Error(), "fake-leader")) {
				t.Errorf("the message shows the contents of a file: %v", err)
			}
			if got, rerr := os.ReadFile(victim); rerr != nil || !bytes.Equal(got, secret) {
				t.Errorf("the file outside the state directory changed: %q, %v", got, rerr)
			}
		})
	}
}
