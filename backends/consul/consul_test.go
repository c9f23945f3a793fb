package consul_test

import (
	"context"
	"errors"
	"net"
	"net/http"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/hashicorp/consul/api"

	"github.com/leaderrun/leaderrun/backends"
	"github.com/leaderrun/leaderrun/backends/backendtest"
	"github.com/leaderrun/leaderrun/backends/consul"
	"github.com/leaderrun/leaderrun/internal/testenv"
)

const ttl = 10 * time.Second

// timings are the campaigns' timings with a lease of d (backendtest's
// otherwise: a retry period of 300 ms).
func timings(d time.Duration) backends.Timings {
	t := backendtest.DefaultTimings
	t.LeaseDuration = d
	return t
}

// tlock is one lock of a store of its own, as a candidate on a host of
// its own campaigns for it.
type tlock struct {
	s    *consul.Store
	name string
}

// openStore opens a store on the agent at addr with cfg's token and
// lock-delay, closed when the test ends.
func openStore(t *testing.T, addr, token string, lockDelay time.Duration) *consul.Store {
	t.Helper()
	cfg := api.DefaultConfig()
	cfg.Address, cfg.Token = addr, token
	s, err := consul.Open(consul.Config{API: cfg, Prefix: "leaderrun-test/", LockDelay: lockDelay})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { s.Close() })
	return s
}

// newBackend returns lock in a store of its own on the agent at addr.
func newBackend(t *testing.T, addr, lock string, lockDelay time.Duration) *tlock {
	return &tlock{s: openStore(t, addr, "", lockDelay), name: lock}
}

func (b *tlock) Key() string { return b.s.Lock(b.name).Key() }

func (b *tlock) Status(ctx context.Context) (backends.Status, error) {
	return backends.ReadStatus(ctx, b.s, b.name)
}

// campaignOptions are what a test campaigns with.
type campaignOptions struct {
	Identity      string
	Try           bool
	LeaseDuration time.Duration
}

func (b *tlock) Campaign(ctx context.Context, o campaignOptions) (*backends.Lease, error) {
	return backends.Campaign(ctx, b.s, b.name, backends.Candidate{Identity: o.Identity, Try: o.Try, Timings: timings(o.LeaseDuration)})
}

// admin is a separate client that plays the operator.
func admin(t *testing.T, addr string) *api.Client {
	t.Helper()
	cfg := api.DefaultConfig()
	cfg.Address = addr
	c, err := api.NewClient(cfg)
	if err != nil {
		t.Fatal(err)
	}
	return c
}

func sessionOf(t *testing.T, l *backends.Lease) string {
	t.Helper()
	s, ok := l.Grant().(interface{ Session() string })
	if !ok {
		t.Fatalf("grant %T does not tell its session", l.Grant())
	}
	return s.Session()
}

func destroy(t *testing.T, c *api.Client, session string) {
	t.Helper()
	if _, err := c.Session().Destroy(session, nil); err != nil {
		t.Fatalf("destroy session %s: %v", session, err)
	}
}

// campaign campaigns as id with a lease of ttl, and fails the test if that
// does not succeed within 30 s.
func campaign(t *testing.T, b *tlock, id string) *backends.Lease {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	l, err := b.Campaign(ctx, campaignOptions{Identity: id, LeaseDuration: ttl})
	if err != nil {
		t.Fatalf("%s: campaign: %v", id, err)
	}
	return l
}

var release = backendtest.Release

type campaignResult struct {
	lease *backends.Lease
	err   error
}

func (r campaignResult) get(t *testing.T) *backends.Lease {
	t.Helper()
	if r.err != nil {
		t.Fatalf("campaign: %v", r.err)
	}
	return r.lease
}

// campaignAsync campaigns in a goroutine that ends when the campaign does.
func campaignAsync(b *tlock, id string) <-chan campaignResult {
	ch := make(chan campaignResult, 1)
	go func() {
		ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
		defer cancel()
		l, err := b.Campaign(ctx, campaignOptions{Identity: id, LeaseDuration: ttl})
		ch <- campaignResult{l, err}
	}()
	return ch
}

