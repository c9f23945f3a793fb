package control

import (
	"context"
	"encoding/json"
	"io"
	"net"
	"strings"
	"testing"
	"time"

	"github.com/leaderrun/leaderrun/runner"
)

// listenWithProgress serves a leading State whose progress reports the
// test reads back.
func listenWithProgress(t *testing.T) (*Server, *runner.Progress, *State) {
	t.Helper()
	state := &State{Progress: runner.NewProgress()}
	state.Observe(runner.Event{Kind: runner.ChildStarted, Token: 9, Deadline: time.Now().Add(time.Hour)})
	srv, err := Listen(t.TempDir(), state, nil)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { srv.Close() })
	return srv, state.Progress, state
}

// raw sends req as it is, shuts down the writing half, and returns all the
// server wrote. A server that refuses the request closes with it unread:
// the write or the read then fails (EPIPE, ECONNRESET), which is no answer.
func raw(t *testing.T, path, req string) string {
	t.Helper()
	c, err := net.Dial("unix", path)
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	_ = c.SetDeadline(time.Now().Add(5 * time.Second))
	if _, err := io.WriteString(c, req); err != nil {
		return ""
	}
	_ = c.(*net.UnixConn).CloseWrite()
	b, _ := io.ReadAll(c)
	return string(b)
}

// TestProgressRequest: a progress request is recorded before its answer is
// written (so a job that has its answer knows leaderrun has its report),
// and answered as a check; a check records nothing.
func TestProgressRequest(t *testing.T) {
	srv, progress, _ := listenWithProgress(t)
	if _, err := Query(context.Background(), srv.Path()); err != nil {
		t.Fatal(err)
	}
	if got := progress.Latest(); !got.IsZero() {
		t.Fatalf("a check recorded progress at %v", got)
	}
	before := time.Now()
	a, err := Ask(context.Background(), srv.Path(), RequestProgress)
	if err != nil || !a.Leader || a.Token != 9 {
		t.Fatalf("progress: %+v, %v; want the leader's answer", a, err)
	}
	after := time.Now()
	if got := progress.Latest(); got.Before(before) || got.After(after) {
		t.Fatalf("progress recorded at %v, want between the request (%v) and its answer (%v)", got, before, after)
	}
}

// TestRequestsBounded: the server reads one bounded line: an empty request
// is a check, a line may end with the half-close or a newline, and an
// unknown or overlong request gets no answer (and records nothing).
func TestRequestsBounded(t *testing.T) {
	srv, progress, _ := listenWithProgress(t)
	for _, tc := range []struct {
		name, req string
		answer    bool
		progress  bool
	}{
		{"empty", "", true, false},
		{"check", "check\n", true, false},
		{"progress without newline", "progress", true, true},
		{"progress, then more", "progress\nprogress\nprogress\n", true, true},
		{"unknown", "stop\n", false, false},
		{"overlong", strings.Repeat("p", 100<<10), false, false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			before := progress.Latest()
			out := raw(t, srv.Path(), tc.req)
			var a Answer
			if answered := json.Unmarshal([]byte(out), &a) == nil; answered != tc.answer || (answered && a.Token != 9) {
				t.Errorf("request %.20q: answer %q, want an answer: %v", tc.req, out, tc.answer)
			}
			if moved := progress.Latest().After(before); moved != tc.progress {
				t.Errorf("request %.20q: progress recorded %v, want %v", tc.req, moved, tc.progress)
			}
		})
	}
}

// TestStalledIsNotLeading: once the runner stops a stalled job, check
// (and check --progress) say leadership is not held, so a job's loop ends.
func TestStalledIsNotLeading(t *testing.T) {
	srv, _, state := listenWithProgress(t)
	state.Observe(runner.Event{Kind: runner.Stalled})
	if a, err := Ask(context.Background(), srv.Path(), RequestProgress); err != nil || a.Leader {
		t.Fatalf("after the stall: %+v, %v; want not leading", a, err)
	}
}

// TestSilentPeerDelaysNoCheck: a peer that connects and sends nothing
// holds its connection for the server's second; checks and progress
// reports sent meanwhile are answered at once, not after it.
func TestSilentPeerDelaysNoCheck(t *testing.T) {
	srv, progress, _ := listenWithProgress(t)
	for range maxConns - 1 {
		c, err := net.Dial("unix", srv.Path())
		if err != nil {
			t.Fatal(err)
		}
		defer c.Close()
	}
	start := time.Now()
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	if _, err := Ask(ctx, srv.Path(), RequestProgress); err != nil {
		t.Fatal(err)
	}
	if took := time.Since(start); took > 500*time.Millisecond {
		t.Errorf("a progress report beside %d silent peers was answered after %v: it waited for them", maxConns-1, took)
	}
	if progress.Latest().Before(start) {
		t.Error("the progress report was not recorded")
	}
}
