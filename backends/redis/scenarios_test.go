package redis_test

import (
	"context"
	"errors"
	"fmt"
	"net"
	"runtime"
	"slices"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	goredis "github.com/redis/go-redis/v9"

	"github.com/leaderrun/leaderrun/backends"
	"github.com/leaderrun/leaderrun/backends/redis"
	"github.com/leaderrun/leaderrun/internal/testenv"
)

// testTokensAcrossDeletes: 1,000 grants in a row, the lock's key deleted
// by hand (DEL, as an operator clearing a "stuck" lock would) while each
// is held: every token is greater than the one before. The deleted
// lease reports its loss; the next grant comes from the counter, which
// leaderrun never deletes.
func testTokensAcrossDeletes(t *testing.T, e *env) {
	const grants = 1000
	b := newBackend(t, e, "deleted-by-hand", redis.Config{})
	ctx := context.Background()
	var prev uint64
	for i := range grants {
		l := campaign(t, b, "a", 10*time.Second)
		if l.Token() <= prev {
			t.Fatalf("grant %d: token %d, not greater than the previous %d", i, l.Token(), prev)
		}
		prev = l.Token()
		if n, err := e.admin.Del(ctx, l.Key()).Result(); err != nil || n != 1 {
			t.Fatalf("grant %d: DEL %s: %d, %v", i, l.Key(), n, err)
		}
		if err := l.Renew(ctx); !errors.Is(err, backends.ErrLeaseLost) {
			t.Fatalf("grant %d: renew after DEL: %v, want ErrLeaseLost", i, err)
		}
		if err := l.Release(ctx, nil); err != nil {
			t.Fatalf("grant %d: release: %v", i, err)
		}
	}
	t.Logf("%d grants, the key deleted by hand during each: tokens strictly increasing up to %d", grants, prev)
}

// testCounterDeletedByHand: deleting the token counter itself is what an
// operator must not do; if it happens while the history holds the last
// term, the next grant goes on from it instead of from 1.
func testCounterDeletedByHand(t *testing.T, e *env) {
	b := newBackend(t, e, "counter-deleted", redis.Config{})
	ctx := context.Background()
	var last uint64
	for range 5 {
		l := campaign(t, b, "a", 10*time.Second)
		now := time.Now()
		if err := l.Release(ctx, &backends.Term{Identity: "a", Token: l.Token(), Acquired: now, Ended: now,
			End: backends.EndExited}); err != nil {
			t.Fatal(err)
		}
		last = l.Token()
	}
	if err := e.admin.Del(ctx, prefix+"counter-deleted:token").Err(); err != nil {
		t.Fatal(err)
	}
	l := campaign(t, b, "a", 10*time.Second)
	if l.Token() != last+1 {
		t.Errorf("after the counter was deleted: token %d, want %d (the newest term's + 1)", l.Token(), last+1)
	}
}