// TestConsulConformance runs the shared suite against a real dev agent.
// Lock-delay is 0: the suite hands the lock over many times, some of them
// by dropping a session, which would otherwise cost the lock-delay each.
func TestConsulConformance(t *testing.T) {
	agent := testenv.StartConsul(t, testenv.ConsulOptions{})
	op := admin(t, agent.Addr())
	backendtest.Run(t, backendtest.Harness{
		Open: func(t *testing.T) backends.Store { return openStore(t, agent.Addr(), "", 0) },
		Drop: func(t *testing.T, _ string, l *backends.Lease) { destroy(t, op, sessionOf(t, l)) },
	})
}

// TestConsulTokenAfterKeyDeleted: the token keeps growing when an operator deletes
// the key between two grants, where LockIndex starts again at 1.
func TestConsulTokenAfterKeyDeleted(t *testing.T) {
	agent := testenv.StartConsul(t, testenv.ConsulOptions{})
	op := admin(t, agent.Addr())
	b := newBackend(t, agent.Addr(), "deleted", 0)
	var tokens, lockIndexes []uint64
	for round := range 3 {
		for range 2 {
			l := campaign(t, b, "a")
			pair, _, err := op.KV().Get(b.Key(), nil)
			if err != nil || pair == nil {
				t.Fatalf("read %s: %v", b.Key(), err)
			}
			tokens = append(tokens, l.Token())
			lockIndexes = append(lockIndexes, pair.LockIndex)
			release(t, l)
		}
		if _, err := op.KV().Delete(b.Key(), nil); err != nil {
			t.Fatalf("round %d: delete %s: %v", round, b.Key(), err)
		}
	}
	t.Logf("tokens %v; LockIndex %v", tokens, lockIndexes)
	for i := 1; i < len(tokens); i++ {
		if tokens[i] <= tokens[i-1] {
			t.Errorf("grant %d: token %d not greater than %d (all %v)", i, tokens[i], tokens[i-1], tokens)
		}
	}
	// What the token must not be: LockIndex went back to 1 after each delete.
	if lockIndexes[2] != 1 || lockIndexes[1] != 2 {
		t.Errorf("LockIndex %v: expected it to restart at 1 after a delete (test premise)", lockIndexes)
	}
}

// TestConsulLockDelay: when the holder's session is destroyed, a waiter gets the
// lock once the holder's lock-delay has passed, and not before, without
// polling the agent meanwhile.
func TestConsulLockDelay(t *testing.T) {
	agent := testenv.StartConsul(t, testenv.ConsulOptions{})
	op := admin(t, agent.Addr())
	const delay = 2 * time.Second
	holder := newBackend(t, agent.Addr(), "delay", delay)
	counter := newCountingProxy(t, agent.Addr())
	waiter := newBackend(t, counter.addr(), "delay", 0)

	lh := campaign(t, holder, "holder")
	got := campaignAsync(waiter, "waiter")
	counter.waitBlocked(t, "/v1/kv/"+holder.Key())
	before := counter.count()
	destroy(t, op, sessionOf(t, lh))
	dropped := time.Now()
	select {
	case res := <-got:
		lw := res.get(t)
		took := time.Since(dropped)
		reqs := counter.requests()[before:]
		n := len(reqs)
		t.Logf("waiter acquired %v after the holder's session was destroyed (lock-delay %v), with %d requests: %v", took, delay, n, reqs)
		if took < delay-50*time.Millisecond {
			t.Errorf("acquired %v after the drop, before the lock-delay of %v had passed", took, delay)
		}
		if took > delay+500*time.Millisecond {
			t.Errorf("acquired %v after the drop, want within 500ms of the lock-delay of %v", took, delay)
		}
		if n > 10 {
			t.Errorf("%d requests while waiting out the lock-delay: polling", n)
		}
		if lw.Token() <= lh.Token() {
			t.Errorf("token %d after %d", lw.Token(), lh.Token())
		}
		release(t, lw)
	case <-time.After(delay + 10*time.Second):
		t.Fatal("waiter did not acquire the lock")
	}
	release(t, lh)
}

