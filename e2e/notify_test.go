//go:build linux

package e2e

import (
	"errors"
	"net"
	"os"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"
)

// notifySocket is a NOTIFY_SOCKET as systemd makes one: a unix datagram
// socket that leaderrun sends its notifications to.
type notifySocket struct {
	path string
	conn *net.UnixConn
}

func newNotifySocket(t *testing.T) *notifySocket {
	t.Helper()
	path := filepath.Join(t.TempDir(), "notify.sock")
	conn, err := net.ListenUnixgram("unixgram", &net.UnixAddr{Name: path, Net: "unixgram"})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { conn.Close() })
	return &notifySocket{path: path, conn: conn}
}

// drain returns every notification queued so far. Call it after the sender
// has exited: its datagrams are all in the socket's queue then, and a read
// that finds the queue empty for 200 ms has read them all.
func (s *notifySocket) drain(t *testing.T) []string {
	t.Helper()
	var msgs []string
	buf := make([]byte, 4096)
	for {
		_ = s.conn.SetReadDeadline(time.Now().Add(200 * time.Millisecond))
		n, err := s.conn.Read(buf)
		if errors.Is(err, os.ErrDeadlineExceeded) {
			return msgs
		}
		if err != nil {
			t.Fatalf("read %s: %v", s.path, err)
		}
		msgs = append(msgs, string(buf[:n]))
	}
}

// TestNotifyStoppingOnce: however a run ends (a SIGTERM from systemctl
// stop, the command exiting, leadership lost), leaderrun tells systemd
// STOPPING=1 exactly once, together with the status of the first step of
// its shutdown.
func TestNotifyStoppingOnce(t *testing.T) {
	t.Parallel()
	tests := []struct {
		name  string
		child string
		end   func(t *testing.T, p *proc, dir string)
		code  int
		with  string // the STATUS that carries STOPPING=1
	}{
		{name: "sigterm", child: "forever", code: 0, with: "STATUS=stopping the command",
			end: func(t *testing.T, p *proc, _ string) { p.signal(syscall.SIGTERM) }},
		{name: "exit", child: "exit:0", code: 0, with: "STATUS=released lock job"},
		{name: "lost", child: "forever", code: 76, with: "STATUS=leadership lost",
			end: func(t *testing.T, _ *proc, dir string) {
				if err := os.Remove(filepath.Join(dir, "job.lock")); err != nil {
					t.Fatal(err)
				}
			}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			dir := t.TempDir()
			events := filepath.Join(dir, "events")
			sock := newNotifySocket(t)
			p := start(t, append(childEnv(events, tt.child), "NOTIFY_SOCKET="+sock.path),
				cmdArgs(t, localArgs(dir, "job"))...)
			waitEvents(t, events, 10*time.Second, "the child", func(evs []event) bool { return count(evs, "start") == 1 })
			if tt.end != nil {
				tt.end(t, p, dir)
			}
			if code := p.wait(10 * time.Second); code != tt.code {
				t.Errorf("exit %d, want %d", code, tt.code)
			}
			msgs := sock.drain(t)
			var stops []string
			for _, m := range msgs {
				if strings.Contains(m, "STOPPING=1") {
					stops = append(stops, m)
				}
			}
			t.Logf("notifications: %q", msgs)
			if len(stops) != 1 {
				t.Fatalf("STOPPING=1 sent %d times, want once: %q", len(stops), stops)
			}
			if !strings.Contains(stops[0], tt.with) {
				t.Errorf("STOPPING=1 came with %q, want it with %q", stops[0], tt.with)
			}
		})
	}
}
