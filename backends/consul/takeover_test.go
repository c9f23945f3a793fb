package consul_test

import (
	"context"
	"errors"
	"io"
	"net/http"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/hashicorp/consul/api"

	"github.com/leaderrun/leaderrun/backends"
	"github.com/leaderrun/leaderrun/internal/testenv"
)

// renewer renews a lease every period from a goroutine of its own, as the
// runner does, and records the send time of every renewal that Renew
// reported acknowledged.
type renewer struct {
	stop, done chan struct{}

	mu     sync.Mutex
	acked  []time.Time
	failed int
	err    error // the last failure
}

func renewEvery(l backends.Lease, period time.Duration) *renewer {
	r := &renewer{stop: make(chan struct{}), done: make(chan struct{})}
	r.acked = []time.Time{l.Acquired()}
	go func() {
		defer close(r.done)
		t := time.NewTicker(period)
		defer t.Stop()
		for {
			select {
			case <-r.stop:
				return
			case <-t.C:
			}
			sent := time.Now()
			ctx, cancel := context.WithTimeout(context.Background(), period)
			err := l.Renew(ctx)
			cancel()
			r.mu.Lock()
			if err == nil {
				r.acked = append(r.acked, sent)
			} else {
				r.failed++
				r.err = err
			}
			r.mu.Unlock()
		}
	}()
	return r
}

// halt stops the renewals and waits for the one under way.
func (r *renewer) halt() {
	select {
	case <-r.stop:
	default:
		close(r.stop)
	}
	<-r.done
}

// lastAck is the send time of the last acknowledged renewal (or the grant's).
func (r *renewer) lastAck() time.Time {
	r.mu.Lock()
	defer r.mu.Unlock()
	return r.acked[len(r.acked)-1]
}

func (r *renewer) counts() (acked, failed int, err error) {
	r.mu.Lock()
	defer r.mu.Unlock()
	return len(r.acked) - 1, r.failed, r.err
}

// timedResult is a campaign's outcome and when Campaign returned.
type timedResult struct {
	campaignResult
	at time.Time
}

// campaignFor campaigns in a goroutine with a lease duration of ttl, until
// it wins or the test ends.
func campaignFor(t *testing.T, b backends.Backend, id string, ttl time.Duration) <-chan timedResult {
	ctx, cancel := context.WithCancel(context.Background())
	ch := make(chan timedResult, 1)
	done := make(chan struct{})
	go func() {
		defer close(done)
		l, err := b.Campaign(ctx, backends.CampaignOptions{Identity: id, LeaseDuration: ttl})
		ch <- timedResult{campaignResult{l, err}, time.Now()}
	}()
	t.Cleanup(func() {
		cancel()
		<-done
	})
	return ch
}

// waitWaiting waits until Status counts n waiters.
func waitWaiting(t *testing.T, b backends.Backend, n int) {
	t.Helper()
	waitUntil(t, "waiters in the queue", func() bool {
		st, err := b.Status(context.Background())
		return err == nil && st.Waiting == n
	})
}

