package signals

import (
	"os"
	"sync"

	"github.com/leaderrun/leaderrun/signals/watchdog"
)

// The processes this package waits for itself.

// tracked holds the pids of the processes this package waits for itself
// or learns the end of from a watchdog (watchdogs, commands), so that the
// orphan reaper (see BecomeSubreaper) leaves them alone, and a command
// re-parented to leaderrun after its watchdog died is waited for here.
var tracked = struct {
	sync.Mutex
	pids map[int]bool
}{pids: map[int]bool{}}

// launchTracked launches a watchdog and tracks it before the orphan
// reaper can see it exit.
func launchTracked(self string, stdio [3]*os.File, env []string) (*watchdog.Launched, error) {
	tracked.Lock()
	defer tracked.Unlock()
	w, err := watchdog.Launch(self, stdio, env)
	if err != nil {
		return nil, err
	}
	tracked.pids[w.Proc.Pid] = true
	return w, nil
}

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