// testLossByHand: the key given another value (as another holder would
// have it) or a value leaderrun did not write is a loss within 1 s, and
// says which; Renew and Complete then report ErrLeaseLost, and a release
// leaves the other value alone.
func testLossByHand(t *testing.T, e *env) {
	for _, tc := range []struct {
		name, value, want string
	}{
		{"another holder", `{"identity":"intruder","nonce":"00","token":999999,"lease_ms":10000}`, `held by "intruder" with token 999999`},
		{"not leaderruns", "locked-by-cron", "did not write"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			lock := "loss-" + strings.ReplaceAll(tc.name, " ", "-")
			b := newBackend(t, e, lock, redis.Config{})
			l := campaign(t, b, "a", 10*time.Second)
			ctx := context.Background()
			if err := e.admin.Set(ctx, l.Key(), tc.value, 10*time.Second).Err(); err != nil {
				t.Fatal(err)
			}
			set := time.Now()
			select {
			case <-l.Lost():
				t.Logf("loss reported %v after the SET", time.Since(set).Round(time.Millisecond))
			case <-time.After(time.Second):
				t.Fatal("Lost() not closed within 1s of the key's change")
			}
			if err := l.Err(); !errors.Is(err, backends.ErrLeaseLost) || !strings.Contains(err.Error(), tc.want) {
				t.Errorf("Err() = %v, want ErrLeaseLost saying %q", err, tc.want)
			}
			if err := l.Renew(ctx); !errors.Is(err, backends.ErrLeaseLost) {
				t.Errorf("Renew = %v, want ErrLeaseLost", err)
			}
			now := time.Now()
			if err := l.Complete(ctx, backends.Marker{Key: "k", Identity: "a", Token: l.Token(), At: now, Expires: now.Add(time.Hour)}); !errors.Is(err, backends.ErrLeaseLost) {
				t.Errorf("Complete = %v, want ErrLeaseLost", err)
			}
			if err := l.Release(ctx, nil); err != nil {
				t.Errorf("release: %v", err)
			}
			if v, err := e.admin.Get(ctx, l.Key()).Result(); err != nil || v != tc.value {
				t.Errorf("after the release the key holds %q (%v), want the other value left alone", v, err)
			}
		})
	}
}

// testLossSeenAtOnce (S3's aim): once the lease's tracker proved that
// Redis announces changes of its key, a DEL or a SET of the key by hand
// is seen within 100 ms, not at the next poll.
func testLossSeenAtOnce(t *testing.T, e *env) {
	ctx := context.Background()
	var took []time.Duration
	for i := range 5 {
		b := newBackend(t, e, fmt.Sprintf("at-once-%d", i), redis.Config{})
		l := campaign(t, b, "a", 10*time.Second)
		tr := l.(interface{ Tracking() bool })
		waitFor(t, "the lease to track its key", tr.Tracking)
		changed := time.Now()
		var err error
		if i%2 == 0 {
			err = e.admin.Del(ctx, l.Key()).Err()
		} else {
			err = e.admin.Set(ctx, l.Key(), "taken", 0).Err()
		}
		if err != nil {
			t.Fatal(err)
		}
		select {
		case <-l.Lost():
			took = append(took, time.Since(changed))
		case <-time.After(time.Second):
			t.Fatal("loss not seen within 1s")
		}
	}
	slices.Sort(took)
	t.Logf("loss seen %v (median of 5), %v at most", took[2].Round(time.Microsecond), took[4].Round(time.Microsecond))
	if took[4] > 100*time.Millisecond {
		t.Errorf("a loss took %v to be seen with tracking, want under 100ms", took[4])
	}
}

// testRenewChecksValue: a renewal that finds the key gone is a loss even
// before the watcher saw it (S3 through Renew), and a renewal extends
// the lease by the server's clock.
func testRenewChecksValue(t *testing.T, e *env) {
	b := newBackend(t, e, "renew", redis.Config{})
	l := campaign(t, b, "a", 3*time.Second)
	ctx := context.Background()
	if l.TTL() != 3*time.Second {
		t.Errorf("TTL %v, want 3s", l.TTL())
	}
	waitFor(t, "the lease to run down a little", func() bool {
		ms, _ := e.admin.PTTL(ctx, l.Key()).Result()
		return ms < 2800*time.Millisecond
	})
	if err := l.Renew(ctx); err != nil {
		t.Fatal(err)
	}
	if ms, _ := e.admin.PTTL(ctx, l.Key()).Result(); ms < 2900*time.Millisecond {
		t.Errorf("PTTL after a renewal %v, want about 3s", ms)
	}
	e.admin.Del(ctx, l.Key())
	if err := l.Renew(ctx); !errors.Is(err, backends.ErrLeaseLost) || !strings.Contains(err.Error(), "is gone") {
		t.Errorf("renewal of a deleted key: %v, want ErrLeaseLost saying it is gone", err)
	}
}

