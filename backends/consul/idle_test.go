package consul_test

import (
	"net/http"
	"os"
	"strings"
	"testing"
	"time"

	"github.com/leaderrun/leaderrun/backends/consul"
	"github.com/leaderrun/leaderrun/internal/testenv"
)

// idleWindow is how long TestConsulIdleWaiters counts requests:
// $CONSUL_IDLE_WINDOW, or a minute.
func idleWindow(t *testing.T) time.Duration {
	if s := os.Getenv("CONSUL_IDLE_WINDOW"); s != "" {
		d, err := time.ParseDuration(s)
		if err != nil || d <= 0 {
			t.Fatalf("CONSUL_IDLE_WINDOW=%q: want a duration", s)
		}
		return d
	}
	return time.Minute
}

// idleCounts sorts the requests of a waiter answered in a window.
type idleCounts struct {
	blocking, woke, short, renewals, passes, other int
	shortest                                       time.Duration
}

func countIdle(reqs []proxied) idleCounts {
	var c idleCounts
	for _, r := range reqs {
		switch {
		case r.blocking():
			c.blocking++
			d := r.end.Sub(r.start)
			if c.shortest == 0 || d < c.shortest {
				c.shortest = d
			}
			switch {
			case r.woke():
				c.woke++
			case d < time.Second:
				// Neither the key changed nor did its wait end: for nothing.
				c.short++
			}
		case r.method == http.MethodPut && strings.HasPrefix(r.path, "/v1/session/renew/"):
			c.renewals++
		case r.method == http.MethodPut && strings.HasPrefix(r.path, "/v1/agent/check/pass/"):
			c.passes++
		default:
			c.other++
		}
	}
	return c
}

// TestConsulIdleWaiters counts what two idle waiters send Consul over a
// minute while a holder renews every 2 s. The holder's renewals write
// nothing the waiters watch: the first in line waits on the lock key, the
// second on the first's queue entry, and each sends at most 0.1 blocking
// queries per second, as `consul lock`'s waiters do (0.05); none ends
// early for nothing. Neither sends anything but blocking queries, its
// check's passes and its sessions' renewals: the first in line, ready to
// take over, passes its check and renews its lock and queue sessions every
// TTL/2; the second, parked, passes its check and renews its queue session
// every consul.ParkedTTL/2 only, so that in a minute it sends nothing.
func TestConsulIdleWaiters(t *testing.T) {
	t.Parallel()
	agent := testenv.StartConsul(t, testenv.ConsulOptions{})
	hb := newBackend(t, agent.Addr(), "idle", 0)
	key := "/v1/kv/" + hb.Key()
	lh := campaign(t, hb, "holder")
	r := renewEvery(lh, 2*time.Second)
	p1, p2 := newCountingProxy(t, agent.Addr()), newCountingProxy(t, agent.Addr())
	campaignFor(t, newBackend(t, p1.addr(), "idle", 0), "first", ttl)
	waitWaiting(t, hb, 1)
	campaignFor(t, newBackend(t, p2.addr(), "idle", 0), "second", ttl)
	waitWaiting(t, hb, 2)
	p1.waitBlocked(t, key)
	p2.waitBlocked(t, "")
	window := idleWindow(t)
	begin := time.Now()
	acked0, _, _ := r.counts()
	time.Sleep(window) // the measurement interval, not synchronisation
	end := time.Now()
	acked1, failed, _ := r.counts()
	renewals := acked1 - acked0
	first, second := countIdle(p1.between(begin, end)), countIdle(p2.between(begin, end))
	per := func(n int) float64 { return float64(n) / end.Sub(begin).Seconds() }
	t.Logf("over %v, the holder renewed %d times (%d failed)", end.Sub(begin).Round(time.Millisecond), renewals, failed)
	for _, w := range []struct {
		name     string
		c        idleCounts
		period   time.Duration // of its keep-alive
		sessions int           // renewed at each
	}{{"first in line", first, ttl / 2, 2}, {"second in line", second, consul.ParkedTTL / 2, 1}} {
		t.Logf("%s: blocking queries %.3f/s (%d: %d answered by a change, %d under 1s for nothing, shortest %v), session renewals %.3f/s, check passes %.3f/s, other requests %d",
			w.name, per(w.c.blocking), w.c.blocking, w.c.woke, w.c.short, w.c.shortest.Round(time.Millisecond), per(w.c.renewals), per(w.c.passes), w.c.other)
		if w.c.short > 0 {
			t.Errorf("%s: %d blocking queries returned in under 1s with nothing changed", w.name, w.c.short)
		}
		if w.c.other > 0 {
			t.Errorf("%s: %d requests other than blocking queries, renewals and check passes: polling", w.name, w.c.other)
		}
		if per(w.c.blocking) > 0.1 {
			t.Errorf("%s: %.3f blocking queries/s, want at most 0.1", w.name, per(w.c.blocking))
		}
		if want := int(end.Sub(begin) / w.period); w.c.passes < want-1 || w.c.passes > want+1 {
			t.Errorf("%s: %d check passes, want about %d (every %v)", w.name, w.c.passes, want, w.period)
		}
		if w.c.renewals != w.sessions*w.c.passes {
			t.Errorf("%s: %d session renewals for %d check passes, want %d each", w.name, w.c.renewals, w.c.passes, w.sessions)
		}
	}
	if renewals < 25 {
		t.Errorf("the holder renewed %d times in %v, want about one per 2s", renewals, end.Sub(begin).Round(time.Second))
	}
	r.halt()
	release(t, lh)
}
