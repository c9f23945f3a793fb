package zookeeper_test

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"os"
	"regexp"
	"slices"
	"sort"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/go-zookeeper/zk"

	"github.com/leaderrun/leaderrun/backends"
	"github.com/leaderrun/leaderrun/backends/zookeeper"
	"github.com/leaderrun/leaderrun/internal/testenv"
)

func lockDir(lock string) string { return "/" + prefix + lock }

// children lists a znode's children, none if it does not exist.
func children(t *testing.T, c *zk.Conn, path string) []string {
	t.Helper()
	names, _, err := c.Children(path)
	if errors.Is(err, zk.ErrNoNode) {
		return nil
	}
	if err != nil {
		t.Fatalf("children of %s: %v", path, err)
	}
	sort.Strings(names)
	return names
}

// candidateNames are the children of a lock's znode that are candidates.
func candidateNames(t *testing.T, c *zk.Conn, lock string) []string {
	t.Helper()
	var names []string
	for _, n := range children(t, c, lockDir(lock)) {
		if strings.HasPrefix(n, "_c_") {
			names = append(names, n)
		}
	}
	return names
}

// deleteAll deletes path and everything under it in one transaction, as
// an operator's deleteall would (it retries if a candidate is created in
// between, which would make the parent's delete fail).
func deleteAll(t *testing.T, c *zk.Conn, path string) {
	t.Helper()
	for range 20 {
		var tree []string
		var walk func(string) error
		walk = func(p string) error {
			names, _, err := c.Children(p)
			if err != nil {
				return err
			}
			for _, n := range names {
				if err := walk(p + "/" + n); err != nil {
					return err
				}
			}
			tree = append(tree, p)
			return nil
		}
		if err := walk(path); err != nil {
			t.Fatalf("walk %s: %v", path, err)
		}
		ops := make([]any, len(tree))
		for i, p := range tree {
			ops[i] = &zk.DeleteRequest{Path: p, Version: -1}
		}
		_, err := c.Multi(ops...)
		if err == nil {
			return
		}
		if !errors.Is(err, zk.ErrNotEmpty) && !errors.Is(err, zk.ErrNoNode) {
			t.Fatalf("delete %s: %v", path, err)
		}
	}
	t.Fatalf("delete %s: candidates kept coming", path)
}

// watchers counts the sessions that watch each path, as the (first)
// server tells.
func watchers(t *testing.T, z *testenv.ZooKeeper) map[string]int {
	t.Helper()
	out, err := z.Members[0].FourLetter("wchp")
	if err != nil {
		t.Fatal(err)
	}
	n, path := map[string]int{}, ""
	for _, line := range strings.Split(out, "\n") {
		switch {
		case strings.HasPrefix(line, "/"):
			path = line
		case strings.HasPrefix(strings.TrimSpace(line), "0x"):
			n[path]++
		}
	}
	return n
}

// queue is the candidates' znodes of lock, first first.
func queue(t *testing.T, c *zk.Conn, lock string) []string {
	t.Helper()
	var paths []string
	for _, n := range candidateNames(t, c, lock) {
		paths = append(paths, lockDir(lock)+"/"+n)
	}
	slices.SortFunc(paths, func(a, b string) int { return int(seqOf(t, a) - seqOf(t, b)) })
	return paths
}

// seqOf is the sequence number a znode's name ends with.
func seqOf(t *testing.T, path string) int64 {
	t.Helper()
	i := strings.LastIndex(path, "-")
	n, err := strconv.ParseInt(path[i+1:], 10, 64)
	if err != nil {
		t.Fatalf("no sequence number in %s", path)
	}
	return n
}

// testHandovers: three contenders hand the lock over 20 times; no grant
// comes before the previous holder let go, and every token is greater than
// the one before, also after the lock's whole znode was deleted by hand
// halfway through (which restarts the sequence numbers, not the tokens).
func testHandovers(t *testing.T, env *env) {
	const (
		lock      = "handovers"
		contender = 3
		handovers = 20
		deleteAt  = 10 // the grant during which the tree is deleted
	)
	type grant struct {
		who int
		l   lease
		at  time.Time
	}
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	grants := make(chan grant)
	var release [contender]chan struct{}
	var released [contender]chan time.Time // when the holder stopped holding
	var wg sync.WaitGroup
	defer wg.Wait()
	defer cancel()
	for i := range contender {
		release[i], released[i] = make(chan struct{}), make(chan time.Time)
		b := openStore(t, env.servers)
		wg.Go(func() {
			for {
				l, err := campaignFor(ctx, b, lock, candidate(fmt.Sprintf("c%d", i), 10*time.Second))
				if err != nil {
					if ctx.Err() == nil {
						t.Errorf("c%d: campaign: %v", i, err)
					}
					return
				}
				select {
				case grants <- grant{i, l, time.Now()}:
				case <-ctx.Done():
					l.Release(context.Background(), nil)
					return
				}
				<-release[i]
				end := time.Now()
				if err := l.Release(context.Background(), nil); err != nil {
					t.Errorf("c%d: release: %v", i, err)
				}
				released[i] <- end
			}
		})
	}
	var prev, first grant
	var prevEnd time.Time
	for n := 0; n <= handovers; n++ {
		var g grant
		select {
		case g = <-grants:
		case <-time.After(30 * time.Second):
			t.Fatalf("no grant %d within 30s", n)
		}
		if n == 0 {
			first = g
		} else {
			if g.l.Token() <= prev.l.Token() {
				t.Errorf("grant %d: token %d not greater than the previous %d", n, g.l.Token(), prev.l.Token())
			}
			if !g.at.After(prevEnd) {
				t.Errorf("grant %d to c%d at %v, before c%d let go at %v", n, g.who, g.at, prev.who, prevEnd)
			}
		}
		if n == deleteAt+1 && seqOf(t, g.l.Path()) >= seqOf(t, prev.l.Path()) {
			t.Errorf("after the delete, the sequence did not start again: %s after %s", g.l.Path(), prev.l.Path())
		}
		var deleted time.Time
		if n == deleteAt {
			// The store ends this lease: its end is the delete, and
			// the holder must hear of it within a second.
			deleted = time.Now()
			deleteAll(t, env.admin, lockDir(lock))
			select {
			case <-g.l.Lost():
				t.Logf("holder of token %d: loss reported %v after the delete", g.l.Token(), time.Since(deleted))
			case <-time.After(time.Second):
				t.Fatal("Lost() not closed within 1s of deleting the lock's znode")
			}
		}
		release[g.who] <- struct{}{}
		prev, prevEnd = g, <-released[g.who]
		if !deleted.IsZero() {
			prevEnd = deleted
		}
	}
	t.Logf("%d handovers, tokens %d to %d", handovers, first.l.Token(), prev.l.Token())
}

