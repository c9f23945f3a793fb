package cmd

import (
	"runtime/metrics"
	"testing"
	"time"

	"github.com/leaderrun/leaderrun/runner"
)

// forcedGCs counts the collections that debug.FreeOSMemory (or
// runtime.GC) forced in this process.
func forcedGCs() uint64 {
	s := []metrics.Sample{{Name: "/gc/cycles/forced:gc-cycles"}}
	metrics.Read(s)
	return s[0].Value.Uint64()
}

// TestMemoryKeeper: the memory a leadership left behind goes back to the
// OS once every freeEvery renewals, and not on other events; close waits
// for a collection under way and stops the rest.
func TestMemoryKeeper(t *testing.T) {
	m := &memoryKeeper{}
	before := forcedGCs()
	for _, k := range []runner.EventKind{runner.Acquired, runner.ChildStarted, runner.RenewFailed} {
		m.Observe(runner.Event{Kind: k})
	}
	for range freeEvery - 1 {
		m.Observe(runner.Event{Kind: runner.Renewed})
	}
	if n := forcedGCs(); n != before {
		t.Errorf("%d collections after %d renewals, want none yet", n-before, freeEvery-1)
	}
	m.Observe(runner.Event{Kind: runner.Renewed})
	waitForGCs(t, before+1, "the collection after the 16th renewal")
	m.close()
	before = forcedGCs()
	for range freeEvery {
		m.Observe(runner.Event{Kind: runner.Renewed})
	}
	if n := forcedGCs(); n != before {
		t.Errorf("%d collections after close, want none", n-before)
	}
}

func waitForGCs(t *testing.T, want uint64, what string) {
	t.Helper()
	deadline := time.Now().Add(5 * time.Second)
	for forcedGCs() < want {
		if time.Now().After(deadline) {
			t.Fatalf("no %s within 5 s", what)
		}
		time.Sleep(10 * time.Millisecond)
	}
}
