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
// OS a second after the command started, then once every freeEvery
// renewals; close waits for a collection under way and stops the rest.
func TestMemoryKeeper(t *testing.T) {
	m := &memoryKeeper{}
	before := forcedGCs()
	started := time.Now()
	m.Observe(runner.Event{Kind: runner.ChildStarted})
	waitForGCs(t, before+1, "the collection after the start")
	if took := time.Since(started); took < 900*time.Millisecond {
		t.Errorf("collected %v after the start, want about a second later", took)
	}
	before = forcedGCs()
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
	m.Observe(runner.Event{Kind: runner.ChildStarted})
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