// testMiddleWithdraws: when the waiter between the leader and another
// waiter withdraws, the one behind it wakes, reads the queue again and
// keeps waiting, now on the leader: its predecessor going is not its turn.
func testMiddleWithdraws(t *testing.T, env *env) {
	const lock = "middle-withdraws"
	a, bb, c := openStore(t, env.servers), openStore(t, env.servers), openStore(t, env.servers)
	la := campaign(t, a, lock, "a", 10*time.Second)
	bctx, bcancel := context.WithCancel(context.Background())
	defer bcancel()
	bdone := make(chan error, 1)
	go func() {
		_, err := campaignFor(bctx, bb, lock, candidate("b", 10*time.Second))
		bdone <- err
	}()
	waitFor(t, "b to queue", func() bool { return len(candidateNames(t, env.admin, lock)) == 2 })
	got := make(chan *lease, 1)
	go func() {
		l, err := campaignFor(context.Background(), c, lock, candidate("c", 10*time.Second))
		if err != nil {
			t.Errorf("c: %v", err)
			got <- nil
			return
		}
		got <- &l
	}()
	waitFor(t, "c to queue", func() bool { return len(candidateNames(t, env.admin, lock)) == 3 })
	waitFor(t, "c to watch b", func() bool { return watchers(t, env.zk)[queue(t, env.admin, lock)[1]] == 1 })
	bcancel()
	if err := <-bdone; !errors.Is(err, context.Canceled) {
		t.Errorf("b's campaign: %v, want context.Canceled", err)
	}
	waitFor(t, "c to wake", func() bool { return c.Wakes() == 1 })
	// c now watches a: its campaign goes on, a still leads.
	// a's znode is watched by a itself and by c.
	waitFor(t, "c to watch the leader", func() bool {
		select {
		case l := <-got:
			if l != nil {
				l.Release(context.Background(), nil)
			}
			t.Fatal("c's campaign returned while a held the lock")
		default:
		}
		return watchers(t, env.zk)[la.Path()] == 2
	})
	if st := status(t, a, lock); !st.Held || st.Identity != "a" || st.Waiting != 1 {
		t.Errorf("status %+v; want a holding, c waiting", st)
	}
	if err := la.Release(context.Background(), nil); err != nil {
		t.Fatal(err)
	}
	select {
	case l := <-got:
		if l != nil {
			defer l.Release(context.Background(), nil)
			if l.Token() <= la.Token() {
				t.Errorf("c's token %d not greater than a's %d", l.Token(), la.Token())
			}
		}
	case <-time.After(10 * time.Second):
		t.Fatal("c did not take over within 10s of a's release")
	}
}

