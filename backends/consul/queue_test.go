package consul_test

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"net/http"
	"slices"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/hashicorp/consul/api"

	"github.com/leaderrun/leaderrun/backends"
	"github.com/leaderrun/leaderrun/internal/testenv"
)

// TestConsulQueueWakesOne: with 50 waiters in the queue, each change of
// leader wakes the next in line and the one behind it, not the herd, and
// the lock goes to the waiters in the order they came.
func TestConsulQueueWakesOne(t *testing.T) {
	t.Parallel()
	agent := testenv.StartConsul(t, testenv.ConsulOptions{})
	const waiters, changes = 50, 6
	const lock = "queue"
	holder := newBackend(t, agent.Addr(), lock, 0)
	key := "/v1/kv/" + holder.Key()
	current := campaign(t, holder, "holder")
	type waiter struct {
		id    string
		proxy *countingProxy
		got   <-chan timedResult
	}
	ws := make([]waiter, waiters)
	for i := range ws {
		p := newCountingProxy(t, agent.Addr())
		ws[i] = waiter{id: fmt.Sprintf("w%02d", i), proxy: p}
		ws[i].got = campaignFor(t, newBackend(t, p.addr(), lock, 0), ws[i].id, ttl)
		// One at a time, so that the queue's order is known.
		waitWaiting(t, holder, i+1)
	}
	ws[0].proxy.waitBlocked(t, key)
	var woken, requests []int
	var handovers []time.Duration
	for k := range changes {
		released := time.Now()
		release(t, current)
		var res timedResult
		select {
		case res = <-ws[k].got:
		case <-time.After(10 * time.Second):
			t.Fatalf("change %d: %s, first in line, did not get the lock", k, ws[k].id)
		}
		current = res.get(t)
		handovers = append(handovers, res.at.Sub(released))
		// The change has rippled through once the next in line watches the key.
		ws[k+1].proxy.waitBlocked(t, key)
		end := time.Now()
		n, reqs := 0, 0
		var who []string
		for _, w := range ws {
			if w.proxy.woken(released, end) > 0 {
				n++
				who = append(who, w.id)
			}
			reqs += len(w.proxy.between(released, end))
		}
		woken = append(woken, n)
		requests = append(requests, reqs)
		t.Logf("change %d: %s got the lock %v after the release; waiters woken: %d %v; requests of all waiters: %d",
			k, ws[k].id, res.at.Sub(released).Round(time.Microsecond), n, who, reqs)
		st, err := holder.Status(context.Background())
		if err != nil || st.Waiting != waiters-k-1 || st.Identity != ws[k].id {
			t.Errorf("change %d: status %+v, %v; want %s holding, %d waiting", k, st, err, ws[k].id, waiters-k-1)
		}
	}
	release(t, current)
	slices.Sort(woken)
	t.Logf("%d waiters, %d changes: waiters woken per change %v (median %d); requests per change %v; handover %s",
		waiters, changes, woken, woken[len(woken)/2], requests, summary(handovers))
	if woken[len(woken)/2] > 2 || woken[len(woken)-1] > 3 {
		t.Errorf("waiters woken per change %v: want a median of at most 2 (the next in line and the one behind it)", woken)
	}
	for i, n := range requests {
		if n > 20 {
			t.Errorf("change %d: %d requests from %d waiters: a herd", i, n, waiters)
		}
	}
	if h := handovers[len(handovers)/2]; h > time.Second {
		t.Errorf("handover p50 %v with %d waiters", h, waiters)
	}
}

// summary formats durations as min/median/max.
func summary(ds []time.Duration) string {
	s := slices.Clone(ds)
	slices.Sort(s)
	r := func(d time.Duration) time.Duration { return d.Round(10 * time.Microsecond) }
	return fmt.Sprintf("min %v, median %v, max %v", r(s[0]), r(s[len(s)/2]), r(s[len(s)-1]))
}

// queueOf lists the live entries of the lock's queue, oldest first, as
// identity@session.
func queueOf(t *testing.T, op *api.Client, key string) []string {
	t.Helper()
	pairs, _, err := op.KV().List(key+":queue/", nil)
	if err != nil {
		t.Fatalf("list the queue: %v", err)
	}
	slices.SortFunc(pairs, func(a, b *api.KVPair) int { return cmp.Compare(a.CreateIndex, b.CreateIndex) })
	var out []string
	for _, p := range pairs {
		if p.Session != "" {
			out = append(out, string(p.Value)+"@"+p.Session)
		}
	}
	return out
}

