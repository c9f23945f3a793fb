package notify

import (
	"context"
	"errors"
	"log/slog"
	"net"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/leaderrun/leaderrun/backends"
	"github.com/leaderrun/leaderrun/runner"
)

// listen makes a NOTIFY_SOCKET as systemd does, and points this process at
// it.
func listen(t *testing.T) *net.UnixConn {
	t.Helper()
	path := filepath.Join(t.TempDir(), "notify.sock")
	conn, err := net.ListenUnixgram("unixgram", &net.UnixAddr{Name: path, Net: "unixgram"})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { conn.Close() })
	t.Setenv("NOTIFY_SOCKET", path)
	return conn
}

// drain returns the notifications sent so far; call it once the sender is
// done (after Close), when they are all queued.
func drain(t *testing.T, conn *net.UnixConn) []string {
	t.Helper()
	var msgs []string
	buf := make([]byte, 4096)
	for {
		_ = conn.SetReadDeadline(time.Now().Add(100 * time.Millisecond))
		n, err := conn.Read(buf)
		if errors.Is(err, os.ErrDeadlineExceeded) {
			return msgs
		}
		if err != nil {
			t.Fatal(err)
		}
		msgs = append(msgs, string(buf[:n]))
	}
}

// TestStandbyStatusNeverFollowsLeading: the standby STATUS that names the
// current leader comes from a status query in the background; whenever
// that query answers, systemctl status must not end up showing a leader as
// a standby, nor name a holder that has not been recorded yet.
func TestStandbyStatusNeverFollowsLeading(t *testing.T) {
	web2 := backends.Status{Held: true, Identity: "web-2", Token: 41}
	tests := []struct {
		name string
		st   backends.Status
		// steps, in order: "answer" lets the status query return, "told"
		// waits until its STATUS has arrived, "done" until the query's
		// goroutine has ended (Close), "acquire" delivers Acquired.
		steps []string
		want  []string
	}{
		{name: "answer before acquired", st: web2, steps: []string{"answer", "told", "acquire", "done"},
			want: []string{"READY=1", "STATUS=standby; leader is web-2 (token 41)", "STATUS=leading with token 42"}},
		{name: "answer after acquired", st: web2, steps: []string{"acquire", "answer", "done"},
			want: []string{"READY=1", "STATUS=leading with token 42"}},
		{name: "holder not recorded yet", st: backends.Status{Held: true}, steps: []string{"answer", "done", "acquire"},
			want: []string{"READY=1", "STATUS=leading with token 42"}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			conn := listen(t)
			asked, answer := make(chan struct{}), make(chan struct{})
			status := func(context.Context) (backends.Status, error) {
				close(asked)
				<-answer
				return tt.st, nil
			}
			n := New("job", status, slog.New(slog.DiscardHandler))
			if n == nil {
				t.Fatal("New returned nil with NOTIFY_SOCKET set")
			}
			n.Observe(runner.Event{Kind: runner.Campaigning})
			<-asked
			var got []string
			for _, step := range tt.steps {
				switch step {
				case "answer":
					close(answer)
				case "told":
					_ = conn.SetReadDeadline(time.Now().Add(5 * time.Second))
					buf := make([]byte, 4096)
					for !strings.Contains(strings.Join(got, "\n"), "STATUS=standby; leader is") {
						k, err := conn.Read(buf)
						if err != nil {
							t.Fatalf("no standby STATUS: %v; got %q", err, got)
						}
						got = append(got, string(buf[:k]))
					}
				case "done":
					n.Close()
				case "acquire":
					n.Observe(runner.Event{Kind: runner.Acquired, Token: 42})
				}
			}
			n.Close()
			got = append(got, drain(t, conn)...)
			if len(got) != len(tt.want) {
				t.Fatalf("notifications %q, want %q", got, tt.want)
			}
			for i := range got {
				if !strings.Contains(got[i], tt.want[i]) {
					t.Errorf("notification %d is %q, want %q (all: %q)", i, got[i], tt.want[i], got)
				}
			}
		})
	}
}