// testSessionDies: a leader cut off from the ensemble loses its session
// after the negotiated timeout, and the waiting follower takes over within
// that timeout + 1 s. The link either stalls (a partition, a frozen host:
// TCP sees nothing) or is closed for good (the leader's process killed:
// the server sees the connection go, and still keeps the session for its
// timeout). Meanwhile the leader cannot know: its renewals fail, but Lost
// stays open. A stalled link that comes back tells the client that the
// session expired, and Lost closes.
func testSessionDies(t *testing.T, env *env) {
	for _, tc := range []struct {
		name string
		cut  func(*testenv.Proxy)
		heal func(*testenv.Proxy) // nil: the link never comes back
	}{
		{"link stalled", (*testenv.Proxy).Stall, (*testenv.Proxy).Resume},
		{"link closed", (*testenv.Proxy).Close, nil},
	} {
		t.Run(tc.name, func(t *testing.T) {
			lock := "session-dies-" + strings.ReplaceAll(tc.name, " ", "-")
			const d = 2 * time.Second
			p := testenv.NewProxy(t, env.servers[0])
			lb := openStore(t, []string{p.Addr()})
			fb := openStore(t, env.servers)
			l := campaign(t, lb, lock, "leader", d)
			timeout := l.SessionTimeout()
			ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
			defer cancel()
			type result struct {
				l   lease
				err error
			}
			got := make(chan result, 1)
			go func() {
				l, err := campaignFor(ctx, fb, lock, candidate("follower", d))
				got <- result{l, err}
			}()
			waitFor(t, "the follower to queue", func() bool { return status(t, fb, lock).Waiting == 1 })
			tc.cut(p)
			cut := time.Now()
			rctx, rcancel := context.WithTimeout(ctx, 300*time.Millisecond)
			err := l.Renew(rctx)
			rcancel()
			if err == nil || errors.Is(err, backends.ErrLeaseLost) {
				t.Errorf("renew over a cut link = %v, want a transient error", err)
			}
			var r result
			select {
			case r = <-got:
			case <-time.After(timeout + 5*time.Second):
				t.Fatalf("the follower did not take over within %v of the cut", timeout+5*time.Second)
			}
			took := time.Since(cut)
			if r.err != nil {
				t.Fatalf("follower: %v", r.err)
			}
			defer r.l.Release(context.Background(), nil)
			t.Logf("session timeout %v; the follower took over %v after the leader's link was cut", timeout, took)
			if took > timeout+time.Second {
				t.Errorf("the follower took over %v after the cut, want within the session timeout %v + 1s", took, timeout)
			}
			// The last contact before the cut was a ping at most a third
			// of the timeout earlier, and TTL leaves that out.
			if took < l.TTL() {
				t.Errorf("the follower took over %v after the cut, before the lease's TTL %v", took, l.TTL())
			}
			if r.l.Token() <= l.Token() {
				t.Errorf("follower's token %d not greater than the leader's %d", r.l.Token(), l.Token())
			}
			select {
			case <-l.Lost():
				t.Errorf("the cut-off leader reported a loss it cannot have heard of: %v", l.Err())
			default:
			}
			if tc.heal == nil {
				return
			}
			tc.heal(p)
			healed := time.Now()
			select {
			case <-l.Lost():
				t.Logf("the old leader heard of its expiry %v after the link came back", time.Since(healed))
			case <-time.After(timeout + 2*time.Second):
				t.Fatal("the old leader did not report its expired session after the link came back")
			}
			if took := time.Since(healed); took > time.Second {
				t.Errorf("the expiry was reported %v after the link came back, want within 1s", took)
			}
			if err := l.Err(); !errors.Is(err, backends.ErrLeaseLost) || !strings.Contains(err.Error(), "expired") {
				t.Errorf("Err() = %v, want ErrLeaseLost saying the session expired", err)
			}
			if err := l.Renew(ctx); !errors.Is(err, backends.ErrLeaseLost) {
				t.Errorf("Renew after the expiry = %v, want ErrLeaseLost", err)
			}
		})
	}
}

// records keeps the messages a backend logs.
type records struct {
	mu   sync.Mutex
	msgs []string
}

func (r *records) Enabled(context.Context, slog.Level) bool { return true }
func (r *records) Handle(_ context.Context, rec slog.Record) error {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.msgs = append(r.msgs, rec.Message)
	return nil
}
func (r *records) WithAttrs([]slog.Attr) slog.Handler { return r }
func (r *records) WithGroup(string) slog.Handler      { return r }

func (r *records) has(sub string) bool {
	r.mu.Lock()
	defer r.mu.Unlock()
	return slices.ContainsFunc(r.msgs, func(m string) bool { return strings.Contains(m, sub) })
}

// testDisconnect: a connection that drops and comes back within the
// session timeout is no loss: renewals fail while it is down (the runner's
// deadline runs), the same session and znode carry on after, and the log
// says what happened.
func testDisconnect(t *testing.T, env *env) {
	const lock = "disconnect"
	p := testenv.NewProxy(t, env.servers[0])
	logs := &records{}
	b := openStore(t, []string{p.Addr()}, func(c *zookeeper.Config) { c.Log = slog.New(logs) })
	l := campaign(t, b, lock, "a", 6*time.Second)
	sid, token := l.SessionID(), l.Token()
	// Every connection is cut, and the client's reconnection hangs.
	p.Stall()
	p.Reset()
	ctx, cancel := context.WithTimeout(context.Background(), 500*time.Millisecond)
	err := l.Renew(ctx)
	cancel()
	if err == nil || errors.Is(err, backends.ErrLeaseLost) {
		t.Errorf("renew while disconnected = %v, want a transient error", err)
	}
	p.Resume()
	waitFor(t, "a renewal to go through again", func() bool {
		ctx, cancel := context.WithTimeout(context.Background(), 500*time.Millisecond)
		defer cancel()
		return l.Renew(ctx) == nil
	})
	select {
	case <-l.Lost():
		t.Fatalf("a short disconnection was reported as a loss: %v", l.Err())
	default:
	}
	if l.SessionID() != sid {
		t.Errorf("session 0x%x after the reconnection, want 0x%x", l.SessionID(), sid)
	}
	if st := status(t, b, lock); !st.Held || st.Token != token {
		t.Errorf("status after the reconnection: %+v; want held with token %d", st, token)
	}
	waitFor(t, "the reconnection to be logged", func() bool { return logs.has("reconnected") })
	if !logs.has("connection to zookeeper lost") {
		t.Errorf("no log line for the lost connection: %q", logs.msgs)
	}
}

