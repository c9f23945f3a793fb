package signals

import "sync"

// The processes this package waits for itself.

// tracked holds the pids of the processes this package waits for itself
// or learns the end of from a watchdog (watchdogs, commands), so that the
// orphan reaper (see BecomeSubreaper) leaves them alone, and a command
// re-parented to leaderrun after its watchdog died is waited for here.
var tracked = struct {
	sync.Mutex
	pids map[int]bool
}{pids: map[int]bool{}}

func track(pid int) {
	tracked.Lock()
	defer tracked.Unlock()
	tracked.pids[pid] = true
}

func untrack(pid int) {
	tracked.Lock()
	defer tracked.Unlock()
	delete(tracked.pids, pid)
}