// TestConsulWaiterSessionInvalidated: a waiter whose session is destroyed
// behind its back leaves the queue and joins it again, at the end, with a
// new session; the waiter behind it moves up and gets the lock first.
func TestConsulWaiterSessionInvalidated(t *testing.T) {
	t.Parallel()
	agent := testenv.StartConsul(t, testenv.ConsulOptions{})
	op := admin(t, agent.Addr())
	a := newBackend(t, agent.Addr(), "rewait", 0)
	la := campaign(t, a, "a")
	gotB := campaignFor(t, newBackend(t, agent.Addr(), "rewait", 0), "b", ttl)
	waitWaiting(t, a, 1)
	gotC := campaignFor(t, newBackend(t, agent.Addr(), "rewait", 0), "c", ttl)
	waitWaiting(t, a, 2)
	before := queueOf(t, op, a.Key())
	dead := strings.TrimPrefix(before[0], "b@")
	destroy(t, op, dead)
	destroyed := time.Now()
	// b learns of it at its next renewal, at most TTL/2 later.
	waitUntil(t, "b back in the queue behind c", func() bool {
		q := queueOf(t, op, a.Key())
		return len(q) == 2 && strings.HasPrefix(q[0], "c@") && strings.HasPrefix(q[1], "b@")
	})
	t.Logf("queue %v; after b's session was destroyed, %v later: %v", before, time.Since(destroyed).Round(time.Millisecond), queueOf(t, op, a.Key()))
	keys, _, err := op.KV().Keys(a.Key()+":queue/", "", nil)
	if err != nil || len(keys) != 2 || slices.Contains(keys, a.Key()+":queue/"+dead) {
		t.Errorf("queue keys %v, %v: want the two live entries, not b's dead one", keys, err)
	}
	release(t, la)
	var lc *backends.Lease
	select {
	case res := <-gotC:
		lc = res.get(t)
	case res := <-gotB:
		t.Fatalf("b, who joined the queue again, got the lock before c: %v", res.err)
	case <-time.After(10 * time.Second):
		t.Fatal("c did not get the lock")
	}
	release(t, lc)
	select {
	case res := <-gotB:
		lb := res.get(t)
		if sessionOf(t, lb) == dead {
			t.Error("b holds the lock with the session that was destroyed")
		}
		if lb.Token() <= lc.Token() {
			t.Errorf("token %d after %d", lb.Token(), lc.Token())
		}
		release(t, lb)
	case <-time.After(10 * time.Second):
		t.Fatal("b did not get the lock after its session was destroyed")
	}
}

// TestConsulTryLeavesNoTrace: --try on a held lock answers at once and
// leaves no session and no queue entry; a waiter that gives up leaves the
// queue.
func TestConsulTryLeavesNoTrace(t *testing.T) {
	agent := testenv.StartConsul(t, testenv.ConsulOptions{})
	op := admin(t, agent.Addr())
	a, b := newBackend(t, agent.Addr(), "trace", 0), newBackend(t, agent.Addr(), "trace", 0)
	la := campaign(t, a, "a")
	defer release(t, la)
	sessions := func() int {
		list, _, err := op.Session().List(nil)
		if err != nil {
			t.Fatal(err)
		}
		return len(list)
	}
	cases := []struct {
		name string
		try  bool
		wait time.Duration
		want error
	}{
		{name: "try", try: true, wait: 5 * time.Second, want: backends.ErrLocked},
		{name: "wait gives up", wait: 300 * time.Millisecond, want: context.DeadlineExceeded},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			ctx, cancel := context.WithTimeout(context.Background(), tc.wait)
			defer cancel()
			begin := time.Now()
			_, err := b.Campaign(ctx, campaignOptions{Identity: "b", Try: tc.try, LeaseDuration: ttl})
			took := time.Since(begin)
			t.Logf("%s: %v after %v", tc.name, err, took.Round(time.Microsecond))
			if !errors.Is(err, tc.want) {
				t.Fatalf("got %v, want %v", err, tc.want)
			}
			if tc.try && took > 100*time.Millisecond {
				t.Errorf("try took %v, want well under 100ms", took)
			}
			if n := sessions(); n != 1 {
				t.Errorf("%d sessions, want the holder's only", n)
			}
			if keys, _, err := op.KV().Keys(a.Key()+":queue/", "", nil); err != nil || len(keys) != 0 {
				t.Errorf("queue %v, %v: want it empty", keys, err)
			}
		})
	}
}

// TestConsulSilentFirstInLineDropped: the first in line falls silent (its
// link to the agent refuses everything but its blocking query); a lease
// after its last keep-alive its check turns critical, which ends its queue
// session and deletes its entry, and the waiter behind, parked until then,
// moves up: it watches the key, ready, and takes the lock at the release.
func TestConsulSilentFirstInLineDropped(t *testing.T) {
	t.Parallel()
	agent := testenv.StartConsul(t, testenv.ConsulOptions{})
	h := newBackend(t, agent.Addr(), "silent", 0)
	key := "/v1/kv/" + h.Key()
	lh := campaign(t, h, "holder")
	var silent atomic.Bool
	pa := newHookedProxy(t, agent.Addr(), func(w http.ResponseWriter, r *http.Request) bool {
		if silent.Load() && r.Method != http.MethodGet {
			http.Error(w, "silenced by the test", http.StatusServiceUnavailable)
			return true
		}
		return false
	})
	campaignFor(t, newBackend(t, pa.addr(), "silent", 0), "a", ttl)
	waitWaiting(t, h, 1)
	pb := newCountingProxy(t, agent.Addr())
	gotB := campaignFor(t, newBackend(t, pb.addr(), "silent", 0), "b", ttl)
	waitWaiting(t, h, 2)
	pa.waitBlocked(t, key)
	pb.waitBlocked(t, "")
	if pb.blocked(key) {
		t.Fatal("the second in line watches the key")
	}
	silenced := time.Now()
	silent.Store(true)
	// a's last keep-alive came at most TTL/2 before it fell silent.
	bound := ttl + ttl/2 + 2*time.Second
	for !pb.blocked(key) {
		if time.Since(silenced) > bound {
			t.Fatalf("b did not move up within %v of a falling silent (its last keep-alive at most %v before)", bound, ttl/2)
		}
		time.Sleep(5 * time.Millisecond)
	}
	t.Logf("b watches the key %v after a fell silent (lease %v)", time.Since(silenced).Round(time.Millisecond), ttl)
	release(t, lh)
	select {
	case res := <-gotB:
		release(t, res.get(t))
	case <-time.After(10 * time.Second):
		t.Fatal("b did not get the lock")
	}
}