// TestConsulFollowerTakesOver: the waiter first in line replaces a holder
// whose link to Consul stalls, no sooner than a lease (the longer of its
// own and the holder's) after the send time of the holder's last
// acknowledged renewal, where the runner counts its deadline from (and
// lease > deadline + kill grace), plus the holder's lock-delay; and within
// a second more than that. While the holder renews, it is never replaced.
func TestConsulFollowerTakesOver(t *testing.T) {
	t.Parallel()
	agent := testenv.StartConsul(t, testenv.ConsulOptions{})
	const period = 2 * time.Second
	cases := []struct {
		name                   string
		holderTTL, followerTTL time.Duration
		lockDelay              time.Duration
		// renewing is how long the holder renews, with the follower
		// waiting, before its link stalls: longer than a lease shows that
		// a live holder is left alone.
		renewing time.Duration
	}{
		{name: "equal leases", holderTTL: 10 * time.Second, followerTTL: 10 * time.Second, lockDelay: 1500 * time.Millisecond, renewing: 13 * time.Second},
		{name: "longer lease of the holder", holderTTL: 15 * time.Second, followerTTL: 10 * time.Second, renewing: 3 * time.Second},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			lock := "takeover-" + strings.ReplaceAll(tc.name, " ", "-")
			link := testenv.NewProxy(t, agent.Addr())
			hb := newBackend(t, link.Addr(), lock, tc.lockDelay)
			fb := newBackend(t, agent.Addr(), lock, 0)
			ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
			defer cancel()
			lh, err := hb.Campaign(ctx, backends.CampaignOptions{Identity: "holder", LeaseDuration: tc.holderTTL})
			if err != nil {
				t.Fatal(err)
			}
			r := renewEvery(lh, period)
			got := campaignFor(t, fb, "follower", tc.followerTTL)
			waitWaiting(t, fb, 1)
			select {
			case res := <-got:
				t.Fatalf("the follower took the lock from a holder that renews: %v", res.err)
			case <-time.After(tc.renewing):
			}
			select {
			case <-lh.Lost():
				t.Fatalf("the renewing holder lost its lease: %v", lh.Err())
			default:
			}

			link.Stall()
			patience := max(tc.holderTTL, tc.followerTTL)
			var res timedResult
			select {
			case res = <-got:
			case <-time.After(patience + tc.lockDelay + 10*time.Second):
				t.Fatal("the follower did not take over the stalled holder")
			}
			lf := res.get(t)
			r.halt()
			last := r.lastAck()
			took := res.at.Sub(last)
			acked, failed, _ := r.counts()
			t.Logf("holder: %d renewals acknowledged, %d failed; follower acquired %v after the send time of the last acknowledged one (lease %v, lock-delay %v)",
				acked, failed, took.Round(time.Millisecond), patience, tc.lockDelay)
			if took <= patience {
				t.Errorf("the follower acquired %v after the holder's last acknowledged renewal was sent, within the lease of %v", took, patience)
			}
			if took < patience+tc.lockDelay-50*time.Millisecond {
				t.Errorf("the follower acquired %v after the holder's last renewal, before lease + lock-delay = %v", took, patience+tc.lockDelay)
			}
			if bound := patience + tc.lockDelay + time.Second; took > bound {
				t.Errorf("the follower acquired %v after the holder's last renewal, want within lease + lock-delay + 1s = %v", took, bound)
			}
			if lf.Token() <= lh.Token() {
				t.Errorf("follower's token %d not greater than the holder's %d", lf.Token(), lh.Token())
			}

			// The holder hears that its session is gone once its link is back.
			link.Resume()
			select {
			case <-lh.Lost():
				t.Logf("the old holder reports: %v", lh.Err())
			case <-time.After(5 * time.Second):
				t.Error("the old holder did not report its loss after its link came back")
			}
			rctx, rcancel := context.WithTimeout(context.Background(), 5*time.Second)
			defer rcancel()
			if err := lh.Renew(rctx); !errors.Is(err, backends.ErrLeaseLost) {
				t.Errorf("the old holder's Renew = %v, want ErrLeaseLost", err)
			}
			release(t, lf)
			release(t, lh)
		})
	}
}

// TestConsulLegacyHolderNotTimed: a key held with a plain value (an older
// leaderrun, or another tool), whose holder does not write the key when it
// renews, is never taken over: the follower waits for Consul to free it.
func TestConsulLegacyHolderNotTimed(t *testing.T) {
	t.Parallel()
	agent := testenv.StartConsul(t, testenv.ConsulOptions{})
	op := admin(t, agent.Addr())
	b := newBackend(t, agent.Addr(), "legacy", 0)
	s, _, err := op.Session().Create(&api.SessionEntry{TTL: "10s", LockDelay: time.Nanosecond}, nil)
	if err != nil {
		t.Fatal(err)
	}
	if ok, _, err := op.KV().Acquire(&api.KVPair{Key: b.Key(), Value: []byte("old-leaderrun"), Session: s}, nil); err != nil || !ok {
		t.Fatalf("acquire %s by hand: %v %v", b.Key(), ok, err)
	}
	stop := make(chan struct{})
	renewed := make(chan struct{})
	go func() {
		defer close(renewed)
		_ = op.Session().RenewPeriodic("10s", s, nil, stop)
	}()
	got := campaignFor(t, b, "follower", ttl)
	waitWaiting(t, b, 1)
	select {
	case res := <-got:
		t.Fatalf("the follower took a key whose holder does not write at renewals: %v", res.err)
	case <-time.After(ttl + 3*time.Second):
	}
	if info, _, err := op.Session().Info(s, nil); err != nil || info == nil {
		t.Fatalf("the legacy holder's session is gone: %v", err)
	}
	if _, _, err := op.KV().Release(&api.KVPair{Key: b.Key(), Session: s}, nil); err != nil {
		t.Fatal(err)
	}
	released := time.Now()
	select {
	case res := <-got:
		t.Logf("the follower acquired %v after the legacy holder released the key", res.at.Sub(released))
		release(t, res.get(t))
	case <-time.After(5 * time.Second):
		t.Fatal("the follower did not acquire the released key")
	}
	close(stop)
	<-renewed
}

