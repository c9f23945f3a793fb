package redis_test

import (
	"context"
	"encoding/json"
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

// testOldReleaseValue: the lock's key and value are what the release
// before the driver wrote, so that the two exclude each other across an
// upgrade. A value the old release wrote (a 32-digit nonce) is held by
// its identity, with its token and what is left of its lease by the
// server's clock; a --try finds it held; once it expires, the next grant
// draws from the same counter. A value the new release writes has the
// old release's fields, and a waiter queues where the old release looks.
func testOldReleaseValue(t *testing.T, e *env) {
	const lock = "old-release"
	ctx := context.Background()
	s := newStore(t, e, redis.Config{})
	old := `{"identity":"old-host:42","nonce":"0123456789abcdef0123456789abcdef","token":41,"lease_ms":1500}`
	if err := e.admin.Set(ctx, prefix+lock+":token", 41, 0).Err(); err != nil {
		t.Fatal(err)
	}
	if err := e.admin.Set(ctx, prefix+lock, old, 1500*time.Millisecond).Err(); err != nil {
		t.Fatal(err)
	}
	st, err := backends.ReadStatus(ctx, s, lock)
	if err != nil || !st.Held || st.Identity != "old-host:42" || st.Token != 41 || st.TTL != 1500*time.Millisecond ||
		st.Remaining <= 0 || st.Remaining > 1500*time.Millisecond {
		t.Fatalf("status of the old release's lock: %+v, %v", st, err)
	}
	try := candidate("new", timings(10*time.Second, 300*time.Millisecond))
	try.Try = true
	if _, err := backends.Campaign(ctx, s, lock, try); !errors.Is(err, backends.ErrLocked) {
		t.Fatalf("try on the old release's lock: %v, want ErrLocked", err)
	}
	waiting := make(chan *backends.Lease, 1)
	go func() {
		l, err := backends.Campaign(ctx, s, lock, candidate("new", timings(10*time.Second, 300*time.Millisecond)))
		if err != nil {
			t.Error(err)
		}
		waiting <- l
	}()
	waitFor(t, "the waiter to queue where the old release looks", func() bool {
		n, _ := e.admin.ZCard(ctx, prefix+":waiters:"+lock).Result()
		m, _ := e.admin.ZCard(ctx, prefix+":alive:"+lock).Result()
		return n == 1 && m == 1
	})
	l := <-waiting // the old lease expires by the server's clock
	if l == nil {
		return
	}
	defer l.Release(ctx, nil)
	if l.Token() != 42 {
		t.Errorf("the grant after the old release's token 41 has token %d, want 42", l.Token())
	}
	raw, err := e.admin.Get(ctx, prefix+lock).Result()
	var v struct {
		Identity string `json:"identity"`
		Nonce    string `json:"nonce"`
		Token    uint64 `json:"token"`
		LeaseMS  int64  `json:"lease_ms"`
	}
	if err != nil || json.Unmarshal([]byte(raw), &v) != nil || v.Identity != "new" || v.Nonce == "" || v.Token != 42 || v.LeaseMS != 10000 ||
		!strings.HasPrefix(raw, `{"identity":"new","nonce":"`) {
		t.Errorf("the new release's value %q (%v) is not in the old release's format", raw, err)
	}
}

// testTokensAcrossDeletes: 1,000 grants in a row, the lock's key deleted
// by hand (DEL, as an operator clearing a "stuck" lock would) while each
// is held: every token is greater than the one before. The deleted
// lease reports its loss; the next grant comes from the counter, which
// leaderrun never deletes.
func testTokensAcrossDeletes(t *testing.T, e *env) {
	const grants = 1000
	s := newStore(t, e, redis.Config{})
	ctx := context.Background()
	var prev uint64
	for i := range grants {
		l := campaign(t, s, "deleted-by-hand", "a")
		if l.Token() <= prev {
			t.Fatalf("grant %d: token %d, not greater than the previous %d", i, l.Token(), prev)
		}
		prev = l.Token()
		if n, err := e.admin.Del(ctx, prefix+"deleted-by-hand").Result(); err != nil || n != 1 {
			t.Fatalf("grant %d: DEL: %d, %v", i, n, err)
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
	s := newStore(t, e, redis.Config{})
	ctx := context.Background()
	var last uint64
	for range 5 {
		l := campaign(t, s, "counter-deleted", "a")
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
	if l := campaign(t, s, "counter-deleted", "a"); l.Token() != last+1 {
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
		{"another holder", `{"identity":"intruder","nonce":"00","token":999999,"lease_ms":10000}`, `"intruder" with token 999999`},
		{"not leaderruns", "locked-by-cron", "not leaderrun's value"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			lock := "loss-" + strings.ReplaceAll(tc.name, " ", "-")
			l := campaign(t, newStore(t, e, redis.Config{}), lock, "a")
			ctx := context.Background()
			if err := e.admin.Set(ctx, prefix+lock, tc.value, 10*time.Second).Err(); err != nil {
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
			if v, err := e.admin.Get(ctx, prefix+lock).Result(); err != nil || v != tc.value {
				t.Errorf("after the release the key holds %q (%v), want the other value left alone", v, err)
			}
		})
	}
}

// testLossSeenAtOnce (S3's aim): once a renewal's announcement proved
// that Redis announces changes of the key, a DEL or a SET of the key by
// hand is seen within 100 ms, not at the next poll.
func testLossSeenAtOnce(t *testing.T, e *env) {
	ctx := context.Background()
	var took []time.Duration
	for i := range 5 {
		var log logBuffer
		lock := fmt.Sprintf("at-once-%d", i)
		l := campaign(t, newStore(t, e, redis.Config{Log: log.logger()}), lock, "a")
		if err := l.Renew(ctx); err != nil {
			t.Fatal(err)
		}
		waitFor(t, "the holder to track its key", func() bool { return strings.Contains(log.String(), "tracking the lock's key") })
		changed := time.Now()
		var err error
		if i%2 == 0 {
			err = e.admin.Del(ctx, prefix+lock).Err()
		} else {
			err = e.admin.Set(ctx, prefix+lock, "taken", 0).Err()
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

// testRenewChecksValue: a renewal extends the lease by the server's
// clock, and one that finds the key gone is a loss even before the holder
// saw it (S3 through Renew).
func testRenewChecksValue(t *testing.T, e *env) {
	s := newStore(t, e, redis.Config{})
	l := campaignWith(t, s, "renew", candidate("a", timings(3*time.Second, 500*time.Millisecond)))
	ctx := context.Background()
	if l.TTL() != 3*time.Second {
		t.Errorf("TTL %v, want 3s", l.TTL())
	}
	waitFor(t, "the lease to run down a little", func() bool {
		ms, _ := e.admin.PTTL(ctx, prefix+"renew").Result()
		return ms < 2800*time.Millisecond
	})
	if err := l.Renew(ctx); err != nil {
		t.Fatal(err)
	}
	if ms, _ := e.admin.PTTL(ctx, prefix+"renew").Result(); ms < 2900*time.Millisecond {
		t.Errorf("PTTL after a renewal %v, want about 3s", ms)
	}
	e.admin.Del(ctx, prefix+"renew")
	if err := l.Renew(ctx); !errors.Is(err, backends.ErrLeaseLost) || !strings.Contains(err.Error(), prefix+"renew") {
		t.Errorf("renewal of a deleted key: %v, want ErrLeaseLost naming the key", err)
	}
}

// testStatus: a free lock; then the holder's identity, token, lease and
// what is left of it by the server's clock, the server, and the live
// waiters; a waiter that withdraws leaves the queue.
func testStatus(t *testing.T, e *env) {
	s := newStore(t, e, redis.Config{})
	ctx := context.Background()
	st, err := backends.ReadStatus(ctx, s, "status")
	if err != nil || st.Held || st.Waiting != 0 || st.Key != prefix+"status" {
		t.Fatalf("status of a free lock: %+v, %v", st, err)
	}
	tm := timings(4*time.Second, 300*time.Millisecond)
	l := campaignWith(t, s, "status", candidate("holder-1", tm))
	wctx, cancel := context.WithCancel(ctx)
	done := make(chan struct{})
	w := newStore(t, e, redis.Config{})
	go func() {
		defer close(done)
		if l, err := backends.Campaign(wctx, w, "status", candidate("waiter", tm)); err == nil {
			l.Release(context.Background(), nil)
		}
	}()
	waitFor(t, "the waiter to queue", func() bool {
		st, err := backends.ReadStatus(ctx, s, "status")
		return err == nil && st.Waiting == 1
	})
	st, err = backends.ReadStatus(ctx, s, "status")
	if err != nil {
		t.Fatal(err)
	}
	if !st.Held || st.Identity != "holder-1" || st.Token != l.Token() || st.TTL != 4*time.Second ||
		st.Remaining <= 0 || st.Remaining > 4*time.Second || st.Waiting != 1 || st.Node != e.r.Addr() {
		t.Errorf("status = %+v, want holder-1, token %d, TTL 4s, 0 < remaining <= 4s, 1 waiting, node %s", st, l.Token(), e.r.Addr())
	}
	cancel()
	<-done
	if st, err := backends.ReadStatus(ctx, s, "status"); err != nil || st.Waiting != 0 {
		t.Errorf("after the waiter withdrew: %+v, %v; want no one waiting", st, err)
	}
}

// testTryLeavesNoTrace: --try on a held lock is ErrLocked at once and
// joins no queue. The queue orders who is woken, not who may take a free
// lock: a --try that finds it free takes it, waiters or not.
func testTryLeavesNoTrace(t *testing.T, e *env) {
	const lock = "try-trace"
	a, b := newStore(t, e, redis.Config{}), newStore(t, e, redis.Config{})
	la := campaign(t, a, lock, "a")
	ctx := context.Background()
	try := candidate("b", timings(10*time.Second, 300*time.Millisecond))
	try.Try = true
	start := time.Now()
	if _, err := backends.Campaign(ctx, b, lock, try); !errors.Is(err, backends.ErrLocked) {
		t.Fatalf("try on a held lock: %v", err)
	}
	t.Logf("try on a held lock answered in %v", time.Since(start).Round(time.Microsecond))
	if n, _ := e.admin.Exists(ctx, prefix+":waiters:"+lock, prefix+":alive:"+lock).Result(); n != 0 {
		t.Errorf("a --try left %d queue keys behind", n)
	}
	e.admin.ZAdd(ctx, prefix+":waiters:"+lock, goredis.Z{Score: 1, Member: "ffff"})
	e.admin.ZAdd(ctx, prefix+":alive:"+lock, goredis.Z{Score: float64(time.Now().Add(time.Minute).UnixMilli()), Member: "ffff"})
	if err := la.Release(ctx, nil); err != nil {
		t.Fatal(err)
	}
	lb, err := backends.Campaign(ctx, b, lock, try)
	if err != nil {
		t.Fatalf("try on a free lock with a waiter queued: %v", err)
	}
	lb.Release(ctx, nil)
}

// testDeadWaiterLeavesQueue: a holder and the waiter first in line both
// died (here: a lock value whose lease runs out, and a queue entry whose
// liveness deadline does, as a killed process's do). The next waiter
// does not time the holder (it is not first), and is not kept waiting
// past the dead waiter's deadline: its next heartbeat drops it, finds
// itself first and the lock free, and takes it.
func testDeadWaiterLeavesQueue(t *testing.T, e *env) {
	const lock = "dead-waiter"
	const retry = 200 * time.Millisecond
	ctx := context.Background()
	dead := `{"identity":"dead-holder","nonce":"00","token":1,"lease_ms":300}`
	if err := e.admin.Set(ctx, prefix+lock, dead, 300*time.Millisecond).Err(); err != nil {
		t.Fatal(err)
	}
	deadline := time.Now().Add(time.Second)
	e.admin.ZAdd(ctx, prefix+":waiters:"+lock, goredis.Z{Score: 1, Member: "dead"})
	e.admin.ZAdd(ctx, prefix+":alive:"+lock, goredis.Z{Score: float64(deadline.UnixMilli()), Member: "dead"})
	l, err := backends.Campaign(ctx, newStore(t, e, redis.Config{}), lock, candidate("b", timings(10*time.Second, retry)))
	if err != nil {
		t.Fatal(err)
	}
	defer l.Release(ctx, nil)
	took := time.Since(deadline)
	t.Logf("b took the lock %v after the dead waiter's deadline", took.Round(time.Millisecond))
	if took < 0 || took > retry+200*time.Millisecond {
		t.Errorf("b took the lock %v after the dead waiter's deadline, want within a retry period (%v)", took, retry)
	}
}

// testHerd: 100 waiters on one lock, 30 changes of leader: each release
// wakes the first waiter alone. The heartbeats are a minute apart here,
// so that any wake-up is one a release caused.
func testHerd(t *testing.T, e *env) {
	const (
		lock    = "herd"
		waiters = 100
		changes = 30
	)
	tm := timings(3*time.Minute, time.Minute)
	held := campaignWith(t, newStore(t, e, redis.Config{}), lock, candidate("first", tm))
	stores := make([]*redis.Store, waiters)
	won := make(chan *backends.Lease, waiters)
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
	for i := range stores {
		stores[i] = newStore(t, e, redis.Config{})
		wg.Go(func() {
			l, err := backends.Campaign(ctx, stores[i], lock, candidate(fmt.Sprintf("w%d", i), tm))
			if err != nil {
				if ctx.Err() == nil {
					t.Errorf("w%d: %v", i, err)
				}
				return
			}
			won <- l
		})
	}
	woken := func() (n uint64) {
		for _, s := range stores {
			n += s.Woken()
		}
		return n
	}
	// Each waiter looks once when its subscription is confirmed.
	waitFor(t, "100 waiters to queue and listen", func() bool { return woken() == waiters })
	var acted []int
	var handovers []time.Duration
	for range changes {
		before := woken()
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
		acted = append(acted, int(woken()-before))
	}
	held.Release(context.Background(), nil)
	slices.Sort(acted)
	slices.Sort(handovers)
	t.Logf("%d waiters, %d changes: waiters woken per change median %d, max %d; handover median %v, max %v",
		waiters, changes, acted[len(acted)/2], acted[len(acted)-1], handovers[len(handovers)/2], handovers[len(handovers)-1])
	if acted[len(acted)/2] != 1 || acted[len(acted)-1] > 2 {
		t.Errorf("a release woke %d waiters (median %d), want 1 (at most 2)", acted[len(acted)-1], acted[len(acted)/2])
	}
}

// testDocumentsBounded: a document written by hand past backends.MaxDoc
// is an error when read, not our memory; the history and markers that
// leaderrun writes stay within their bounds.
func testDocumentsBounded(t *testing.T, e *env) {
	const lock = "bounded"
	ctx := context.Background()
	s := newStore(t, e, redis.Config{})
	if err := e.admin.Set(ctx, prefix+lock+":doc:history", strings.Repeat("x", backends.MaxDoc+1), 0).Err(); err != nil {
		t.Fatal(err)
	}
	if _, err := backends.ReadHistory(ctx, s, lock, 0); err == nil || !strings.Contains(err.Error(), "more than") {
		t.Errorf("a history of MaxDoc+1 bytes: %v, want an error", err)
	}
	e.admin.Del(ctx, prefix+lock+":doc:history")
	reason := strings.Repeat("r", 4<<10)
	for range 30 {
		l := campaign(t, s, lock, "a")
		now := time.Now()
		for i := range 10 {
			if err := l.Complete(ctx, backends.Marker{Key: fmt.Sprint(l.Token(), "-", i, reason[:100]), Identity: "a", Token: l.Token(),
				At: now, Expires: now.Add(time.Hour)}); err != nil {
				t.Fatal(err)
			}
		}
		if err := l.Release(ctx, &backends.Term{Identity: "a", Token: l.Token(), Ended: now, End: backends.EndLost, Reason: reason}); err != nil {
			t.Fatal(err)
		}
	}
	for doc, bound := range map[string]int64{"history": backends.MaxHistoryDoc, "markers": 16 << 10} {
		if n, err := e.admin.StrLen(ctx, prefix+lock+":doc:"+doc).Result(); err != nil || n == 0 || n > bound {
			t.Errorf("%s: %d bytes (%v), want at most %d", doc, n, err, bound)
		}
	}
}

// testUnreachable: nothing listens at the address: a --try fails at once,
// a wait ends when it runs out, saying the store never answered, and
// status fails; each names the address, never the password.
func testUnreachable(t *testing.T, e *env) {
	addr := net.JoinHostPort("127.0.0.1", strconv.Itoa(testenv.FreePort(t, "127.0.0.1")))
	s := newStore(t, e, redis.Config{URL: "redis://:" + password + "@" + addr})
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	for _, c := range []struct {
		try  bool
		wait time.Duration
		want string
	}{{true, 0, addr}, {false, time.Second, "no answer from redis within --wait 1s"}} {
		cand := candidate("a", timings(10*time.Second, 300*time.Millisecond))
		cand.Try, cand.Wait = c.try, c.wait
		start := time.Now()
		_, err := backends.Campaign(ctx, s, "nowhere", cand)
		if !errors.Is(err, backends.ErrUnavailable) || !strings.Contains(err.Error(), c.want) || !strings.Contains(err.Error(), addr) ||
			strings.Contains(err.Error(), password) {
			t.Errorf("try=%v: %v, want ErrUnavailable naming %s and not the password", c.try, err, addr)
		}
		if d := time.Since(start); d > c.wait+time.Second {
			t.Errorf("try=%v wait=%v: took %v to fail", c.try, c.wait, d)
		}
	}
	if _, err := backends.ReadStatus(ctx, s, "nowhere"); !errors.Is(err, backends.ErrUnavailable) {
		t.Errorf("status: %v", err)
	}
}

// testRefused: a wrong password, or none, an untrusted certificate: a
// refusal, final at once even for a candidate that would wait for ever,
// and no message shows the password. TLS to the plain port is no refusal
// (the server waits for the rest of what it takes for a command, and the
// handshake times out): a --try fails at once.
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
		{"TLS to the plain port", redis.Config{URL: "rediss://:" + password + "@" + e.r.Addr() + "?dial_timeout=1s",
			TLS: e.r.TLSConfig(t)}, "TLS handshake"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
			defer cancel()
			c := candidate("a", timings(10*time.Second, 300*time.Millisecond))
			c.Try = tc.want == "TLS handshake"
			start := time.Now()
			_, err := backends.Campaign(ctx, newStore(t, e, tc.cfg), "refused", c)
			if !errors.Is(err, backends.ErrUnavailable) || !strings.Contains(err.Error(), tc.want) || errors.Is(err, backends.ErrRefused) == c.Try {
				t.Errorf("campaign: %v, want ErrUnavailable saying %s, refused: %v", err, tc.want, !c.Try)
			}
			if d := time.Since(start); d > 2*time.Second {
				t.Errorf("took %v to fail", d)
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
	l := campaign(t, newStore(t, e, redis.Config{URL: "redis://:" + password + "@" + p.Addr()}), "stalled", "a")
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
// error, at once and final (no Redis answers so), and the process does not
// allocate what it announced.
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
			s := newStore(t, e, redis.Config{URL: "redis://" + ln.Addr().String()})
			var before, after runtime.MemStats
			runtime.GC()
			runtime.ReadMemStats(&before)
			ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
			defer cancel()
			_, err = backends.Campaign(ctx, s, "hostile", candidate("a", timings(10*time.Second, 300*time.Millisecond)))
			runtime.ReadMemStats(&after)
			if !errors.Is(err, backends.ErrRefused) {
				t.Errorf("campaign against a hostile server: %v, want ErrRefused", err)
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
	for _, c := range []string{"eval", "evalsha", "get", "getrange", "subscribe", "wait", "info",
		"set", "incr", "pexpire", "pexpireat", "pttl", "del", "zadd", "zrem", "zrange", "zscore", "zrank", "zcount",
		"publish", "time"} {
		rules = append(rules, "+"+c)
	}
	return rules
}

// testACL: a user with the rules of aclRules on the prefix does all a
// leader and a waiter do; the same user on another prefix is refused at
// once (NOPERM), and so is one without the scripts' commands. Without
// CLIENT TRACKING, a holder says it polls, and a loss is still seen
// within 1 s.
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
		return redis.Config{URL: "redis://" + user + ":" + password + "@" + e.r.Addr()}
	}
	s := newStore(t, e, as("lr-ok"))
	l := campaign(t, s, "acl", "a")
	got := make(chan *backends.Lease, 1)
	w := newStore(t, e, as("lr-ok"))
	go func() {
		lw, err := backends.Campaign(ctx, w, "acl", candidate("w", timings(10*time.Second, 300*time.Millisecond)))
		if err != nil {
			t.Error(err)
		}
		got <- lw
	}()
	waitFor(t, "the waiter to queue", func() bool { st, err := backends.ReadStatus(ctx, s, "acl"); return err == nil && st.Waiting == 1 })
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
			if m, err := backends.ReadMarker(ctx, s, "acl", "k"); err != nil || m == nil {
				t.Errorf("completed: %+v, %v", m, err)
			}
			lw.Release(ctx, nil)
		}
	case <-time.After(10 * time.Second):
		t.Fatal("the waiter was not granted the lock")
	}
	if h, err := backends.ReadHistory(ctx, s, "acl", 0); err != nil || len(h) != 1 {
		t.Errorf("history: %+v, %v", h, err)
	}
	var log logBuffer
	cfg := as("lr-notracking")
	cfg.Log = log.logger()
	ln := campaign(t, newStore(t, e, cfg), "acl-poll", "a")
	if err := ln.Renew(ctx); err != nil {
		t.Fatal(err)
	}
	waitFor(t, "the holder to say it polls", func() bool { return strings.Contains(log.String(), "polling the lock's key") })
	e.admin.Del(ctx, prefix+"acl-poll")
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
		cctx, cancel := context.WithTimeout(ctx, 5*time.Second)
		start := time.Now()
		_, err := backends.Campaign(cctx, newStore(t, e, as(user)), "acl", candidate("x", timings(10*time.Second, 300*time.Millisecond)))
		cancel()
		if !errors.Is(err, backends.ErrRefused) || !strings.Contains(err.Error(), want) || time.Since(start) > time.Second {
			t.Errorf("%s: %v after %v, want ErrRefused saying %q at once", user, err, time.Since(start), want)
		}
	}
}
