package bench

import (
	"fmt"
	"syscall"
	"time"
)

// costRes is what one tool's leader and idle followers send the store,
// per second, and what one whole run on a free lock sends (counts).
type costRes struct {
	leader, first, second rates
	// leaderOver is the time the leader was counted over; followersOver
	// the followers'.
	leaderOver, followersOver time.Duration
	oneRun                    rates
	// perProcess: the meter told the processes apart (second is then
	// measured); otherwise the follower is the difference between the
	// server's counts with and without it.
	perProcess bool
	// blocking: Consul, how long the followers' blocking queries lasted.
	firstBlocking, secondBlocking []time.Duration
	how                           string
}

// measureCost: requests per second that one leader, and idle followers,
// send to the store, each tool counted by a meter of its store's (see
// meter). All tools run at once, on locks of their own: first the
// leaders alone for a window, then with their followers (the first in
// line and, where the meter tells processes apart, a second waiter
// behind it) for another.
func (b *bench) measureCost() {
	type entry struct {
		tl    *tool
		m     meter
		lock  string
		procs []*proc
	}
	var es []*entry
	defer func() {
		b.killAll()
		for _, e := range es {
			e.m.close()
		}
	}()
	for _, tl := range latencyTools {
		es = append(es, &entry{tl: tl, m: b.storeOf(tl).meter(b, tl), lock: "cost-" + tl.id})
	}
	// What one start-to-child run (acquire, child exits, release) asks
	// of the store, counted the same way.
	for _, e := range es {
		tag := e.lock + "-once"
		a := e.m.mark()
		p, err := b.start(e.tl, tag, tag, e.m.addr(e.tl, tag), false)
		if err != nil {
			b.t.Fatal(err)
		}
		if _, ok := b.hub.started(tag, 15*time.Second); !ok || !p.waitExit(15*time.Second) {
			b.t.Fatalf("%s: one run did not complete:\n%s", e.tl.name, p.tail())
		}
		b.res.cost[e.tl.id] = &costRes{oneRun: e.m.requests([]string{tag}, a, e.m.mark()), perProcess: e.m.perProcess(), how: e.m.how()}
	}
	spawn := func(e *entry, suffix string) *proc {
		tag := e.lock + suffix
		p, err := b.start(e.tl, e.lock, tag, e.m.addr(e.tl, tag), true)
		if err != nil {
			b.t.Fatal(err)
		}
		e.procs = append(e.procs, p)
		return p
	}
	for _, e := range es {
		b.storeOf(e.tl).prepare(e.lock)
		p := spawn(e, "-a")
		if _, ok := b.hub.started(p.tag, 15*time.Second); !ok {
			b.t.Fatalf("%s: no child within 15 s:\n%s", e.tl.name, p.tail())
		}
	}
	window := func() (map[*entry]mark, map[*entry]mark) {
		time.Sleep(2 * time.Second) // past start-up requests
		from := map[*entry]mark{}
		for _, e := range es {
			from[e] = e.m.mark()
		}
		time.Sleep(b.window)
		to := map[*entry]mark{}
		for _, e := range es {
			to[e] = e.m.mark()
		}
		return from, to
	}
	w1a, w1b := window()
	for _, e := range es {
		spawn(e, "-b")
		if err := b.waitCandidates(e.tl, e.lock, e.procs, 2, 15*time.Second); err != nil {
			b.t.Fatal(err)
		}
		if e.m.perProcess() {
			// The second waiter queues behind the first.
			time.Sleep(settle)
			spawn(e, "-c")
			if err := b.waitCandidates(e.tl, e.lock, e.procs, 3, 15*time.Second); err != nil {
				b.t.Fatal(err)
			}
		}
	}
	w2a, w2b := window()

	for _, e := range es {
		c := b.res.cost[e.tl.id]
		lead, first, second := e.lock+"-a", e.lock+"-b", e.lock+"-c"
		over1, over2 := w1b[e].at-w1a[e].at, w2b[e].at-w2a[e].at
		if e.m.perProcess() {
			r := e.m.requests([]string{lead}, w1a[e], w1b[e])
			r.add(e.m.requests([]string{lead}, w2a[e], w2b[e]))
			c.leader, c.leaderOver = r.per(over1+over2), over1+over2
			c.first = e.m.requests([]string{first}, w2a[e], w2b[e]).per(over2)
			c.second = e.m.requests([]string{second}, w2a[e], w2b[e]).per(over2)
		} else {
			c.leader, c.leaderOver = e.m.requests(nil, w1a[e], w1b[e]).per(over1), over1
			both := e.m.requests(nil, w2a[e], w2b[e]).per(over2)
			c.first = rates{}
			for k, v := range both {
				if d := v - c.leader[k]; d > 0.005 {
					c.first[k] = d
				}
			}
		}
		c.followersOver = over2
		if cm, ok := e.m.(*consulMeter); ok {
			c.firstBlocking = cm.blocking(first, w2a[e], w2b[e])
			c.secondBlocking = cm.blocking(second, w2a[e], w2b[e])
		}
	}
}