// testStatus: a free lock; then the holder's identity, token, lease and
// what is left of it by the server's clock, and the live waiters.
func testStatus(t *testing.T, e *env) {
	b := newBackend(t, e, "status", redis.Config{RetryPeriod: 200 * time.Millisecond})
	ctx := context.Background()
	st, err := b.Status(ctx)
	if err != nil || st.Held || st.Waiting != 0 || st.Key != prefix+"status" {
		t.Fatalf("status of a free lock: %+v, %v", st, err)
	}
	l := campaign(t, b, "holder-1", 4*time.Second)
	w := newBackend(t, e, "status", redis.Config{RetryPeriod: 200 * time.Millisecond})
	wctx, cancel := context.WithCancel(ctx)
	done := make(chan struct{})
	go func() {
		defer close(done)
		if l, err := w.Campaign(wctx, options("waiter", 4*time.Second)); err == nil {
			l.Release(context.Background(), nil)
		}
	}()
	waitFor(t, "the waiter to queue", func() bool {
		st, err := b.Status(ctx)
		return err == nil && st.Waiting == 1
	})
	st, err = b.Status(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if !st.Held || st.Identity != "holder-1" || st.Token != l.Token() || st.TTL != 4*time.Second ||
		st.Remaining <= 0 || st.Remaining > 4*time.Second || st.Waiting != 1 {
		t.Errorf("status = %+v, want holder-1, token %d, TTL 4s, 0 < remaining <= 4s, 1 waiting", st, l.Token())
	}
	cancel()
	<-done
	waitFor(t, "the withdrawn waiter to leave the queue", func() bool {
		st, err := b.Status(ctx)
		return err == nil && st.Waiting == 0
	})
}

// testTryLeavesNoTrace: --try on a held lock is ErrLocked at once and
// joins no queue; on a free lock with a waiter first in line, it is
// ErrLocked too: the waiter's turn.
func testTryLeavesNoTrace(t *testing.T, e *env) {
	const lock = "try-trace"
	a, b := newBackend(t, e, lock, redis.Config{}), newBackend(t, e, lock, redis.Config{})
	la := campaign(t, a, "a", 10*time.Second)
	ctx := context.Background()
	try := options("b", 10*time.Second)
	try.Try = true
	start := time.Now()
	if _, err := b.Campaign(ctx, try); !errors.Is(err, backends.ErrLocked) || !strings.Contains(err.Error(), `held by "a"`) {
		t.Fatalf("try on a held lock: %v", err)
	}
	t.Logf("try on a held lock answered in %v", time.Since(start).Round(time.Microsecond))
	if n, _ := e.admin.Exists(ctx, prefix+":waiters:"+lock, prefix+":alive:"+lock).Result(); n != 0 {
		t.Errorf("a --try left %d queue keys behind", n)
	}
	// A queue entry of a live waiter that has not taken the free lock yet.
	ms := time.Now().Add(time.Minute).UnixMilli()
	e.admin.ZAdd(ctx, prefix+":waiters:"+lock, goredis.Z{Score: 1, Member: "ffff"})
	e.admin.ZAdd(ctx, prefix+":alive:"+lock, goredis.Z{Score: float64(ms), Member: "ffff"})
	if err := la.Release(ctx, nil); err != nil {
		t.Fatal(err)
	}
	if _, err := b.Campaign(ctx, try); !errors.Is(err, backends.ErrLocked) || !strings.Contains(err.Error(), "1 candidates wait") {
		t.Errorf("try on a free lock with a waiter first: %v, want ErrLocked", err)
	}
	e.admin.Del(ctx, prefix+":waiters:"+lock, prefix+":alive:"+lock)
	lb, err := b.Campaign(ctx, try)
	if err != nil {
		t.Fatalf("try on a free lock: %v", err)
	}
	lb.Release(ctx, nil)
}

// testDeadWaiterLeavesQueue: a waiter that died while first in the queue
// (here: an entry whose liveness deadline runs out, as a killed waiter's
// does) holds the queue up only until its deadline.
func testDeadWaiterLeavesQueue(t *testing.T, e *env) {
	const lock = "dead-waiter"
	const retry = 200 * time.Millisecond
	a := newBackend(t, e, lock, redis.Config{RetryPeriod: retry})
	la := campaign(t, a, "a", 10*time.Second)
	ctx := context.Background()
	deadline := time.Now().Add(time.Second)
	e.admin.ZAdd(ctx, prefix+":waiters:"+lock, goredis.Z{Score: 1, Member: "dead"})
	e.admin.ZAdd(ctx, prefix+":alive:"+lock, goredis.Z{Score: float64(deadline.UnixMilli()), Member: "dead"})
	b := newBackend(t, e, lock, redis.Config{RetryPeriod: retry})
	got := make(chan backends.Lease, 1)
	go func() {
		l, err := b.Campaign(ctx, options("b", 10*time.Second))
		if err != nil {
			t.Error(err)
		}
		got <- l
	}()
	waitFor(t, "b to queue behind the dead waiter", func() bool {
		n, _ := e.admin.ZCard(ctx, prefix+":waiters:"+lock).Result()
		return n == 2
	})
	if err := la.Release(ctx, nil); err != nil {
		t.Fatal(err)
	}
	select {
	case l := <-got:
		if l == nil {
			return
		}
		took := time.Since(deadline)
		t.Logf("b took the lock %v after the dead waiter's deadline", took.Round(time.Millisecond))
		if took < 0 || took > retry+200*time.Millisecond {
			t.Errorf("b took the lock %v after the dead waiter's deadline, want within a retry period (%v)", took, retry)
		}
		l.Release(ctx, nil)
	case <-time.After(10 * time.Second):
		t.Fatal("b never got the lock")
	}
}

// testHerd: 100 waiters on one lock, 30 changes of leader: each release
// wakes the first waiter alone, so one attempt (the winner's) is made per
// change. The waiters' heartbeats are a minute apart here, so that any
// other attempt is one a release caused.
func testHerd(t *testing.T, e *env) {
	const (
		lock    = "herd"
		waiters = 100
		changes = 30
		retry   = time.Minute
	)
	cfg := redis.Config{RetryPeriod: retry}
	first := campaign(t, newBackend(t, e, lock, cfg), "first", 10*time.Second)
	bs := make([]*redis.Backend, waiters)
	won := make(chan backends.Lease, waiters)
	ctx, cancel := context.WithCancel(context.Background())
	var wg sync.WaitGroup
	defer func() {
		cancel()
		wg.Wait()
		close(won)
		for l := range won {
			l.Release(context.Background(), nil)
		}
	}()
	for i := range bs {
		bs[i] = newBackend(t, e, lock, cfg)
		wg.Go(func() {
			l, err := bs[i].Campaign(ctx, options(fmt.Sprintf("w%d", i), 10*time.Second))
			if err != nil {
				if ctx.Err() == nil {
					t.Errorf("w%d: %v", i, err)
				}
				return
			}
			won <- l
		})
	}
	waitFor(t, "100 waiters to queue", func() bool {
		st, err := bs[0].Status(ctx)
		return err == nil && st.Waiting == waiters
	})
	attempts := func() uint64 {
		var n uint64
		for _, b := range bs {
			n += b.Attempts()
		}
		return n
	}
	// Every waiter has subscribed and tried once more after it: settle.
	waitFor(t, "every waiter to have tried twice", func() bool { return attempts() == 2*waiters })
	var acted []int
	var handovers []time.Duration
	held := backends.Lease(first)
	for range changes {
		before := attempts()
		released := time.Now()
		if err := held.Release(context.Background(), nil); err != nil {
			t.Fatal(err)
		}
		select {
		case held = <-won:
			handovers = append(handovers, time.Since(released))
		case <-time.After(10 * time.Second):
			t.Fatal("no waiter took the lock within 10s of a release")
		}
		acted = append(acted, int(attempts()-before))
	}
	held.Release(context.Background(), nil)
	slices.Sort(acted)
	slices.Sort(handovers)
	t.Logf("%d waiters, %d changes: attempts per change median %d, max %d; handover median %v, max %v",
		waiters, changes, acted[len(acted)/2], acted[len(acted)-1], handovers[len(handovers)/2], handovers[len(handovers)-1])
	if acted[len(acted)-1] > 2 {
		t.Errorf("a release made %d waiters act, want 1 (at most 2)", acted[len(acted)-1])
	}
}

// testUnreachable: nothing listens at the address: Campaign (waiting or
// --try) and Status fail at once with ErrUnavailable naming the address.
func testUnreachable(t *testing.T, e *env) {
	addr := net.JoinHostPort("127.0.0.1", strconv.Itoa(testenv.FreePort(t, "127.0.0.1")))
	b := newBackend(t, e, "nowhere", redis.Config{URL: "redis://:" + password + "@" + addr})
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	for _, try := range []bool{false, true} {
		o := options("a", 10*time.Second)
		o.Try = try
		start := time.Now()
		_, err := b.Campaign(ctx, o)
		if !errors.Is(err, backends.ErrUnavailable) || !strings.Contains(err.Error(), addr) || strings.Contains(err.Error(), password) {
			t.Errorf("try=%v: %v, want ErrUnavailable naming %s and not the password", try, err, addr)
		}
		if d := time.Since(start); d > 2*time.Second {
			t.Errorf("try=%v: took %v to fail", try, d)
		}
	}
	if _, err := b.Status(ctx); !errors.Is(err, backends.ErrUnavailable) {
		t.Errorf("status: %v", err)
	}
}

// testRefused: a wrong password, or none, is refused at once, and no
// message shows the password.
func testRefused(t *testing.T, e *env) {
	for _, tc := range []struct {
		name string
		cfg  redis.Config
		want string
	}{
		{"wrong password", redis.Config{URL: "redis://:wrong-" + password + "@" + e.r.Addr()}, "WRONGPASS"},
		{"no password", redis.Config{URL: "redis://" + e.r.Addr()}, "NOAUTH"},
		{"wrong user", redis.Config{URL: "redis://nobody:" + password + "@" + e.r.Addr()}, "WRONGPASS"},
		{"TLS, unknown CA", redis.Config{URL: "rediss://:" + password + "@" + e.r.TLSAddr()}, "certificate"},
		// The server takes the TLS hello for the start of a command and
		// waits for its end: the handshake times out.
		{"TLS to the plain port", redis.Config{URL: "rediss://:" + password + "@" + e.r.Addr() + "?dial_timeout=1s",
			TLS: &redis.TLSFiles{CA: e.r.CAFile()}}, "TLS handshake"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			b := newBackend(t, e, "refused", tc.cfg)
			ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
			defer cancel()
			_, err := b.Campaign(ctx, options("a", 10*time.Second))
			if !errors.Is(err, backends.ErrUnavailable) || !strings.Contains(err.Error(), tc.want) {
				t.Errorf("campaign: %v, want ErrUnavailable saying %s", err, tc.want)
			}
			if err != nil && strings.Contains(err.Error(), password) {
				t.Errorf("the error shows the password: %v", err)
			}
		})
	}
}