// staleView plays a Consul server that has fallen behind, for one client:
// once frozen, every read of key that is not consistent is answered with
// the key as it was at the freeze, a blocking query only at the end of its
// wait. Consistent reads go through.
type staleView struct {
	agent, key string
	frozen     atomic.Bool
	mu         sync.Mutex
	body       []byte
	header     http.Header
}

func (s *staleView) freeze(t *testing.T) {
	resp, err := http.Get("http://" + s.agent + "/v1/kv/" + s.key)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	body, err := io.ReadAll(resp.Body)
	if err != nil {
		t.Fatal(err)
	}
	s.mu.Lock()
	s.body, s.header = body, resp.Header.Clone()
	s.mu.Unlock()
	s.frozen.Store(true)
}

func (s *staleView) hook(w http.ResponseWriter, r *http.Request) bool {
	if !s.frozen.Load() || r.Method != http.MethodGet || r.URL.Path != "/v1/kv/"+s.key || r.URL.Query().Has("consistent") {
		return false
	}
	if r.URL.Query().Get("index") != "" {
		wait, _ := time.ParseDuration(r.URL.Query().Get("wait"))
		select {
		case <-time.After(wait):
		case <-r.Context().Done():
			return true
		}
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	for _, k := range []string{"X-Consul-Index", "Content-Type"} {
		w.Header().Set(k, s.header.Get(k))
	}
	_, _ = w.Write(s.body)
	return true
}

// TestConsulStaleFollowerConfirms: a follower whose reads of the key are
// stale (it sees no renewal at all) does not take over a holder that
// renews: its consistent read at the end of the lease shows the holder's
// writes. Once the holder stops renewing, the follower takes over, a lease
// after the holder's last acknowledged renewal at the earliest.
func TestConsulStaleFollowerConfirms(t *testing.T) {
	t.Parallel()
	agent := testenv.StartConsul(t, testenv.ConsulOptions{})
	hb := newBackend(t, agent.Addr(), "stale", 0)
	view := &staleView{agent: agent.Addr(), key: hb.Key()}
	proxy := newHookedProxy(t, agent.Addr(), view.hook)
	fb := newBackend(t, proxy.addr(), "stale", 0)
	lh := campaign(t, hb, "holder")
	r := renewEvery(lh, 2*time.Second)
	got := campaignFor(t, fb, "follower", ttl)
	proxy.waitBlocked(t, "/v1/kv/"+hb.Key())
	view.freeze(t)
	frozen := time.Now()
	select {
	case res := <-got:
		t.Fatalf("the stale follower took the lock from a holder that renews: %v", res.err)
	case <-time.After(2*ttl + 5*time.Second):
	}
	select {
	case <-lh.Lost():
		t.Fatalf("the renewing holder lost its lease: %v", lh.Err())
	default:
	}
	confirms := 0
	for _, q := range proxy.requests() {
		if q.query.Has("consistent") && q.start.After(frozen) {
			confirms++
		}
	}
	t.Logf("stale for %v: the follower confirmed %d times with a consistent read, and left the holder alone", time.Since(frozen).Round(time.Second), confirms)
	if confirms < 2 {
		t.Errorf("%d consistent reads in %v of stale reads, want one per lease (2)", confirms, time.Since(frozen).Round(time.Second))
	}

	r.halt()
	last := r.lastAck()
	select {
	case res := <-got:
		took := res.at.Sub(last)
		t.Logf("holder silent: the stale follower acquired %v after the send time of its last acknowledged renewal", took.Round(time.Millisecond))
		if took <= ttl {
			t.Errorf("acquired %v after the holder's last acknowledged renewal, within the lease of %v", took, ttl)
		}
		release(t, res.get(t))
	case <-time.After(3*ttl + 10*time.Second):
		t.Fatal("the follower did not take over the silent holder")
	}
	release(t, lh)
}

// TestConsulRenewNeedsBoth: Renew succeeds only if both the session
// renewal and the record's write were acknowledged; a failure of either is
// an error the runner does not count, and not a loss.
func TestConsulRenewNeedsBoth(t *testing.T) {
	agent := testenv.StartConsul(t, testenv.ConsulOptions{})
	op := admin(t, agent.Addr())
	cases := []struct{ name, path string }{
		{name: "session renewal fails", path: "/v1/session/renew/"},
		{name: "record write fails", path: "/v1/txn"},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			var failing atomic.Bool
			proxy := newHookedProxy(t, agent.Addr(), func(w http.ResponseWriter, r *http.Request) bool {
				if failing.Load() && strings.HasPrefix(r.URL.Path, tc.path) {
					http.Error(w, "injected failure", http.StatusInternalServerError)
					return true
				}
				return false
			})
			b := newBackend(t, proxy.addr(), strings.ReplaceAll(tc.name, " ", "-"), 0)
			l := campaign(t, b, "a")
			defer release(t, l)
			modify := func() uint64 {
				pair, _, err := op.KV().Get(b.Key(), nil)
				if err != nil || pair == nil {
					t.Fatalf("read %s: %v", b.Key(), err)
				}
				return pair.ModifyIndex
			}
			ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
			defer cancel()
			failing.Store(true)
			before := modify()
			err := l.Renew(ctx)
			after := modify()
			t.Logf("Renew with one half failing: %v (ModifyIndex %d → %d)", err, before, after)
			if err == nil {
				t.Fatal("Renew = nil although one of its two requests failed")
			}
			if errors.Is(err, backends.ErrLeaseLost) || l.Err() != nil {
				t.Errorf("a failed request is not a loss: Renew = %v, Err = %v", err, l.Err())
			}
			if tc.path == "/v1/txn" && after != before {
				t.Errorf("the record's write failed but the key's ModifyIndex moved %d → %d", before, after)
			}
			failing.Store(false)
			if err := l.Renew(ctx); err != nil {
				t.Errorf("Renew once both requests go through: %v", err)
			}
			if m := modify(); m <= after {
				t.Errorf("a good renewal left the key's ModifyIndex at %d", m)
			}
		})
	}
}