// TestConsulSessionDestroyedAtBirth: a lock session destroyed between its
// creation and the first acquisition (an operator cleaning up, a node check
// failing) makes the candidate start over with new ones, not fail.
func TestConsulSessionDestroyedAtBirth(t *testing.T) {
	agent := testenv.StartConsul(t, testenv.ConsulOptions{})
	op := admin(t, agent.Addr())
	var first atomic.Value
	proxy := newHookedProxy(t, agent.Addr(), func(_ http.ResponseWriter, r *http.Request) bool {
		if r.URL.Path != "/v1/txn" || first.Load() != nil {
			return false
		}
		sessions, _, err := op.Session().List(nil)
		if err != nil || len(sessions) != 1 {
			t.Errorf("sessions before the first acquisition: %v, %v; want the candidate's", sessions, err)
			return false
		}
		first.Store(sessions[0].ID)
		destroy(t, op, sessions[0].ID)
		return false
	})
	b := newBackend(t, proxy.addr(), "birth", 0)
	l := campaign(t, b, "a")
	if first.Load() == nil || sessionOf(t, l) == first.Load().(string) {
		t.Errorf("lease holds session %s; want a new one after %v was destroyed", sessionOf(t, l), first.Load())
	}
	release(t, l)
}

// TestConsulLossReasons: each way the key stops being ours closes Lost at once
// and Err says which.
func TestConsulLossReasons(t *testing.T) {
	agent := testenv.StartConsul(t, testenv.ConsulOptions{})
	op := admin(t, agent.Addr())
	cases := []struct {
		name string
		do   func(t *testing.T, key string, l *backends.Lease)
		want string
	}{
		{name: "session destroyed", want: "no longer holds", do: func(t *testing.T, key string, l *backends.Lease) {
			destroy(t, op, sessionOf(t, l))
		}},
		{name: "key deleted", want: "was deleted", do: func(t *testing.T, key string, l *backends.Lease) {
			if _, err := op.KV().Delete(key, nil); err != nil {
				t.Fatal(err)
			}
		}},
		{name: "key taken", want: "was taken by session", do: func(t *testing.T, key string, l *backends.Lease) {
			// Delete and acquire with another session: as if an operator
			// broke the lock and another tool took it.
			s, _, err := op.Session().Create(&api.SessionEntry{TTL: "10s"}, nil)
			if err != nil {
				t.Fatal(err)
			}
			t.Cleanup(func() { op.Session().Destroy(s, nil) })
			// In one transaction, so that the lease sees no deletion first.
			ok, resp, _, err := op.Txn().Txn(api.TxnOps{
				{KV: &api.KVTxnOp{Verb: api.KVDelete, Key: key}},
				{KV: &api.KVTxnOp{Verb: api.KVLock, Key: key, Value: []byte("intruder"), Session: s}},
			}, nil)
			if err != nil || !ok {
				t.Fatalf("take %s: %v %+v", key, err, resp)
			}
		}},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			b := newBackend(t, agent.Addr(), strings.ReplaceAll(tc.name, " ", "-"), 0)
			l := campaign(t, b, "a")
			defer release(t, l)
			tc.do(t, b.Key(), l)
			at := time.Now()
			select {
			case <-l.Lost():
				t.Logf("loss reported %v after the change: %v", time.Since(at), l.Err())
			case <-time.After(time.Second):
				t.Fatal("Lost() not closed within 1s")
			}
			if err := l.Err(); !errors.Is(err, backends.ErrLeaseLost) || !strings.Contains(err.Error(), tc.want) {
				t.Errorf("Err() = %v, want ErrLeaseLost saying %q", err, tc.want)
			}
			ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
			defer cancel()
			if err := l.Renew(ctx); !errors.Is(err, backends.ErrLeaseLost) {
				t.Errorf("Renew after loss = %v, want ErrLeaseLost", err)
			}
		})
	}
}