// testHerd: with 200 candidates queued, a release wakes one waiter, not
// all of them: every candidate watches only the one just ahead of it.
// Counted twice: the wakes the waiters' store counts, and the watches the
// server holds (one per candidate znode, none on the lock's znode). The
// waiters share one store, each candidacy in a session of its own.
func testHerd(t *testing.T, env *env) {
	const (
		lock    = "herd"
		waiters = 200
		changes = 40
	)
	leader := openStore(t, env.servers)
	first := campaign(t, leader, lock, "first", 10*time.Second)
	ws := openStore(t, env.servers, func(c *zookeeper.Config) { c.ConnectTimeout = 30 * time.Second })
	won := make(chan lease, waiters)
	var wg sync.WaitGroup
	ctx, cancel := context.WithCancel(context.Background())
	defer func() {
		cancel()
		wg.Wait()
		close(won)
		for l := range won {
			l.Release(context.Background(), nil)
		}
	}()
	start := time.Now()
	for i := range waiters {
		wg.Go(func() {
			l, err := campaignFor(ctx, ws, lock, candidate(fmt.Sprintf("w%d", i), 10*time.Second))
			if err != nil {
				if ctx.Err() == nil {
					t.Errorf("w%d: %v", i, err)
				}
				return
			}
			won <- l
		})
	}
	// A read that times out while 200 sessions connect at once is asked
	// again: the test is of the queue, not of one read's latency.
	waitFor(t, "200 waiters to queue", func() bool {
		st, err := backends.ReadStatus(context.Background(), leader, lock)
		if err != nil {
			t.Logf("status of %s, asked again: %v", lock, err)
		}
		return err == nil && st.Waiting == waiters
	})
	t.Logf("%d waiters queued in %v", waiters, time.Since(start))
	// From the server's side: one watch per waiter, each on the
	// candidate ahead of it, plus the leader's on its own znode. A waiter
	// sets its watch a moment after its znode shows.
	var paths, total int
	for deadline := time.Now().Add(10 * time.Second); total < waiters+1 && time.Now().Before(deadline); {
		out, err := env.zk.Members[0].FourLetter("wchs")
		if err != nil {
			t.Fatal(err)
		}
		m := regexp.MustCompile(`watching (\d+) paths\s+Total watches:(\d+)`).FindStringSubmatch(out)
		if m == nil {
			t.Fatalf("wchs: %q", out)
		}
		paths, _ = strconv.Atoi(m[1])
		total, _ = strconv.Atoi(m[2])
		time.Sleep(10 * time.Millisecond)
	}
	t.Logf("server: %d watches on %d paths", total, paths)
	if paths != waiters || total != waiters+1 {
		t.Errorf("the server holds %d watches on %d paths, want %d on %d", total, paths, waiters+1, waiters)
	}
	var deltas []int
	held, last := first, ws.Wakes()
	for range changes {
		if err := held.Release(context.Background(), nil); err != nil {
			t.Fatal(err)
		}
		select {
		case held = <-won:
		case <-time.After(10 * time.Second):
			t.Fatal("no waiter took over within 10s of a release")
		}
		n := ws.Wakes()
		deltas = append(deltas, int(n-last))
		last = n
	}
	if err := held.Release(context.Background(), nil); err != nil {
		t.Error(err)
	}
	slices.Sort(deltas)
	t.Logf("waiters woken per change over %d changes: median %d, min %d, max %d", changes, deltas[len(deltas)/2], deltas[0], deltas[len(deltas)-1])
	if med := deltas[len(deltas)/2]; med != 1 {
		t.Errorf("median waiters woken per change = %d, want 1 (per change: %v)", med, deltas)
	}
	if deltas[len(deltas)-1] > 3 {
		t.Errorf("a change woke %d waiters", deltas[len(deltas)-1])
	}
}

// testAuth: with digest credentials the znodes belong to their owner (and
// are readable by all); a client without them, or with a wrong password,
// cannot delete the leader's znode nor campaign (a refusal, final, naming
// the servers and the path), but can see who holds the lock. The password
// shows nowhere.
func testAuth(t *testing.T, env *env) {
	const lock, password = "auth", "s3cret-pw"
	digest := zookeeper.Digest{User: "leaderrun", Password: password}
	withDigest := func(d zookeeper.Digest) func(*zookeeper.Config) {
		return func(c *zookeeper.Config) { c.Digest = d }
	}
	b := openStore(t, env.servers, withDigest(digest))
	l := campaign(t, b, lock, "owner", 10*time.Second)
	acl, _, err := env.admin.GetACL(l.Path())
	if err != nil {
		t.Fatal(err)
	}
	// ZooKeeper shows a digest's hash only to a client allowed to
	// administer the znode: user:x here.
	if len(acl) != 2 || acl[0].Scheme != "digest" || !strings.HasPrefix(acl[0].ID, digest.User+":") || acl[0].Perms != zk.PermAll ||
		acl[1] != zk.WorldACL(zk.PermRead)[0] {
		t.Errorf("ACL of the leader's znode: %v, want all for %s and read for anyone", acl, digest.User)
	}
	if err := env.admin.Delete(l.Path(), -1); !errors.Is(err, zk.ErrNoAuth) {
		t.Errorf("a client without the credentials deleted the leader's znode: %v", err)
	}
	anon := openStore(t, env.servers)
	if st := status(t, anon, lock); !st.Held || st.Identity != "owner" || st.Token != l.Token() {
		t.Errorf("status without credentials: %+v; want held by owner", st)
	}
	// A lock the owner created and left: free, and still the owner's.
	if err := campaign(t, b, lock+"-free", "owner", 10*time.Second).Release(context.Background(), nil); err != nil {
		t.Fatal(err)
	}
	wrong := withDigest(zookeeper.Digest{User: digest.User, Password: "wrong"})
	for _, tc := range []struct {
		name string
		s    *zookeeper.Store
		lock string
		try  bool
	}{
		{"no credentials, wait", anon, lock, false},
		{"no credentials, try", anon, lock + "-free", true},
		{"wrong password, wait", openStore(t, env.servers, wrong), lock, false},
		{"wrong password, try", openStore(t, env.servers, wrong), lock + "-free", true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
			defer cancel()
			c := candidate("intruder", 10*time.Second)
			c.Try = tc.try
			start := time.Now()
			ll, err := campaignFor(ctx, tc.s, tc.lock, c)
			if err == nil {
				ll.Release(context.Background(), nil)
				t.Fatal("campaign without the owner's credentials succeeded")
			}
			if !errors.Is(err, backends.ErrUnavailable) || !errors.Is(err, backends.ErrRefused) || !errors.Is(err, zk.ErrNoAuth) {
				t.Fatalf("campaign: %v, want ErrUnavailable and ErrRefused for a refusal", err)
			}
			if msg := err.Error(); !strings.Contains(msg, env.servers[0]) || !strings.Contains(msg, lockDir(tc.lock)) || !strings.Contains(msg, "refused") {
				t.Errorf("error %q does not name the servers, the lock's znode and the refusal", msg)
			}
			if d := time.Since(start); d > time.Second {
				t.Errorf("refusal took %v, want it at once", d)
			}
			t.Logf("%v", err)
		})
	}
	select {
	case <-l.Lost():
		t.Errorf("the owner lost the lock: %v", l.Err())
	default:
	}
	cfg := zookeeper.Config{Servers: env.servers, Digest: digest, Prefix: prefix}
	if s := fmt.Sprintf("%v %+v %#v %s", cfg, cfg, cfg, digest); strings.Contains(s, password) {
		t.Errorf("the password shows in %q", s)
	}
}

