package consul_test

import (
	"context"
	"errors"
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

func renewEvery(l *backends.Lease, period time.Duration) *renewer {
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
func campaignFor(t *testing.T, b *tlock, id string, ttl time.Duration) <-chan timedResult {
	ctx, cancel := context.WithCancel(context.Background())
	ch := make(chan timedResult, 1)
	done := make(chan struct{})
	go func() {
		defer close(done)
		l, err := b.Campaign(ctx, campaignOptions{Identity: id, LeaseDuration: ttl})
		ch <- timedResult{campaignResult{l, err}, time.Now()}
	}()
	t.Cleanup(func() {
		cancel()
		<-done
	})
	return ch
}

// waitWaiting waits until Status counts n waiters.
func waitWaiting(t *testing.T, b *tlock, n int) {
	t.Helper()
	waitUntil(t, "waiters in the queue", func() bool {
		st, err := b.Status(context.Background())
		return err == nil && st.Waiting == n
	})
}

// TestConsulStalledHolderReplaced: the waiter first in line replaces a
// holder whose link to its agent stalls, no sooner than the holder's lease
// after the send time of its last acknowledged renewal, where the runner
// counts its deadline from (and lease > deadline + kill grace), plus its
// lock-delay; and within a second more than that, not Consul's 2×TTL: the
// holder's TTL check turns critical a lease after the agent last heard
// from it, which ends the session. While the holder renews, it is never
// replaced, whatever the follower's own lease.
func TestConsulStalledHolderReplaced(t *testing.T) {
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
		{name: "shorter lease of the holder", holderTTL: 10 * time.Second, followerTTL: 20 * time.Second, renewing: 3 * time.Second},
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
			lh, err := hb.Campaign(ctx, campaignOptions{Identity: "holder", LeaseDuration: tc.holderTTL})
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
			patience := tc.holderTTL
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

// TestConsulRenewNeedsBoth: Renew succeeds only if both the session
// renewal and the pass of its TTL check were acknowledged; a failure of
// either is an error the runner does not count, and not a loss.
func TestConsulRenewNeedsBoth(t *testing.T) {
	agent := testenv.StartConsul(t, testenv.ConsulOptions{})
	cases := []struct{ name, path string }{
		{name: "session renewal fails", path: "/v1/session/renew/"},
		{name: "check pass fails", path: "/v1/agent/check/pass/"},
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
			ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
			defer cancel()
			failing.Store(true)
			err := l.Renew(ctx)
			t.Logf("Renew with one half failing: %v", err)
			if err == nil {
				t.Fatal("Renew = nil although one of its two requests failed")
			}
			if errors.Is(err, backends.ErrLeaseLost) || l.Err() != nil {
				t.Errorf("a failed request is not a loss: Renew = %v, Err = %v", err, l.Err())
			}
			failing.Store(false)
			if err := l.Renew(ctx); err != nil {
				t.Errorf("Renew once both requests go through: %v", err)
			}
			var sent []string
			for _, q := range proxy.requests() {
				sent = append(sent, q.method+" "+q.path)
			}
			t.Logf("requests: %v", sent)
		})
	}
}

// TestConsulRenewalsLeaveKeyAlone: renewals write nothing to the key (its
// ModifyIndex stays at the token, so a waiter's blocking query is not
// answered by them), Status shows the grant's token and the holder's
// record, and the next grant's token is greater.
func TestConsulRenewalsLeaveKeyAlone(t *testing.T) {
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
	if first := read(); first.ModifyIndex != l.Token() {
		t.Errorf("ModifyIndex right after the grant %d, token %d", first.ModifyIndex, l.Token())
	}
	for i := range 3 {
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		err := l.Renew(ctx)
		cancel()
		if err != nil {
			t.Fatalf("renewal %d: %v", i, err)
		}
		if m := read().ModifyIndex; m != l.Token() {
			t.Errorf("renewal %d moved the key's ModifyIndex to %d (token %d)", i, m, l.Token())
		}
		st, err := b.Status(context.Background())
		if err != nil || st.Token != l.Token() || st.Identity != "a" || st.TTL != ttl {
			t.Errorf("status after renewal %d: %+v, %v; want identity a, token %d, TTL %v", i, st, err, l.Token(), ttl)
		}
	}
	value := string(read().Value)
	t.Logf("the key's value: %s", value)
	for _, want := range []string{`"identity":"a"`, `"ttl":"10s"`, `"lock_delay":"2s"`} {
		if !strings.Contains(value, want) {
			t.Errorf("the record %s does not hold %s", value, want)
		}
	}
	release(t, l)
	next := campaign(t, b, "b")
	if next.Token() <= l.Token() {
		t.Errorf("next grant's token %d, not greater than %d", next.Token(), l.Token())
	}
	release(t, next)
}

// TestConsulCheckGoneIsLoss: deregistering the holder's TTL check (by an
// operator, or an agent that lost its state) ends its session: the lease
// reports the loss at once, and its next Renew says so too. A candidate
// that starts on the agent later deregisters the critical checks that dead
// candidates left behind, and no other.
func TestConsulCheckGoneIsLoss(t *testing.T) {
	agent := testenv.StartConsul(t, testenv.ConsulOptions{})
	op := admin(t, agent.Addr())
	b := newBackend(t, agent.Addr(), "check-gone", 0)
	l := campaign(t, b, "a")
	info, _, err := op.Session().Info(sessionOf(t, l), nil)
	if err != nil || info == nil || len(info.NodeChecks) != 1 {
		t.Fatalf("session info: %+v, %v", info, err)
	}
	if err := op.Agent().CheckDeregister(info.NodeChecks[0]); err != nil {
		t.Fatal(err)
	}
	select {
	case <-l.Lost():
		t.Logf("lost: %v", l.Err())
	case <-time.After(5 * time.Second):
		t.Fatal("the holder did not report its loss when its check was deregistered")
	}
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	if err := l.Renew(ctx); !errors.Is(err, backends.ErrLeaseLost) {
		t.Errorf("Renew after the check was deregistered = %v, want ErrLeaseLost", err)
	}
	release(t, l)

	// Left behind by a candidate that died: critical. And a check of
	// someone else's that is critical, and a passing leaderrun check.
	for _, reg := range []*api.AgentCheckRegistration{
		{ID: "leaderrun:dead", Name: "leaderrun", AgentServiceCheck: api.AgentServiceCheck{TTL: "10s", Status: api.HealthCritical}},
		{ID: "leaderrun:alive", Name: "leaderrun", AgentServiceCheck: api.AgentServiceCheck{TTL: "10m", Status: api.HealthPassing}},
		{ID: "other", Name: "other", AgentServiceCheck: api.AgentServiceCheck{TTL: "10s", Status: api.HealthCritical}},
	} {
		if err := op.Agent().CheckRegister(reg); err != nil {
			t.Fatal(err)
		}
	}
	next := campaign(t, b, "b")
	checks, err := op.Agent().Checks()
	if err != nil {
		t.Fatal(err)
	}
	if checks["leaderrun:dead"] != nil {
		t.Error("the dead candidate's critical check is still registered")
	}
	if checks["leaderrun:alive"] == nil || checks["other"] == nil {
		t.Errorf("a check that was not a dead candidate's was deregistered: %v", checks)
	}
	release(t, next)
}

// TestConsulOutage: an agent out of reach for 2 s while candidates wait
// (--wait 30s) costs no run. One that could not reach the agent at all
// gets the lock once it is back; a dev agent comes back empty, so the
// holder learns that its key is gone, and the waiter, whose sessions went
// with the agent's state, joins the queue again and takes the lock.
func TestConsulOutage(t *testing.T) {
	agent := testenv.StartConsul(t, testenv.ConsulOptions{})
	h, w, late := newBackend(t, agent.Addr(), "outage", 0), newBackend(t, agent.Addr(), "outage", 0), newBackend(t, agent.Addr(), "outage-late", 0)
	lh := campaign(t, h, "holder")
	gotW := campaignFor(t, w, "waiter", ttl)
	waitWaiting(t, h, 1)
	agent.Stop()
	gotLate := make(chan campaignResult, 1)
	go func() {
		l, err := backends.Campaign(context.Background(), late.s, late.name, backends.Candidate{Identity: "late", Timings: timings(ttl), Wait: 30 * time.Second})
		gotLate <- campaignResult{l, err}
	}()
	time.Sleep(2 * time.Second) // the outage, not synchronisation
	agent.Start()
	restarted := time.Now()
	for name, got := range map[string]<-chan campaignResult{"the waiter": asResult(gotW), "the late candidate": gotLate} {
		select {
		case res := <-got:
			t.Logf("%s got the lock %v after the agent came back", name, time.Since(restarted).Round(time.Millisecond))
			release(t, res.get(t))
		case <-time.After(ttl + 10*time.Second):
			t.Fatalf("%s did not get the lock after the outage", name)
		}
	}
	select {
	case <-lh.Lost():
		t.Logf("the holder: %v", lh.Err())
	case <-time.After(5 * time.Second):
		t.Error("the holder did not learn that its key is gone")
	}
	release(t, lh)
}

// asResult turns a timed result into a plain one.
func asResult(ch <-chan timedResult) <-chan campaignResult {
	out := make(chan campaignResult, 1)
	go func() { out <- (<-ch).campaignResult }()
	return out
}
