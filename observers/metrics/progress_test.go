package metrics

import (
	"net/http/httptest"
	"regexp"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/leaderrun/leaderrun/runner"
)

// TestProgressGauge: leaderrun_seconds_since_last_progress is exposed
// only while a child runs under the progress clock, counts from the last
// report, and goes when the child is stopped, stalled or gone; stalls are
// counted.
func TestProgressGauge(t *testing.T) {
	const gauge = `leaderrun_seconds_since_last_progress{lock="p",backend="local"}`
	m := New("p", "local")
	srv := httptest.NewServer(m)
	defer srv.Close()
	value := func() (float64, bool) {
		t.Helper()
		match := regexp.MustCompile("\n" + regexp.QuoteMeta(gauge) + ` (\S+)\n`).FindStringSubmatch(get(t, srv.URL))
		if match == nil {
			return 0, false
		}
		v, err := strconv.ParseFloat(match[1], 64)
		if err != nil {
			t.Fatal(err)
		}
		return v, true
	}
	for _, k := range []runner.EventKind{runner.Acquired, runner.ChildStarted} {
		m.Observe(runner.Event{Kind: k})
	}
	if _, shown := value(); shown {
		t.Fatal("the gauge is exposed without --progress-timeout")
	}
	m.Observe(runner.Event{Kind: runner.ProgressReported})
	// The last report, 90 s ago.
	m.mu.Lock()
	m.progress.last = time.Now().Add(-90 * time.Second)
	m.mu.Unlock()
	if v, shown := value(); !shown || v < 90 || v > 100 {
		t.Fatalf("gauge %v (shown %v) 90 s after the last report", v, shown)
	}
	m.Observe(runner.Event{Kind: runner.ProgressReported})
	if v, shown := value(); !shown || v > 5 {
		t.Fatalf("gauge %v (shown %v) right after a report", v, shown)
	}
	m.Observe(runner.Event{Kind: runner.Stalled})
	if _, shown := value(); shown {
		t.Fatal("the gauge is exposed after the stall")
	}
	if body := get(t, srv.URL); !strings.Contains(body, `leaderrun_progress_stalls_total{lock="p",backend="local"} 1`) {
		t.Errorf("no stall counted:\n%s", body)
	}
	// The next leadership's child: shown again, then gone with the child.
	m.Observe(runner.Event{Kind: runner.ProgressReported})
	if _, shown := value(); !shown {
		t.Fatal("the gauge is not exposed for the next child")
	}
	m.Observe(runner.Event{Kind: runner.ChildExited})
	if _, shown := value(); shown {
		t.Fatal("the gauge is exposed after the child exited")
	}
}