// testUnreachable: an ensemble that refuses connections, or accepts them
// and never answers, is ErrUnavailable naming the servers: for a try and
// a status within the connect timeout, for a campaign once its wait ran
// out (the driver retries meanwhile).
func testUnreachable(t *testing.T, env *env) {
	silent := testenv.NewProxy(t, env.servers[0])
	silent.Stall()
	for _, tc := range []struct {
		name, server string
	}{
		{"refused", fmt.Sprintf("127.0.0.1:%d", testenv.FreePort(t, "127.0.0.1"))},
		{"silent", silent.Addr()},
	} {
		t.Run(tc.name, func(t *testing.T) {
			b := openStore(t, []string{tc.server}, func(c *zookeeper.Config) { c.ConnectTimeout = time.Second })
			for _, op := range []struct {
				name  string
				bound time.Duration
				do    func(context.Context) error
			}{
				{"campaign", 4 * time.Second, func(ctx context.Context) error {
					c := candidate("a", 10*time.Second)
					c.Wait = 2500 * time.Millisecond
					_, err := campaignFor(ctx, b, "unreachable", c)
					return err
				}},
				{"try", 2 * time.Second, func(ctx context.Context) error {
					c := candidate("a", 10*time.Second)
					c.Try = true
					_, err := campaignFor(ctx, b, "unreachable", c)
					return err
				}},
				{"status", 2 * time.Second, func(ctx context.Context) error {
					_, err := backends.ReadStatus(ctx, b, "unreachable")
					return err
				}},
			} {
				ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
				start := time.Now()
				err := op.do(ctx)
				took := time.Since(start)
				cancel()
				if !errors.Is(err, backends.ErrUnavailable) || !strings.Contains(err.Error(), tc.server) {
					t.Errorf("%s: %v, want ErrUnavailable naming %s", op.name, err, tc.server)
				}
				if took > op.bound {
					t.Errorf("%s: gave up after %v, want it within %v", op.name, took, op.bound)
				}
				t.Logf("%s: %v after %v", op.name, err, took)
			}
		})
	}
}

// testSilentServer: a server that accepts connections and never answers
// does not keep the client from the one that does: each server gets its
// share of the connect timeout. The client picks servers at random, so a
// few campaigns meet the silent one first.
func testSilentServer(t *testing.T, env *env) {
	silent := testenv.NewProxy(t, env.servers[0])
	silent.Stall()
	servers := []string{silent.Addr(), env.servers[0]}
	var slow int
	for i := range 6 {
		b := openStore(t, servers, func(c *zookeeper.Config) { c.ConnectTimeout = 2 * time.Second })
		start := time.Now()
		l := campaign(t, b, "silent-server", fmt.Sprintf("a%d", i), 10*time.Second)
		took := time.Since(start)
		if l.Server() != env.servers[0] {
			t.Errorf("session on %s", l.Server())
		}
		if took > 900*time.Millisecond {
			slow++
		}
		if err := l.Release(context.Background(), nil); err != nil {
			t.Fatal(err)
		}
	}
	t.Logf("%d of 6 campaigns tried the silent server first", slow)
}

// testTryLeavesNoTrace: a try on a held lock answers at once and writes
// nothing.
func testTryLeavesNoTrace(t *testing.T, env *env) {
	const lock = "try-trace"
	a, b := openStore(t, env.servers), openStore(t, env.servers)
	campaign(t, a, lock, "holder", 10*time.Second)
	_, before, err := env.admin.Children(lockDir(lock))
	if err != nil {
		t.Fatal(err)
	}
	c := candidate("b", 10*time.Second)
	c.Try = true
	start := time.Now()
	_, err = campaignFor(context.Background(), b, lock, c)
	took := time.Since(start)
	if !errors.Is(err, backends.ErrLocked) {
		t.Fatalf("try on a held lock: %v, want ErrLocked", err)
	}
	t.Logf("try answered %v in %v", err, took)
	_, after, err := env.admin.Children(lockDir(lock))
	if err != nil {
		t.Fatal(err)
	}
	if after.Cversion != before.Cversion {
		t.Errorf("the lock's children changed %d times during a try", after.Cversion-before.Cversion)
	}
}