// TestConsulLeaseProperties: the lease reports the TTL Consul granted and the
// send time of the session's creation; the session carries the configured
// lock-delay, 0 included (the API's Create would send 15s for 0), and is
// bound to one health check only: the candidate's own TTL check on the
// agent (not serfHealth), of the lease's TTL, which the release removes.
func TestConsulLeaseProperties(t *testing.T) {
	agent := testenv.StartConsul(t, testenv.ConsulOptions{})
	op := admin(t, agent.Addr())
	for _, delay := range []time.Duration{0, 15 * time.Second, consul.MaxLockDelay} {
		b := newBackend(t, agent.Addr(), "props", delay)
		before := time.Now()
		l := campaign(t, b, "a")
		after := time.Now()
		if l.TTL() != ttl {
			t.Errorf("TTL() = %v, want %v", l.TTL(), ttl)
		}
		if l.Acquired().Before(before) || l.Acquired().After(after) {
			t.Errorf("Acquired() %v not within the campaign [%v, %v]", l.Acquired(), before, after)
		}
		info, _, err := op.Session().Info(sessionOf(t, l), nil)
		if err != nil || info == nil {
			t.Fatalf("session info: %v", err)
		}
		if info.LockDelay != delay || info.Behavior != api.SessionBehaviorRelease || info.TTL != "10s" ||
			len(info.Checks) != 0 || len(info.NodeChecks) != 1 || !strings.HasPrefix(info.NodeChecks[0], "leaderrun:") || len(info.ServiceChecks) != 0 {
			t.Fatalf("session %+v, want lock-delay %v, behavior release, TTL 10s, one leaderrun check", info, delay)
		}
		check := info.NodeChecks[0]
		checks, err := op.Agent().Checks()
		if c := checks[check]; err != nil || c == nil || c.Status != api.HealthPassing || c.Name != "leaderrun" || c.Type != "ttl" {
			t.Errorf("the agent's check %s: %+v, %v; want a passing TTL check", check, c, err)
		}
		st, err := b.Status(context.Background())
		if err != nil {
			t.Fatal(err)
		}
		if st.TTL != ttl || st.Node != agent.Node() || st.Remaining != -1 || st.Waiting != 0 || st.Key != "leaderrun-test/props" {
			t.Errorf("status %+v, want TTL %v, node %s, remaining -1, waiting 0", st, ttl, agent.Node())
		}
		release(t, l)
		if err := l.Release(context.Background(), nil); err != nil {
			t.Errorf("second release: %v", err)
		}
		if checks, err := op.Agent().Checks(); err != nil || checks[check] != nil {
			t.Errorf("after the release the agent still has check %s: %v", check, err)
		}
	}
}

// TestConsulUnavailable: an agent that cannot be reached, or that refuses the
// token, is ErrUnavailable to a --try and to status, naming the address and
// never the token, in the same words at every attempt (the campaign logs a
// failure once per change of its message).
func TestConsulUnavailable(t *testing.T) {
	const secret = "d9b1c2a4-secret-token"
	agent := testenv.StartConsul(t, testenv.ConsulOptions{ACLToken: "management-" + secret})
	closed := func() string {
		l, err := net.Listen("tcp", "127.0.0.1:0")
		if err != nil {
			t.Fatal(err)
		}
		defer l.Close()
		return l.Addr().String()
	}()
	cases := []struct{ name, addr, want string }{
		{name: "nothing listening", addr: closed, want: "connection refused"},
		{name: "token refused", addr: agent.Addr(), want: "403"},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			b := &tlock{s: openStore(t, tc.addr, secret, 0), name: "x"}
			ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
			defer cancel()
			_, cerr := b.Campaign(ctx, campaignOptions{Identity: "a", Try: true, LeaseDuration: ttl})
			_, again := b.Campaign(ctx, campaignOptions{Identity: "a", Try: true, LeaseDuration: ttl})
			if cerr == nil || again == nil || cerr.Error() != again.Error() {
				t.Errorf("two attempts failed as %v and as %v; want the same words", cerr, again)
			}
			_, serr := b.Status(ctx)
			for _, err := range []error{cerr, serr} {
				if !errors.Is(err, backends.ErrUnavailable) {
					t.Errorf("got %v, want ErrUnavailable", err)
					continue
				}
				msg := err.Error()
				if !strings.Contains(msg, tc.addr) || !strings.Contains(msg, tc.want) {
					t.Errorf("%q does not name the address %s and %q", msg, tc.addr, tc.want)
				}
				if strings.Contains(msg, secret) {
					t.Errorf("%q contains the token", msg)
				}
				t.Log(msg)
			}
		})
	}
}

