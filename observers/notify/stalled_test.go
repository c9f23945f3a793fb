package notify

import (
	"log/slog"
	"strings"
	"testing"
	"time"

	"github.com/leaderrun/leaderrun/runner"
)

// TestStalledSaysStopping: a job stopped for want of progress tells
// systemd STOPPING=1 once, with the reason in STATUS, as a loss does.
func TestStalledSaysStopping(t *testing.T) {
	conn := listen(t)
	n := New("job", nil, slog.New(slog.DiscardHandler))
	n.Observe(runner.Event{Kind: runner.Acquired, Token: 42})
	n.Observe(runner.Event{Kind: runner.Stalled, Token: 42, Err: &runner.StalledError{Timeout: time.Minute, Since: time.Minute, Reported: true}})
	n.Observe(runner.Event{Kind: runner.Released, Token: 42})
	n.Close()
	got := strings.Join(drain(t, conn), "\n")
	if strings.Count(got, "STOPPING=1") != 1 || !strings.Contains(got, "STATUS=no progress reported for --progress-timeout 1m0s") {
		t.Errorf("notifications %q, want STOPPING=1 once and the stall in STATUS", got)
	}
}