// testLostCreateAnswer: a create whose answer is lost with its connection
// may have created the znode. The candidate finds it by its guid instead
// of queueing twice; and if the create it retried leaves a second znode
// after all, the candidate deletes that one once it sees it.
func testLostCreateAnswer(t *testing.T, env *env) {
	t.Run("it landed", func(t *testing.T) {
		const lock = "lost-answer-landed"
		var landed string
		zookeeper.SetCreateHook(func(_ *zk.Conn, _, path string, err error) (string, error) {
			if err == nil && landed == "" {
				landed = path
				return "", zk.ErrConnectionClosed
			}
			return path, err
		})
		defer zookeeper.SetCreateHook(nil)
		l := campaign(t, openStore(t, env.servers), lock, "a", 10*time.Second)
		if l.Path() != landed {
			t.Errorf("lease on %s, want the znode whose answer was lost, %s", l.Path(), landed)
		}
		if names := candidateNames(t, env.admin, lock); len(names) != 1 {
			t.Errorf("candidates: %v, want one", names)
		}
	})
	t.Run("it landed late", func(t *testing.T) {
		const lock = "lost-answer-late"
		holder := campaign(t, openStore(t, env.servers), lock, "holder", 10*time.Second)
		var mu sync.Mutex
		var calls int
		var ghost string
		zookeeper.SetCreateHook(func(z *zk.Conn, prefix, path string, err error) (string, error) {
			mu.Lock()
			defer mu.Unlock()
			calls++
			switch calls {
			case 1: // it had not landed when the candidate looked
				if err := z.Delete(path, -1); err != nil {
					return "", err
				}
				return "", zk.ErrConnectionClosed
			case 2: // and lands right after the retry
				var gerr error
				ghost, gerr = z.Create(prefix, nil, zk.FlagEphemeralSequential, zk.WorldACL(zk.PermAll))
				if gerr != nil {
					return "", gerr
				}
			}
			return path, err
		})
		defer zookeeper.SetCreateHook(nil)
		b := openStore(t, env.servers)
		got := make(chan *lease, 1)
		go func() {
			l, err := campaignFor(context.Background(), b, lock, candidate("b", 10*time.Second))
			if err != nil {
				t.Errorf("campaign: %v", err)
				got <- nil
				return
			}
			got <- &l
		}()
		waitFor(t, "the waiter to delete its second znode", func() bool {
			mu.Lock()
			g := ghost
			mu.Unlock()
			names := candidateNames(t, env.admin, lock)
			return g != "" && len(names) == 2 && !slices.Contains(names, g[strings.LastIndex(g, "/")+1:])
		})
		holder.Release(context.Background(), nil)
		l := <-got
		if l == nil {
			return
		}
		defer l.Release(context.Background(), nil)
		mu.Lock()
		defer mu.Unlock()
		if l.Path() == ghost {
			t.Errorf("the lease is on the late znode %s", ghost)
		}
	})
}

// testSequenceWrapped: after 2^31 changes to a lock's children (about
// 10^9 candidacies), ZooKeeper names the next candidates with negative
// numbers, which would sort first. A candidate whose znode gets such a
// name gives up at once, waiting or not, with a refusal that says what to
// do (as a create that the hook renames shows), instead of taking the
// lock or queueing again in a loop, and leaves no znode behind.
func testSequenceWrapped(t *testing.T, env *env) {
	for _, try := range []bool{false, true} {
		t.Run(fmt.Sprintf("try=%v", try), func(t *testing.T) {
			lock := fmt.Sprintf("wrapped-%v", try)
			zookeeper.SetCreateHook(func(_ *zk.Conn, prefix, path string, err error) (string, error) {
				if err != nil {
					return path, err
				}
				return prefix + "-2147483648", nil
			})
			defer zookeeper.SetCreateHook(nil)
			b := openStore(t, env.servers)
			c := candidate("a", 10*time.Second)
			c.Try = try
			began := time.Now()
			_, err := campaignFor(context.Background(), b, lock, c)
			t.Logf("campaign: %v after %v", err, time.Since(began))
			if !errors.Is(err, backends.ErrRefused) || !strings.Contains(err.Error(), "wrapped") || !strings.Contains(err.Error(), "delete the lock's znode") {
				t.Errorf("campaign = %v, want a refusal saying the counter wrapped and what to do", err)
			}
			waitFor(t, "the candidate's session to end", func() bool { return len(candidateNames(t, env.admin, lock)) == 0 })
		})
	}
}

// testGhostAtRelease: a second znode of the leader's candidacy (a lost
// create landing after the candidate last looked) goes when the lease is
// released: it would lead next, with nobody behind it.
func testGhostAtRelease(t *testing.T, env *env) {
	const lock = "ghost-release"
	l := campaign(t, openStore(t, env.servers), lock, "a", 10*time.Second)
	if _, err := zookeeper.Ghost(l.g); err != nil {
		t.Fatal(err)
	}
	if names := candidateNames(t, env.admin, lock); len(names) != 2 {
		t.Fatalf("candidates %v, want the leader and its ghost", names)
	}
	if err := l.Release(context.Background(), nil); err != nil {
		t.Fatal(err)
	}
	if names := candidateNames(t, env.admin, lock); len(names) != 0 {
		t.Errorf("after the release, candidates %v remain", names)
	}
}