// testStalledLink: a leader whose link stalls cannot renew (an error,
// not a loss: the runner's deadline decides), and renews again once the
// link is back; its lock was never taken meanwhile.
func testStalledLink(t *testing.T, e *env) {
	p := testenv.NewProxy(t, e.r.Addr())
	b := newBackend(t, e, "stalled", redis.Config{URL: "redis://:" + password + "@" + p.Addr()})
	l := campaign(t, b, "a", 10*time.Second)
	p.Stall()
	ctx, cancel := context.WithTimeout(context.Background(), 500*time.Millisecond)
	err := l.Renew(ctx)
	cancel()
	if err == nil || errors.Is(err, backends.ErrLeaseLost) {
		t.Errorf("renewal over a stalled link: %v, want an error that is not a loss", err)
	}
	p.Resume()
	p.Reset() // what the stall left on the connection is stale
	ctx, cancel = context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	if err := l.Renew(ctx); err != nil {
		t.Errorf("renewal after the link came back: %v", err)
	}
	if err := l.Err(); err != nil {
		t.Errorf("the lease reports %v", err)
	}
}

// testHostileServer: a "server" that answers every request with a
// string of 8 GB, an array of 10^12 elements, or an endless line gets an
// error, and the process does not allocate what it announced.
func testHostileServer(t *testing.T, e *env) {
	for _, tc := range []struct{ name, reply string }{
		{"huge string", "$8000000000\r\n"},
		{"huge array", "*1000000000000\r\n"},
		{"endless line", "+" + strings.Repeat("x", 1<<20)},
		{"deep arrays", strings.Repeat("*1\r\n", 100)},
		{"huge map", "%600000\r\n"},
		{"streamed string", "$?\r\n"},
		{"not RESP", "HTTP/1.1 400 Bad Request\r\n"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			ln, err := net.Listen("tcp", "127.0.0.1:0")
			if err != nil {
				t.Fatal(err)
			}
			defer ln.Close()
			go func() {
				for {
					c, err := ln.Accept()
					if err != nil {
						return
					}
					go func() {
						defer c.Close()
						buf := make([]byte, 4096)
						if _, err := c.Read(buf); err != nil {
							return
						}
						c.Write([]byte(tc.reply))
						c.Read(buf) // until the client gives up
					}()
				}
			}()
			b := newBackend(t, e, "hostile", redis.Config{URL: "redis://" + ln.Addr().String()})
			var before, after runtime.MemStats
			runtime.GC()
			runtime.ReadMemStats(&before)
			ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
			defer cancel()
			_, err = b.Campaign(ctx, options("a", 10*time.Second))
			runtime.ReadMemStats(&after)
			if !errors.Is(err, backends.ErrUnavailable) {
				t.Errorf("campaign against a hostile server: %v, want ErrUnavailable", err)
			}
			if grew := after.TotalAlloc - before.TotalAlloc; grew > 64<<20 {
				t.Errorf("allocated %d MiB talking to the hostile server", grew>>20)
			}
			t.Logf("error: %v", err)
		})
	}
}