func TestConsulOpenValidates(t *testing.T) {
	cases := []struct {
		name string
		cfg  consul.Config
		want string
	}{
		{name: "negative lock-delay", cfg: consul.Config{LockDelay: -time.Second}, want: "lock-delay -1s"},
		{name: "lock-delay too long", cfg: consul.Config{LockDelay: 61 * time.Second}, want: "lock-delay 1m1s"},
		{name: "bad scheme", cfg: consul.Config{API: &api.Config{Address: "ftp://u:pw@h:1"}}, want: "ftp://h:1"},
		{name: "user info", cfg: consul.Config{API: &api.Config{Address: "http://u:pw@h:1"}}, want: "http://h:1: user information"},
		{name: "user info, no scheme", cfg: consul.Config{API: &api.Config{Address: "u:pw@h:1"}}, want: "address h:1: user information"},
		{name: "user info that does not parse", cfg: consul.Config{API: &api.Config{Address: "http://u:p%zzw@h:1"}}, want: "http://h:1: user information"},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			_, err := consul.Open(tc.cfg)
			if err == nil || !strings.Contains(err.Error(), tc.want) {
				t.Errorf("Open() = %v, want an error saying %q", err, tc.want)
			}
			if err != nil && strings.Contains(err.Error(), "pw") {
				t.Errorf("%v shows the address's password", err)
			}
		})
	}
}

// TestConsulLeaseDurationBounds: the lease duration is the session TTL,
// which Consul takes from 10 s to 24 h; the runner asks before it
// campaigns, and the message names the flag.
func TestConsulLeaseDurationBounds(t *testing.T) {
	b, err := consul.Open(consul.Config{})
	if err != nil {
		t.Fatal(err)
	}
	cases := []struct {
		name string
		d    time.Duration
		ok   bool
	}{
		{name: "too short", d: 9 * time.Second},
		{name: "shortest", d: consul.MinTTL, ok: true},
		{name: "longest", d: consul.MaxTTL, ok: true},
		{name: "too long", d: 25 * time.Hour},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			err := b.CheckTimings(timings(tc.d))
			if (err == nil) != tc.ok {
				t.Errorf("CheckTimings with a lease of %v = %v, want ok=%v", tc.d, err, tc.ok)
			}
			if err != nil && (!strings.Contains(err.Error(), "10s and 24h") || !strings.Contains(err.Error(), "--lease-duration")) {
				t.Errorf("%v does not give the bounds and the flag", err)
			}
		})
	}
}