// testDocumentsAreNotCandidates: a lock whose documents remain is free,
// with no candidate waiting; and lock "a.history" is not lock "a"'s
// history.
func testDocumentsNotCandidates(t *testing.T, env *env) {
	a := openStore(t, env.servers)
	ctx := context.Background()
	la := campaign(t, a, "names", "a", 10*time.Second)
	now := time.Now()
	if err := la.Complete(ctx, backends.Marker{Key: "k", Identity: "a", Token: la.Token(), At: now, Expires: now.Add(time.Hour)}); err != nil {
		t.Fatal(err)
	}
	if err := la.Release(ctx, &backends.Term{Identity: "a", Token: la.Token(), Acquired: now, Ended: now, End: backends.EndExited}); err != nil {
		t.Fatal(err)
	}
	if names := children(t, env.admin, lockDir("names")); !slices.Equal(names, []string{"history", "markers"}) {
		t.Errorf("the lock's znode holds %v, want its two documents", names)
	}
	if st := status(t, a, "names"); st.Held || st.Waiting != 0 {
		t.Errorf("names, whose documents remain, shows %+v; want free with no waiter", st)
	}
	c := candidate("b", 10*time.Second)
	c.Try = true
	lb, err := campaignFor(ctx, a, "names", c)
	if err != nil {
		t.Fatalf("try on names: %v", err)
	}
	lb.Release(ctx, nil)
	if terms, err := backends.ReadHistory(ctx, a, "names.history", 0); err != nil || len(terms) != 0 {
		t.Errorf("names.history has history %+v, %v; want none", terms, err)
	}
	if terms, err := backends.ReadHistory(ctx, a, "names", 0); err != nil || len(terms) != 1 {
		t.Errorf("names has history %+v, %v; want one term", terms, err)
	}
}

// testDocuments: a document's write is conditional on the version read:
// one written meanwhile, or created, or deleted, is a conflict; and a
// document longer than backends.MaxDoc (written by hand) is refused when
// read.
func testDocuments(t *testing.T, env *env) {
	ctx := context.Background()
	lk := openStore(t, env.servers).Lock("documents")
	d, err := lk.ReadDoc(ctx, backends.DocHistory)
	if err != nil || d.Data != nil || d.Version != nil {
		t.Fatalf("a document never written: %+v, %v", d, err)
	}
	d.Data = []byte("[]")
	if err := lk.WriteDoc(ctx, d); err != nil {
		t.Fatalf("create: %v", err)
	}
	if err := lk.WriteDoc(ctx, d); !errors.Is(err, backends.ErrConflict) {
		t.Errorf("a second create: %v, want ErrConflict", err)
	}
	d, err = lk.ReadDoc(ctx, backends.DocHistory)
	if err != nil || string(d.Data) != "[]" {
		t.Fatalf("read back: %+v, %v", d, err)
	}
	if err := lk.WriteDoc(ctx, d); err != nil {
		t.Fatalf("write at the version read: %v", err)
	}
	if err := lk.WriteDoc(ctx, d); !errors.Is(err, backends.ErrConflict) {
		t.Errorf("write at a version that moved: %v, want ErrConflict", err)
	}
	if err := env.admin.Delete(lockDir("documents")+"/history", -1); err != nil {
		t.Fatal(err)
	}
	if err := lk.WriteDoc(ctx, d); !errors.Is(err, backends.ErrConflict) {
		t.Errorf("write of a document deleted since: %v, want ErrConflict", err)
	}
	if _, err := env.admin.Create(lockDir("documents")+"/markers", make([]byte, backends.MaxDoc+1), 0, zk.WorldACL(zk.PermAll)); err != nil {
		t.Fatal(err)
	}
	if d, err := lk.ReadDoc(ctx, backends.DocMarkers); !errors.Is(err, backends.ErrRefused) {
		t.Errorf("a document of %d bytes: %d bytes, %v; want a refusal", backends.MaxDoc+1, len(d.Data), err)
	}
}

