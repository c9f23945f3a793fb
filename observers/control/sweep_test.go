package control

import (
	"net"
	"os"
	"path/filepath"
	"testing"
	"time"
)

// TestSweep: Listen removes the socket directories that killed runs of
// this user left in its directory, once they are a minute old and nobody
// listens on their socket; it leaves alone a live server's, a fresh one
// (a run that is starting), another user's, and one that holds anything
// besides its socket.
func TestSweep(t *testing.T) {
	base, err := os.MkdirTemp("", "sweep")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { os.RemoveAll(base) })
	old := time.Now().Add(-2 * staleAfter)
	// mk makes a socket directory: with a dead socket (bound, then its
	// listener closed without removing it), a live one, or none.
	mk := func(name string, sock string, age time.Time) string {
		d := filepath.Join(base, name)
		if err := os.Mkdir(d, 0o700); err != nil {
			t.Fatal(err)
		}
		switch sock {
		case "dead", "live":
			ln, err := net.Listen("unix", filepath.Join(d, socketName))
			if err != nil {
				t.Fatal(err)
			}
			if sock == "dead" {
				ln.(*net.UnixListener).SetUnlinkOnClose(false)
				ln.Close()
			} else {
				t.Cleanup(func() { ln.Close() })
			}
		}
		if err := os.Chtimes(d, age, age); err != nil {
			t.Fatal(err)
		}
		return d
	}
	stale := mk(dirPrefix+"stale", "dead", old)
	empty := mk(dirPrefix+"empty", "none", old)
	live := mk(dirPrefix+"live", "live", old)
	fresh := mk(dirPrefix+"fresh", "dead", time.Now())
	other := mk("other-program", "dead", old)
	more := mk(dirPrefix+"more", "dead", old)
	if err := os.WriteFile(filepath.Join(more, "notes"), nil, 0o600); err != nil {
		t.Fatal(err)
	}
	if err := os.Chtimes(more, old, old); err != nil {
		t.Fatal(err)
	}
	theirs := mk(dirPrefix+"theirs", "dead", old)
	if os.Geteuid() == 0 {
		if err := os.Chown(theirs, 65534, 65534); err != nil {
			t.Fatal(err)
		}
	}

	srv, err := Listen(base, &State{}, nil)
	if err != nil {
		t.Fatal(err)
	}
	for _, tc := range []struct {
		dir  string
		gone bool
	}{
		{stale, true}, {empty, true}, {live, false}, {fresh, false}, {other, false}, {more, false}, {theirs, os.Geteuid() != 0},
	} {
		_, err := os.Stat(tc.dir)
		if gone := os.IsNotExist(err); gone != tc.gone {
			t.Errorf("%s: removed %v, want %v", filepath.Base(tc.dir), gone, tc.gone)
		}
	}
	own := filepath.Dir(srv.Path())
	if err := srv.Close(); err != nil {
		t.Fatal(err)
	}
	if _, err := os.Stat(own); !os.IsNotExist(err) {
		t.Errorf("Close left its directory: %v", err)
	}
}

// TestListenRefusesUnsafeDirectory: a directory that others may write to
// without the sticky bit would let them replace the socket's directory
// with one of theirs, and answer the job's checks: the socket goes in the
// temporary directory instead.
func TestListenRefusesUnsafeDirectory(t *testing.T) {
	for _, tc := range []struct {
		name string
		mode os.FileMode
		ok   bool
	}{
		{"owner's alone", 0o700, true},
		{"world-writable and sticky, like /tmp", 0o777 | os.ModeSticky, true},
		{"world-writable", 0o777, false},
		{"group-writable", 0o770, false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			base, err := os.MkdirTemp("", "base")
			if err != nil {
				t.Fatal(err)
			}
			t.Cleanup(func() { os.RemoveAll(base) })
			if err := os.Chmod(base, tc.mode); err != nil {
				t.Fatal(err)
			}
			srv, err := Listen(base, &State{}, nil)
			if err != nil {
				t.Fatal(err)
			}
			defer srv.Close()
			if in := filepath.Dir(filepath.Dir(srv.Path())) == base; in != tc.ok {
				t.Errorf("Listen in a directory of mode %v: socket %s, in it: %v, want %v", tc.mode, srv.Path(), in, tc.ok)
			}
		})
	}
}