// TestConsulClusterLeaderChange: on a 3-server cluster, the Raft leader is
// stopped while one candidate holds the lock through one follower and
// another waits through the other. The holder's session survives the
// election, the waiter rides it out, and the waiter's token after the
// handover is greater: ModifyIndex is a Raft index, which a new leader
// continues.
func TestConsulClusterLeaderChange(t *testing.T) {
	servers := testenv.StartConsulCluster(t, 3)
	ops := make([]*api.Client, len(servers))
	for i, s := range servers {
		ops[i] = admin(t, s.Addr())
	}
	leaderOf := func() int {
		for {
			addr, err := ops[0].Status().Leader()
			if err == nil && addr != "" {
				host, _, _ := net.SplitHostPort(addr)
				for i, s := range servers {
					if sh, _, _ := net.SplitHostPort(s.Addr()); sh == host {
						return i
					}
				}
			}
			time.Sleep(50 * time.Millisecond)
		}
	}
	li := leaderOf()
	var (
		followers []*testenv.ConsulAgent
		other     *api.Client
	)
	for i, s := range servers {
		if i != li {
			followers = append(followers, s)
			other = ops[i]
		}
	}
	a := newBackend(t, followers[0].Addr(), "cluster", 0)
	counter := newCountingProxy(t, followers[1].Addr())
	b := newBackend(t, counter.addr(), "cluster", 0)
	la := campaign(t, a, "a")
	got := campaignAsync(b, "b")
	counter.waitBlocked(t, "/v1/kv/"+a.Key())

	stopped := time.Now()
	servers[li].Stop()
	waitUntil(t, "a new leader", func() bool {
		addr, err := other.Status().Leader()
		return err == nil && addr != "" && !strings.HasPrefix(addr, strings.Split(servers[li].Addr(), ":")[0]+":")
	})
	t.Logf("new Raft leader after %v", time.Since(stopped))
	waitUntil(t, "the holder's renewal through the new leader", func() bool {
		ctx, cancel := context.WithTimeout(context.Background(), time.Second)
		defer cancel()
		return la.Renew(ctx) == nil
	})
	select {
	case <-la.Lost():
		t.Fatalf("the holder lost its lease in the election: %v", la.Err())
	default:
	}
	released := time.Now()
	release(t, la)
	select {
	case res := <-got:
		lb := res.get(t)
		t.Logf("waiter acquired %v after the release; tokens %d then %d", time.Since(released), la.Token(), lb.Token())
		if lb.Token() <= la.Token() {
			t.Errorf("token %d after the election, not greater than %d", lb.Token(), la.Token())
		}
		release(t, lb)
	case <-time.After(15 * time.Second):
		t.Fatal("the waiter did not get the lock after the election")
	}
	servers[li].Start()
}