// testOlderRelease: the lock as an older release leaves it, and shares it.
// Its candidates are named as ours, so each release queues behind the
// other's; its history (history/term-<seq>) and markers (done/<key>) are
// children that the documents do not read, and that do not disturb them.
func testOlderRelease(t *testing.T, env *env) {
	const lock = "older-release"
	ctx := context.Background()
	dir := lockDir(lock)
	open := zk.WorldACL(zk.PermAll)
	for _, p := range []string{"/" + strings.TrimSuffix(prefix, "/"), dir, dir + "/history", dir + "/done"} {
		if _, err := env.admin.Create(p, nil, 0, open); err != nil && !errors.Is(err, zk.ErrNodeExists) {
			t.Fatal(err)
		}
	}
	if _, err := env.admin.Create(dir+"/history/term-", []byte(`{"identity":"old","token":1,"end":"exited"}`), zk.FlagSequence, open); err != nil {
		t.Fatal(err)
	}
	if _, err := env.admin.Create(dir+"/done/k", []byte(`{"key":"k","identity":"old","token":1}`), 0, open); err != nil {
		t.Fatal(err)
	}
	// A candidate of the older release, on the admin client's session.
	old, err := env.admin.Create(dir+"/_c_0123abcd-0123-4567-89ab-0123456789ab-latch-", []byte("old-host:1"), zk.FlagEphemeralSequential, open)
	if err != nil {
		t.Fatal(err)
	}
	_, oldStat, err := env.admin.Get(old)
	if err != nil {
		t.Fatal(err)
	}
	s := openStore(t, env.servers)
	if st := status(t, s, lock); !st.Held || st.Identity != "old-host:1" || st.Token != uint64(oldStat.Czxid) {
		t.Errorf("status of a lock an older release holds: %+v", st)
	}
	c := candidate("new", 10*time.Second)
	c.Try = true
	if _, err := campaignFor(ctx, s, lock, c); !errors.Is(err, backends.ErrLocked) {
		t.Fatalf("try on a lock an older release holds: %v, want ErrLocked", err)
	}
	if err := env.admin.Delete(old, -1); err != nil {
		t.Fatal(err)
	}
	l := campaign(t, s, lock, "new", 10*time.Second)
	if l.Token() <= uint64(oldStat.Czxid) {
		t.Errorf("token %d after the older release's %d", l.Token(), oldStat.Czxid)
	}
	if m, err := l.Completed(ctx, "k", true); err != nil || m != nil {
		t.Errorf("the older release's marker: %+v, %v; want none seen", m, err)
	}
	now := time.Now()
	if err := l.Release(ctx, &backends.Term{Identity: "new", Token: l.Token(), Acquired: now, Ended: now, End: backends.EndExited}); err != nil {
		t.Fatal(err)
	}
	if terms, err := backends.ReadHistory(ctx, s, lock, 0); err != nil || len(terms) != 1 || terms[0].Identity != "new" {
		t.Errorf("history: %+v, %v; want this release's one term", terms, err)
	}
	if names := children(t, env.admin, dir+"/history"); len(names) != 1 {
		t.Errorf("the older release's terms: %v, want them left as they were", names)
	}
}

// testRates measures the requests a leader (renewing every 2 s) and an
// idle waiter send at the default timings (15 s session), as the server
// counts them. It takes 30 s: set LEADERRUN_ZK_RATES=1 to run it.
func testRates(t *testing.T, env *env) {
	if os.Getenv("LEADERRUN_ZK_RATES") == "" {
		t.Skip("takes 30s; set LEADERRUN_ZK_RATES=1")
	}
	const (
		lock   = "rates"
		d      = 15 * time.Second
		retry  = 2 * time.Second
		window = 30 * time.Second
	)
	lb, fb := openStore(t, env.servers), openStore(t, env.servers)
	l := campaign(t, lb, lock, "leader", d)
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	go campaignFor(ctx, fb, lock, candidate("follower", d))
	waitFor(t, "the follower to queue", func() bool { return status(t, lb, lock).Waiting == 1 })
	var follower string
	for _, name := range candidateNames(t, env.admin, lock) {
		_, stat, err := env.admin.Get(lockDir(lock) + "/" + name)
		if err == nil && stat.EphemeralOwner != l.SessionID() {
			follower = fmt.Sprintf("0x%x", stat.EphemeralOwner)
		}
	}
	recved := func() map[string]int {
		out, err := env.zk.Members[0].FourLetter("cons")
		if err != nil {
			t.Fatal(err)
		}
		counts := map[string]int{}
		for _, m := range regexp.MustCompile(`recved=(\d+),sent=\d+,sid=(0x[0-9a-f]+)`).FindAllStringSubmatch(out, -1) {
			n, _ := strconv.Atoi(m[1])
			counts[m[2]] = n
		}
		return counts
	}
	sid := fmt.Sprintf("0x%x", l.SessionID())
	before := recved()
	start := time.Now()
	tick := time.NewTicker(retry)
	for time.Since(start) < window {
		<-tick.C
		if err := l.Renew(ctx); err != nil {
			t.Fatal(err)
		}
	}
	tick.Stop()
	after, secs := recved(), time.Since(start).Seconds()
	for s, n := range after {
		rate := float64(n-before[s]) / secs
		switch {
		case s == sid:
			t.Logf("leader (session %s): %.2f requests/s", s, rate)
			if rate > 1.5 {
				t.Errorf("leader sends %.2f requests/s, want about 1.2 (a sync and a read per renewal, a ping per 5 s)", rate)
			}
		case s == follower:
			t.Logf("waiting follower (session %s): %.2f requests/s", s, rate)
			if rate > 0.3 {
				t.Errorf("an idle follower sends %.2f requests/s, want about 0.2 (a ping per 5 s)", rate)
			}
		}
	}
}

// testReaderIdle: the session that status and documents read with is
// closed once unused for a while, and opened again when needed: a leader
// holds no connection but its own session's between its grant and its
// release.
func testReaderIdle(t *testing.T, env *env) {
	conns := func() int {
		out, err := env.zk.Members[0].FourLetter("cons")
		if err != nil {
			t.Fatal(err)
		}
		return strings.Count(out, "sid=")
	}
	before := conns()
	s := openStore(t, env.servers)
	status(t, s, "reader-idle")
	if n := conns(); n != before+1 {
		t.Fatalf("%d connections after a status, want %d", n, before+1)
	}
	start := time.Now()
	waitFor(t, "the reader to close", func() bool { return conns() == before })
	t.Logf("the reader closed %v after its last read", time.Since(start))
	if st := status(t, s, "reader-idle"); st.Held {
		t.Errorf("status through a new reader: %+v", st)
	}
}
