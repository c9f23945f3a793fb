package watchdog

import (
	"bytes"
	"errors"
	"io"
	"log/slog"
	"os"
	"strings"
	"syscall"
	"testing"
	"time"
)

// The watchdog's log lines must read as leaderrun's own, which log/slog
// writes: a log collector parses both with one rule.
func TestLogMatchesSlog(t *testing.T) {
	at := time.Date(2026, 12, 3, 21, 4, 5, 6007008, time.UTC)
	records := []struct {
		level int
		msg   string
		with  []any
		kv    []any
	}{
		{levelInfo, "signalled child", []any{"watchdog", 41, "lock", "billing", "token", uint64(7)}, []any{"signal", "SIGTERM"}},
		{levelWarn, "still running at the end of --kill-grace; sent SIGKILL", nil, []any{"pgid", 9, "pids", []int{9, 12}, "grace", 2500 * time.Millisecond}},
		{levelError, "leaderrun is gone; the watchdog killed the command's tree", nil, []any{"pids", []int{}, "guard", "cgroup"}},
		{levelError, "the watchdog cannot wait", nil, []any{"error", syscall.EBADF}},
		{levelWarn, "cannot remove the command's cgroup", []any{"identity", "host a=b"}, []any{"error", &os.PathError{Op: "rmdir", Path: "/sys/fs/cgroup/x y", Err: syscall.EBUSY}}},
		{levelInfo, `quotes " and \ back, tab	new
line, ctl ` + "\x01\x7f" + `, é, ` + "\u2028\xff", []any{"backend", ""}, []any{"pids", []int{1}, "one", []int(nil)}},
		{levelError, "wrapped", nil, []any{"error", errors.Join(errors.New("a"), errors.New("b"))}},
	}
	for _, format := range []string{"text", "json"} {
		for _, min := range []slog.Level{slog.LevelDebug, slog.LevelInfo, slog.LevelWarn, slog.LevelError, slog.LevelError + 4} {
			var want bytes.Buffer
			opts := &slog.HandlerOptions{Level: min, ReplaceAttr: func(groups []string, a slog.Attr) slog.Attr {
				if a.Key == slog.TimeKey && len(groups) == 0 {
					a.Value = slog.TimeValue(at)
				}
				return a
			}}
			var h slog.Handler = slog.NewTextHandler(&want, opts)
			if format == "json" {
				h = slog.NewJSONHandler(&want, opts)
			}
			got := captureStderr(t, func() {
				for _, r := range records {
					l := newLogger(format == "json", int(min))
					l.now = func() time.Time { return at }
					sl := slog.New(h)
					if r.with != nil {
						l, sl = l.with(r.with...), sl.With(r.with...)
					}
					sl.Log(t.Context(), slog.Level(r.level), r.msg, r.kv...)
					switch r.level {
					case levelInfo:
						l.Info(r.msg, r.kv...)
					case levelWarn:
						l.Warn(r.msg, r.kv...)
					case levelError:
						l.Error(r.msg, r.kv...)
					}
				}
			})
			if got != want.String() {
				t.Errorf("%s at %s:\n got: %s\nwant: %s", format, min, got, want.String())
			}
		}
	}
}

func TestLevelName(t *testing.T) {
	for _, l := range []slog.Level{slog.LevelInfo, slog.LevelWarn, slog.LevelError} {
		if got := levelName(int(l)); got != l.String() {
			t.Errorf("levelName(%d) = %q, want %q", int(l), got, l.String())
		}
	}
}

// captureStderr returns what f wrote to os.Stderr.
func captureStderr(t *testing.T, f func()) string {
	t.Helper()
	r, w, err := os.Pipe()
	if err != nil {
		t.Fatal(err)
	}
	saved := os.Stderr
	os.Stderr = w
	done := make(chan string)
	go func() {
		var b strings.Builder
		_, _ = io.Copy(&b, r)
		done <- b.String()
	}()
	defer func() { os.Stderr = saved }()
	f()
	w.Close()
	return <-done
}