// TestConsulACLPolicies: the least a token needs, as docs/backends/consul.md
// gives it. To campaign, wait in the queue and take over from a silent
// holder: write on the keys under the prefix, on the sessions of the
// agent's node, and on the node itself (each candidate registers a TTL
// check there). For status: read on the keys; without session read it
// still shows the holder, token and waiters.
func TestConsulACLPolicies(t *testing.T) {
	t.Parallel()
	const root = "root-token-for-tests"
	agent := testenv.StartConsul(t, testenv.ConsulOptions{ACLToken: root})
	cfg := api.DefaultConfig()
	cfg.Address, cfg.Token = agent.Addr(), root
	op, err := api.NewClient(cfg)
	if err != nil {
		t.Fatal(err)
	}
	token := func(name, rules string) string {
		t.Helper()
		p, _, err := op.ACL().PolicyCreate(&api.ACLPolicy{Name: name, Rules: rules}, nil)
		if err != nil {
			t.Fatalf("policy %s: %v", name, err)
		}
		tok, _, err := op.ACL().TokenCreate(&api.ACLToken{Policies: []*api.ACLTokenPolicyLink{{ID: p.ID}}}, nil)
		if err != nil {
			t.Fatalf("token %s: %v", name, err)
		}
		return tok.SecretID
	}
	withToken := func(secret string) *tlock {
		return &tlock{s: openStore(t, agent.Addr(), secret, time.Second), name: "acl"}
	}
	// The policy of docs/backends/consul.md, for the prefix of these tests.
	runnerPolicy := `key_prefix "leaderrun-test/" { policy = "write" }
session_prefix "" { policy = "write" }
node_prefix "" { policy = "write" }`
	runnerToken := token("runner", runnerPolicy)
	runner, follower := withToken(runnerToken), withToken(runnerToken)
	reader := withToken(token("reader", `key_prefix "leaderrun-test/" { policy = "read" }`))

	l := campaign(t, runner, "holder")
	got := campaignFor(t, follower, "follower", ttl)
	waitWaiting(t, runner, 1)
	st, err := runner.Status(context.Background())
	if err != nil || !st.Held || st.Token != l.Token() || st.Waiting != 1 || st.TTL != ttl || st.Node != agent.Node() {
		t.Errorf("status with the runner's token: %+v, %v", st, err)
	}
	st, err = reader.Status(context.Background())
	if err != nil || !st.Held || st.Identity != "holder" || st.Token != l.Token() || st.Waiting != 1 || st.TTL != ttl || st.Node != "" {
		t.Errorf("status with a read-only token: %+v, %v; want holder, token, TTL and 1 waiting, no node", st, err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	if _, err := reader.Campaign(ctx, campaignOptions{Identity: "reader", LeaseDuration: ttl}); !errors.Is(err, backends.ErrUnavailable) || !strings.Contains(err.Error(), "403") {
		t.Errorf("campaign with a read-only token: %v, want ErrUnavailable (403)", err)
	}
	// The holder falls silent (no renewals): its check turns critical, its
	// session ends, and the follower, with the same policy, takes over.
	select {
	case res := <-got:
		lf := res.get(t)
		took := res.at.Sub(l.Acquired())
		t.Logf("the follower took over the silent holder %v after its last renewal", took.Round(time.Millisecond))
		if took <= ttl {
			t.Errorf("took over %v after the holder's last renewal, within its lease of %v", took, ttl)
		}
		select {
		case <-l.Lost():
		case <-time.After(time.Second):
			t.Error("the old holder did not report its loss")
		}
		release(t, lf)
	case <-time.After(ttl + 10*time.Second):
		t.Fatal("the follower did not take over the silent holder with the documented policy")
	}
	release(t, l)
}

// TestConsulCandidateNeedsNodeWrite: a token that may write the keys and
// its node's sessions, but not the node, cannot register the TTL check that
// each session is bound to: the campaign ends at once with ErrUnavailable
// naming the rule it needs (not a wait for ever), without the token.
func TestConsulCandidateNeedsNodeWrite(t *testing.T) {
	t.Parallel()
	const root = "root-token-for-tests"
	agent := testenv.StartConsul(t, testenv.ConsulOptions{ACLToken: root})
	cfg := api.DefaultConfig()
	cfg.Address, cfg.Token = agent.Addr(), root
	op, err := api.NewClient(cfg)
	if err != nil {
		t.Fatal(err)
	}
	p, _, err := op.ACL().PolicyCreate(&api.ACLPolicy{Name: "no-node", Rules: `key_prefix "leaderrun-test/" { policy = "write" }
session "` + agent.Node() + `" { policy = "write" }`}, nil)
	if err != nil {
		t.Fatal(err)
	}
	tok, _, err := op.ACL().TokenCreate(&api.ACLToken{Policies: []*api.ACLTokenPolicyLink{{ID: p.ID}}}, nil)
	if err != nil {
		t.Fatal(err)
	}
	b := &tlock{s: openStore(t, agent.Addr(), tok.SecretID, 0), name: "acl-node"}
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	_, err = b.Campaign(ctx, campaignOptions{Identity: "a", LeaseDuration: ttl})
	t.Logf("campaign without node write: %v", err)
	if !errors.Is(err, backends.ErrUnavailable) || !strings.Contains(err.Error(), "403") || !strings.Contains(err.Error(), `node_prefix ""`) {
		t.Errorf("got %v, want ErrUnavailable (403) naming the node rule", err)
	}
	if err != nil && strings.Contains(err.Error(), tok.SecretID) {
		t.Errorf("%v shows the token", err)
	}
	if ctx.Err() != nil {
		t.Error("the campaign waited for its context instead of failing at once")
	}
}