// aclRules is the smallest ACL of a leaderrun user on prefix: the
// commands it sends (HELLO carries the client's name), the commands its
// scripts run (Redis checks those too), its keys and its channels.
// docs/backends/redis.md prints the same rules.
func aclRules(prefix string) []any {
	rules := []any{"reset", "on", ">" + password, "~" + prefix + "*", "&" + prefix + "*", "&__redis__:invalidate",
		"+hello", "+client|setname", "+client|id", "+client|tracking", "+ping"}
	for _, c := range []string{"eval", "evalsha", "get", "zrevrange", "subscribe", "wait", "info",
		"set", "incr", "pexpire", "pexpireat", "pttl", "del", "zadd", "zrem", "zrange", "zscore", "zrank", "zcount",
		"zremrangebyrank", "publish", "time"} {
		rules = append(rules, "+"+c)
	}
	return rules
}

// testACL: a user with the rules of aclRules on the prefix runs the whole
// suite's operations; the same user on another prefix is refused at once
// (NOPERM), and so is one without the scripts' commands.
func testACL(t *testing.T, e *env) {
	ctx := context.Background()
	for user, rules := range map[string][]any{
		"lr-ok":         aclRules(prefix),
		"lr-other":      aclRules("elsewhere/"),
		"lr-noincr":     append(aclRules(prefix), "-incr"),
		"lr-notracking": append(aclRules(prefix), "-client|tracking"),
	} {
		if err := e.admin.Do(ctx, append([]any{"ACL", "SETUSER", user}, rules...)...).Err(); err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { e.admin.Do(context.Background(), "ACL", "DELUSER", user) })
	}
	as := func(user string) redis.Config {
		return redis.Config{URL: "redis://" + user + ":" + password + "@" + e.r.Addr(), RetryPeriod: 200 * time.Millisecond}
	}
	b := newBackend(t, e, "acl", as("lr-ok"))
	w := newBackend(t, e, "acl", as("lr-ok"))
	l := campaign(t, b, "a", 10*time.Second)
	got := make(chan backends.Lease, 1)
	go func() {
		lw, err := w.Campaign(ctx, options("w", 10*time.Second))
		if err != nil {
			t.Error(err)
		}
		got <- lw
	}()
	waitFor(t, "the waiter to queue", func() bool { st, err := b.Status(ctx); return err == nil && st.Waiting == 1 })
	now := time.Now()
	if err := l.Complete(ctx, backends.Marker{Key: "k", Identity: "a", Token: l.Token(), At: now, Expires: now.Add(time.Hour)}); err != nil {
		t.Errorf("complete: %v", err)
	}
	if err := l.Renew(ctx); err != nil {
		t.Errorf("renew: %v", err)
	}
	if err := l.Release(ctx, &backends.Term{Identity: "a", Token: l.Token(), Acquired: now, Ended: now, End: backends.EndExited}); err != nil {
		t.Errorf("release: %v", err)
	}
	select {
	case lw := <-got:
		if lw != nil {
			if m, err := b.Completed(ctx, "k"); err != nil || m == nil {
				t.Errorf("completed: %+v, %v", m, err)
			}
			lw.Release(ctx, nil)
		}
	case <-time.After(10 * time.Second):
		t.Fatal("the waiter was not granted the lock")
	}
	if h, err := b.History(ctx, 0); err != nil || len(h) != 1 {
		t.Errorf("history: %+v, %v", h, err)
	}
	// Without CLIENT TRACKING, the tracker's probes go unanswered, it
	// says so, and the lease polls its key: a loss is still seen within
	// 1 s.
	var log logBuffer
	cfg := as("lr-notracking")
	cfg.Log = log.logger()
	n := newBackend(t, e, "acl-poll", cfg)
	ln := campaign(t, n, "a", 10*time.Second)
	waitFor(t, "the tracker to give up", func() bool { return strings.Contains(log.String(), "polling the lock's key") })
	if ln.(interface{ Tracking() bool }).Tracking() {
		t.Errorf("the lease says it tracks its key without CLIENT TRACKING")
	}
	e.admin.Del(ctx, ln.Key())
	deleted := time.Now()
	select {
	case <-ln.Lost():
		t.Logf("without CLIENT TRACKING: loss seen %v after the DEL", time.Since(deleted).Round(time.Millisecond))
	case <-time.After(time.Second):
		t.Errorf("without CLIENT TRACKING, the loss was not seen within 1s")
	}
	// A command inside a script that the user may not run is refused
	// as the script's error, not NOPERM.
	for user, want := range map[string]string{"lr-other": "NOPERM", "lr-noincr": "can't run this command"} {
		o := newBackend(t, e, "acl", as(user))
		cctx, cancel := context.WithTimeout(ctx, 5*time.Second)
		start := time.Now()
		_, err := o.Campaign(cctx, options("x", 10*time.Second))
		cancel()
		if !errors.Is(err, backends.ErrUnavailable) || !strings.Contains(err.Error(), want) || time.Since(start) > time.Second {
			t.Errorf("%s: %v after %v, want ErrUnavailable saying %q at once", user, err, time.Since(start), want)
		}
	}
}
