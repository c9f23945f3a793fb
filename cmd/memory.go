package cmd

import (
	"runtime/debug"
	"sync"

	"github.com/leaderrun/leaderrun/runner"
)

// memoryKeeper gives the memory that a leadership no longer uses back to
// the OS after every freeEvery acknowledged renewals. Without it
// the Go runtime lets the heap grow to its 4 MiB minimum target before it
// collects at all, and keeps the pages it freed: a leader that had renewed
// 900 times held 6.4 MiB of anonymous memory where it started with
// 1.6 MiB; with it, 2.9 MiB (measured with the hand-written clients; the
// benchmark reports today's figures, docs/benchmarks.md). A collection of
// leaderrun's small heap costs well under a millisecond of CPU, and runs
// beside the leadership loop, never in it. (Collecting once right after
// the start as well was measured: it adds the collector's own 0.5 MiB to
// every short run, and a long leadership's peak stays the same.)
type memoryKeeper struct {
	mu       sync.Mutex
	renewals int
	freeing  bool
	closed   bool
	wg       sync.WaitGroup
}

// freeEvery is how many renewals pass between two collections: every
// 32 s at the default --retry-period.
const freeEvery = 16

// Observe implements runner.Observer.
func (m *memoryKeeper) Observe(e runner.Event) {
	m.mu.Lock()
	defer m.mu.Unlock()
	if e.Kind != runner.Renewed {
		return
	}
	if m.renewals++; m.renewals%freeEvery == 0 && !m.freeing && !m.closed {
		m.freeing = true
		m.wg.Add(1)
		go func() {
			defer m.wg.Done()
			m.free()
		}()
	}
}

func (m *memoryKeeper) free() {
	debug.FreeOSMemory()
	m.mu.Lock()
	m.freeing = false
	m.mu.Unlock()
}

// close stops the keeper and waits for a collection under way.
func (m *memoryKeeper) close() {
	m.mu.Lock()
	m.closed = true
	m.mu.Unlock()
	m.wg.Wait()
}
