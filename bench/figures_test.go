package bench

import (
	"errors"
	"fmt"
	"os"
	"strings"
	"testing"
	"time"
)

// The markers around the figures of docs/choosing-a-store.md, which the
// benchmark rewrites at each run: that page's figures always name the run
// they come from.
const (
	figuresBegin = "<!-- figures: begin -->"
	figuresEnd   = "<!-- figures: end -->"
)

// figures is the figures section of docs/choosing-a-store.md: for each
// store, what an operator weighs, from this run, with the run named.
func (r *results) figures() string {
	var b strings.Builder
	fmt.Fprintf(&b, "From the last benchmark, **`%s` on %s** ([benchmarks.md](benchmarks.md), its Results table;\n", r.command, r.machine.date)
	b.WriteString("one local server per store). Each store ran with the lease given beside\n" +
		"its failover (the defaults where marked). At the default timings (lease\n" +
		"15 s, retry period 2 s), a crash fails over after about one lease on every\n" +
		"store (Consul: a lease plus the lock-delay); the other figures do not\n" +
		"depend on the lease.\n\n")
	b.WriteString("| store | crash failover p50 / max (lease) | loss reaction p50 / p99 | SIGTERM handover p50 / p90 | store requests/s, idle follower | memory, one more leader (Pss, with watchdog) |\n")
	b.WriteString("|---|---|---|---|---|---|\n")
	for _, col := range storeColumns {
		tl := col.lr
		lease := fmt.Sprintf("%v", col.tm.lease)
		if col.tm.defaults {
			lease += ", defaults"
		}
		crash, loss, handover, idle := "not run", "not run", "not run", "not run"
		if col.latency {
			crash = r.crash[tl.id].pair(1) + " (" + lease + ")"
			loss, handover = r.loss[tl.id].pair(.99), r.handover[tl.id].pair(.9)
			idle = "not measured"
			if c := r.cost[tl.id]; c != nil && c.first != nil {
				idle = fmt.Sprintf("%.2f", c.first.total())
			}
		}
		mem := "not run"
		if rec, ok := r.pss[tl.id]; ok {
			mem = marginalText(rec.marginal(memSum.pss))
		}
		fmt.Fprintf(&b, "| %s | %s | %s | %s | %s | %s |\n", col.title, crash, loss, handover, idle, mem)
	}
	return b.String()
}

// writeFigures replaces what lies between the figures markers of the page
// at path with section.
func writeFigures(path, section string) error {
	data, err := os.ReadFile(path)
	if err != nil {
		return err
	}
	page, err := replaceFigures(string(data), section)
	if err != nil {
		return fmt.Errorf("%s: %w", path, err)
	}
	return os.WriteFile(path, []byte(page), 0o644)
}

func replaceFigures(page, section string) (string, error) {
	before, rest, ok := strings.Cut(page, figuresBegin)
	_, after, ok2 := strings.Cut(rest, figuresEnd)
	if !ok || !ok2 {
		return "", errors.New("no figures markers")
	}
	return before + figuresBegin + "\n" + section + figuresEnd + after, nil
}

// TestFiguresBetweenMarkers: the figures replace what lay between the
// markers, and nothing else of the page; a page without them is an error.
func TestFiguresBetweenMarkers(t *testing.T) {
	r := newResults(3)
	r.command, r.machine.date, r.took = "scripts/bench.sh --runs 3", "2026-12-07 20:00 UTC", time.Minute
	section := r.figures()
	if !strings.Contains(section, "`scripts/bench.sh --runs 3` on 2026-12-07 20:00 UTC") || !strings.Contains(section, "| etcd |") {
		t.Fatalf("the figures do not name the run or the stores:\n%s", section)
	}
	page := "# Choosing\n\nbefore\n" + figuresBegin + "\nold figures\n" + figuresEnd + "\nafter\n"
	got, err := replaceFigures(page, section)
	if err != nil {
		t.Fatal(err)
	}
	if want := "# Choosing\n\nbefore\n" + figuresBegin + "\n" + section + figuresEnd + "\nafter\n"; got != want {
		t.Errorf("replaced page:\n%s\nwant:\n%s", got, want)
	}
	if _, err := replaceFigures("no markers", section); err == nil {
		t.Error("a page without markers was accepted")
	}
	// The page in docs/ has its markers.
	if data, err := os.ReadFile("../docs/choosing-a-store.md"); err != nil || !strings.Contains(string(data), figuresBegin) || !strings.Contains(string(data), figuresEnd) {
		t.Errorf("docs/choosing-a-store.md has no figures markers (%v)", err)
	}
}
