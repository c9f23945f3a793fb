//go:build linux

package e2e

import (
	"cmp"
	"fmt"
	"path/filepath"
	"slices"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/hashicorp/consul/api"

	"github.com/leaderrun/leaderrun/internal/testenv"
)

// consulQueue returns the identities of lock's live waiters, first in
// line first.
func consulQueue(t *testing.T, c *api.Client, lock string) []string {
	t.Helper()
	pairs, _, err := c.KV().List(consulPrefix+lock+":queue/", nil)
	if err != nil {
		t.Fatalf("list the queue of %s: %v", lock, err)
	}
	slices.SortFunc(pairs, func(a, b *api.KVPair) int { return cmp.Compare(a.CreateIndex, b.CreateIndex) })
	var ids []string
	for _, p := range pairs {
		if p.Session != "" {
			ids = append(ids, string(p.Value))
		}
	}
	return ids
}

// TestConsulHerd: 30 leaderrun waiters queued on one lock behind a
// leader, each through a proxy of its own that records what it sends. One
// SIGTERM handover, 5 runs (a new waiter joins the end after each, so
// that every handover has 30 waiting): within 1.5 s of the SIGTERM at most
// 2 of the waiters send any request at all, keep-alives included: the
// first in line, which takes the lock, and the one behind it, which moves
// up. The others are parked: their keep-alive and their blocking query
// come every 5 minutes (consul.ParkedTTL/2, maxWait), after this test's
// end; before the waiters were parked, each renewed every TTL/2 and 6 to
// 27 of them did so within the window.
func TestConsulHerd(t *testing.T) {
	t.Parallel()
	const (
		waiters = 30
		runs    = 5
		window  = 1500 * time.Millisecond
		lock    = "herd30"
	)
	agent := testenv.StartConsul(t, testenv.ConsulOptions{})
	c := consulClient(t, agent.Addr())
	events := filepath.Join(t.TempDir(), "events")
	procs := map[string]*proc{}
	proxies := map[string]*consulProxy{}
	n := 0
	add := func() string {
		id := fmt.Sprintf("p%03d", n)
		n++
		p := newConsulProxy(t, agent.Addr())
		args := append(append(consulTimedArgs(p.addr(), lock, id, consulIssueTimings), "--"), childArgv(t)...)
		proxies[id] = p
		procs[id] = start(t, childEnv(events, "forever"), args...)
		return id
	}
	leader := add()
	waitEvents(t, events, 10*time.Second, "the first child", consulSaw("start", leader))
	// All at once, as after a fleet's restart: their keep-alives then
	// fall together, which is what a waiter's keep-alive every TTL/2 made
	// into a herd of 27 at a handover.
	for range waiters {
		add()
	}
	var counts []int
	for run := range runs {
		var line []string
		waitFor(t, 20*time.Second, "every waiter to queue and sleep in a blocking query", func() bool {
			line = consulQueue(t, c, lock)
			if len(line) != waiters {
				return false
			}
			for _, id := range line {
				if !proxies[id].blocked("") {
					return false
				}
			}
			return proxies[line[0]].blocked("/v1/kv/" + consulPrefix + lock)
		})
		stopped := time.Now()
		procs[leader].signal(syscall.SIGTERM)
		waitEvents(t, events, 10*time.Second, line[0]+"'s child", consulSaw("start", line[0]))
		time.Sleep(time.Until(stopped.Add(window))) // the measurement window, not synchronisation
		var who []string
		for _, id := range line {
			if sent := proxies[id].sent(stopped, stopped.Add(window)); len(sent) > 0 {
				who = append(who, id+": "+strings.Join(sent, ", "))
			}
		}
		counts = append(counts, len(who))
		t.Logf("run %d: %d of %d waiters sent a request within %v of the SIGTERM to %s (first in line %s, then %s):\n\t%s",
			run, len(who), waiters, window, leader, line[0], line[1], strings.Join(who, "\n\t"))
		if len(who) > 2 {
			t.Errorf("run %d: %d waiters sent a request within %v of the handover, want at most 2", run, len(who), window)
		}
		procs[leader].wait(10 * time.Second)
		leader = line[0]
		add()
	}
	checkExclusive(t, readEvents(t, events))
	slices.Sort(counts)
	t.Logf("%d waiters, %d handovers: waiters that sent any request within %v: %v", waiters, runs, window, counts)
	for _, p := range procs {
		p.signalIfRunning(syscall.SIGTERM)
	}
	for _, p := range procs {
		p.wait(10 * time.Second)
	}
}