// TestConsulRenewalsKeepToken: renewals rewrite the key (its ModifyIndex
// moves, so followers see them), but Status keeps showing the grant's
// token, and the next grant's token is greater than every index the
// renewals wrote.
func TestConsulRenewalsKeepToken(t *testing.T) {
	agent := testenv.StartConsul(t, testenv.ConsulOptions{})
	op := admin(t, agent.Addr())
	b := newBackend(t, agent.Addr(), "token", 2*time.Second)
	l := campaign(t, b, "a")
	read := func() *api.KVPair {
		pair, _, err := op.KV().Get(b.Key(), nil)
		if err != nil || pair == nil {
			t.Fatalf("read %s: %v", b.Key(), err)
		}
		return pair
	}
	first := read()
	if first.ModifyIndex != l.Token() {
		t.Errorf("ModifyIndex right after the grant %d, token %d", first.ModifyIndex, l.Token())
	}
	indexes := []uint64{first.ModifyIndex}
	for i := range 3 {
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		err := l.Renew(ctx)
		cancel()
		if err != nil {
			t.Fatalf("renewal %d: %v", i, err)
		}
		pair := read()
		if pair.ModifyIndex <= indexes[len(indexes)-1] {
			t.Errorf("renewal %d left the ModifyIndex at %d", i, pair.ModifyIndex)
		}
		indexes = append(indexes, pair.ModifyIndex)
		st, err := b.Status(context.Background())
		if err != nil || st.Token != l.Token() || st.Identity != "a" || st.TTL != ttl {
			t.Errorf("status after renewal %d: %+v, %v; want identity a, token %d, TTL %v", i, st, err, l.Token(), ttl)
		}
	}
	value := string(read().Value)
	t.Logf("ModifyIndex at the grant and after each renewal: %v; the key's value: %s", indexes, value)
	for _, want := range []string{`"identity":"a"`, `"ttl":"10s"`, `"lock_delay":"2s"`} {
		if !strings.Contains(value, want) {
			t.Errorf("the record %s does not hold %s", value, want)
		}
	}
	release(t, l)
	next := campaign(t, b, "b")
	if next.Token() <= indexes[len(indexes)-1] {
		t.Errorf("next grant's token %d, not greater than the last renewal's index %d", next.Token(), indexes[len(indexes)-1])
	}
	release(t, next)
}