// herdChange is one change of leader among the herd.
type herdChange struct {
	handover time.Duration
	woken    int   // followers woken by the change (see meter.woken)
	wakes    int   // wake-ups in all (blocking queries answered, watch events, statements, ...)
	requests rates // counts of the followers' requests in the window, keep-alives left out
	window   time.Duration
}

// herdRes is the many-followers test of one store.
type herdRes struct {
	followers  int
	idle       rates // requests per second from all followers together, idle
	idleWoken  int   // followers woken while idle
	idleWakes  int   // wake-ups while idle, in all
	idleFor    time.Duration
	changes    []herdChange
	handover   sample
	perProcess bool
}

// measureHerd runs leaderrun with b.herdN followers on one lock, on each
// store, and moves leadership several times with SIGTERM.
func (b *bench) measureHerd() {
	for _, col := range storeColumns {
		if !col.latency {
			continue
		}
		at := time.Now()
		b.res.herd[col.name] = b.herd(col)
		b.killAll()
		b.t.Logf("herd on %s took %v", col.name, time.Since(at).Round(100*time.Millisecond))
	}
}

const (
	herdChanges = 5
	herdIdleFor = 5 * time.Second // rates per second; the whole run stays near 15 minutes
)

func (b *bench) herd(col *storeColumn) *herdRes {
	tl := col.lr
	st := b.storeOf(tl)
	m := st.meter(b, tl)
	defer m.close()
	res := &herdRes{followers: b.herdN, perProcess: m.perProcess()}
	lock := "herd-" + tl.id
	st.prepare(lock)
	procs := map[string]*proc{}
	var all []*proc
	spawn := func(i int) *proc {
		tag := fmt.Sprintf("%s-%03d", lock, i)
		p, err := b.start(tl, lock, tag, m.addr(tl, tag), true)
		if err != nil {
			b.t.Fatal(err)
		}
		procs[tag] = p
		all = append(all, p)
		return p
	}
	leader := spawn(0)
	if _, ok := b.hub.started(leader.tag, 15*time.Second); !ok {
		b.t.Errorf("%s herd: no leader within 15 s:\n%s", tl.name, leader.tail())
		return res
	}
	const batch = 25
	for n := 1; n <= b.herdN; n += batch {
		for i := n; i < min(n+batch, b.herdN+1); i++ {
			spawn(i)
		}
		if err := b.waitCandidates(tl, lock, all, min(n+batch, b.herdN+1), 90*time.Second); err != nil {
			b.t.Errorf("%s herd: %v", tl.name, err)
			return res
		}
	}
	time.Sleep(2 * time.Second)
	followers := func() []string {
		var tags []string
		for tag := range procs {
			if tag != leader.tag {
				tags = append(tags, tag)
			}
		}
		return tags
	}

	// Idle: what do the followers send while nothing changes?
	a := m.mark()
	time.Sleep(herdIdleFor)
	z := m.mark()
	res.idle = m.requests(followers(), a, z).per(z.at - a.at)
	res.idleWoken, res.idleWakes = m.woken(followers(), a, z)
	res.idleFor = z.at - a.at

	for range herdChanges {
		fs := followers()
		a := m.mark()
		t0 := mono()
		leader.signal(syscall.SIGTERM)
		var next string
		ok := b.hub.wait(20*time.Second, func() bool {
			for tag := range procs {
				if k := b.hub.kids[tag]; k != nil && k.start > t0 {
					next = tag
					return true
				}
			}
			return false
		})
		if !ok {
			res.handover.never++
			b.t.Errorf("%s herd: no new leader within 20 s of SIGTERM", tl.name)
			break
		}
		k, _ := b.hub.get(next)
		ch := herdChange{handover: k.start - t0}
		res.handover.add(ch.handover)
		// Followers that wake for the change do so at once; give
		// stragglers on a loaded machine 2 s.
		time.Sleep(2 * time.Second)
		z := m.mark()
		ch.window = z.at - a.at
		ch.woken, ch.wakes = m.woken(fs, a, z)
		ch.requests = m.requests(fs, a, z).without(classKeepalive)
		res.changes = append(res.changes, ch)
		if !leader.waitExit(10 * time.Second) {
			b.t.Errorf("%s herd: old leader still running 10 s after SIGTERM", tl.name)
		}
		delete(procs, leader.tag)
		leader = procs[next]
	}
	return res
}
