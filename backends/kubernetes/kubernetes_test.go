package kubernetes_test

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"net/http"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"k8s.io/client-go/rest"

	"github.com/leaderrun/leaderrun/backends"
	"github.com/leaderrun/leaderrun/backends/backendtest"
	"github.com/leaderrun/leaderrun/backends/kubernetes"
	"github.com/leaderrun/leaderrun/internal/testenv"
)

// cluster is the shared apiserver and a namespace of the test's own in
// which KubeLimited has exactly the verbs the package doc asks for.
type cluster struct {
	k  *testenv.Kube
	ns string
}

func newCluster(t *testing.T) *cluster {
	t.Helper()
	k := testenv.SharedKube(t)
	ns := k.Namespace(t)
	k.Grant(t, ns, testenv.KubeLimited, "get", "create", "update", "watch")
	return &cluster{k: k, ns: ns}
}

// store opens the store as user, in the kubeconfig context's namespace,
// closed when the test ends.
func (c *cluster) store(t *testing.T, user string) *kubernetes.Store {
	t.Helper()
	api, err := kubernetes.LoadAPIConfig(kubernetes.LoadOptions{Kubeconfig: c.k.Kubeconfig(t, user, c.ns)})
	if err != nil {
		t.Fatal(err)
	}
	s, err := kubernetes.Open(api, "")
	if err != nil {
		t.Fatal(err)
	}
	if key := s.Lock("x").Key(); key != c.ns+"/leases/x" {
		t.Fatalf("lock at %q, want in the context's namespace %q", key, c.ns)
	}
	t.Cleanup(func() { s.Close() })
	return s
}

func (c *cluster) leasePath(lock string) string {
	return "/apis/coordination.k8s.io/v1/namespaces/" + c.ns + "/leases/" + lock
}

// spec reads the Lease's spec as the admin sees it.
func (c *cluster) spec(t *testing.T, lock string) map[string]any {
	t.Helper()
	var obj struct {
		Spec map[string]any `json:"spec"`
	}
	if err := json.Unmarshal(c.k.Admin(t, http.MethodGet, c.leasePath(lock), nil), &obj); err != nil {
		t.Fatal(err)
	}
	return obj.Spec
}

// setHolder plays an operator who edits the Lease's holderIdentity.
func (c *cluster) setHolder(t *testing.T, lock, holder string) {
	t.Helper()
	c.k.Admin(t, http.MethodPatch, c.leasePath(lock), map[string]any{"spec": map[string]any{"holderIdentity": holder}})
}

// deleteLease plays an operator who deletes the Lease.
func (c *cluster) deleteLease(t *testing.T, lock string) {
	t.Helper()
	c.k.Admin(t, http.MethodDelete, c.leasePath(lock), nil)
}

// timings of a lease of d: renewals every 300 ms, as the suite's.
func timings(d time.Duration) backends.Timings {
	return backends.Timings{LeaseDuration: d, RenewDeadline: d / 2, RetryPeriod: 300 * time.Millisecond, KillGrace: d / 4}
}

func candidate(id string, t backends.Timings) backends.Candidate {
	return backends.Candidate{Identity: id, Timings: t}
}

func campaign(t *testing.T, s backends.Store, lock, id string, d time.Duration) *backends.Lease {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	l, err := backends.Campaign(ctx, s, lock, candidate(id, timings(d)))
	if err != nil {
		t.Fatalf("%s: campaign: %v", id, err)
	}
	return l
}

// TestConformance runs the shared suite as a user that has only the
// verbs the package doc lists; Drop clears holderIdentity, as an operator
// forcing a release would.
func TestConformance(t *testing.T) {
	c := newCluster(t)
	backendtest.Run(t, backendtest.Harness{
		Open: func(t *testing.T) backends.Store { return c.store(t, testenv.KubeLimited) },
		Drop: func(t *testing.T, lock string, _ *backends.Lease) { c.setHolder(t, lock, "") },
	})
}

// TestThreeContendersTokensAcrossDeletes: three candidates hand the lock
// over 24 times, and every fourth time an operator deletes the Lease
// instead of letting its leader release it. They never lead at once, and
// every grant's token is greater than the one before, although the
// deletions restart leaseTransitions.
func TestThreeContendersTokensAcrossDeletes(t *testing.T) {
	c := newCluster(t)
	const lock, grants = "contended", 24
	var (
		holders atomic.Int32
		mu      sync.Mutex
		tokens  []uint64
		deletes int
		wg      sync.WaitGroup
	)
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	errs := make(chan error, 3)
	for i := range 3 {
		s := c.store(t, testenv.KubeLimited)
		wg.Go(func() {
			id := fmt.Sprintf("contender-%d", i)
			for {
				l, err := backends.Campaign(ctx, s, lock, candidate(id, timings(10*time.Second)))
				if err != nil {
					errs <- fmt.Errorf("%s: campaign: %w", id, err)
					return
				}
				if n := holders.Add(1); n != 1 {
					errs <- fmt.Errorf("%s: %d holders at once (token %d)", id, n, l.Token())
				}
				mu.Lock()
				tokens = append(tokens, l.Token())
				n := len(tokens)
				drop := n%4 == 0
				if drop {
					deletes++
				}
				mu.Unlock()
				time.Sleep(2 * time.Millisecond) // hold while the others queue
				holders.Add(-1)
				if drop {
					// Not deleteLease: t.Fatal is for the test's goroutine.
					if code, body := c.k.Request(t, testenv.KubeAdmin, http.MethodDelete, c.leasePath(lock), nil); code != http.StatusOK {
						errs <- fmt.Errorf("%s: delete the Lease: %d %s", id, code, body)
					}
					select {
					case <-l.Lost():
					case <-time.After(time.Second):
						errs <- fmt.Errorf("%s: deletion of the Lease not seen within 1s", id)
					}
				}
				rctx, rcancel := context.WithTimeout(context.Background(), 5*time.Second)
				err = l.Release(rctx, nil)
				rcancel()
				if err != nil {
					errs <- fmt.Errorf("%s: release: %w", id, err)
					return
				}
				if n >= grants {
					cancel() // the others stop waiting
					return
				}
			}
		})
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		if !errors.Is(err, context.Canceled) {
			t.Error(err)
		}
	}
	t.Logf("%d grants, %d deletions, tokens %v", len(tokens), deletes, tokens)
	if len(tokens) < grants || deletes < grants/4 {
		t.Fatalf("%d grants and %d deletions, want %d and %d", len(tokens), deletes, grants, grants/4)
	}
	for i := 1; i < len(tokens); i++ {
		if tokens[i] <= tokens[i-1] {
			t.Errorf("grant %d: token %d not greater than the previous grant's %d", i, tokens[i], tokens[i-1])
		}
	}
}

// TestTransitionsRestartTokensDoNot: the premise of the token design. A
// deleted and re-created Lease counts its transitions from 0 again; the
// token keeps growing.
func TestTransitionsRestartTokensDoNot(t *testing.T) {
	c := newCluster(t)
	s := c.store(t, testenv.KubeLimited)
	var tokens []uint64
	var transitions []float64
	for round := range 2 {
		for range 2 {
			l := campaign(t, s, "recreated", "a", 5*time.Second)
			tokens = append(tokens, l.Token())
			transitions = append(transitions, c.spec(t, "recreated")["leaseTransitions"].(float64))
			backendtest.Release(t, l)
		}
		if round == 0 {
			c.deleteLease(t, "recreated")
		}
	}
	t.Logf("tokens %v, leaseTransitions %v", tokens, transitions)
	if transitions[2] >= transitions[1] {
		t.Errorf("leaseTransitions %v did not restart after the deletion (test premise)", transitions)
	}
	for i := 1; i < len(tokens); i++ {
		if tokens[i] <= tokens[i-1] {
			t.Errorf("grant %d: token %d not greater than %d", i, tokens[i], tokens[i-1])
		}
	}
}

// TestLossSeenAtOnce: an operator deletes the Lease, gives it to someone
// else, or clears its holder; the leader's Lost closes within 1 s (the
// watch, not a renewal, tells it), Err says why, and Renew reports the
// loss.
func TestLossSeenAtOnce(t *testing.T) {
	c := newCluster(t)
	tests := []struct {
		name string
		do   func(t *testing.T, lock string)
		want string
	}{
		{"deleted", func(t *testing.T, lock string) { c.deleteLease(t, lock) }, "was deleted"},
		{"taken", func(t *testing.T, lock string) { c.setHolder(t, lock, "intruder") }, `taken by "intruder"`},
		{"holder cleared", func(t *testing.T, lock string) { c.setHolder(t, lock, "") }, `released by someone else`},
	}
	for i, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			lock := fmt.Sprintf("loss-%d", i)
			l := campaign(t, c.store(t, testenv.KubeLimited), lock, "leader", 15*time.Second)
			defer backendtest.Release(t, l)
			start := time.Now()
			tt.do(t, lock)
			select {
			case <-l.Lost():
				t.Logf("Lost closed %v after the operator's request was sent", time.Since(start))
			case <-time.After(time.Second):
				t.Fatal("Lost not closed within 1s")
			}
			if err := l.Err(); !errors.Is(err, backends.ErrLeaseLost) || !strings.Contains(err.Error(), tt.want) {
				t.Errorf("Err() = %v, want ErrLeaseLost saying %q", err, tt.want)
			}
			ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
			defer cancel()
			if err := l.Renew(ctx); !errors.Is(err, backends.ErrLeaseLost) {
				t.Errorf("Renew after the loss: %v, want ErrLeaseLost", err)
			}
		})
	}
}

// TestRenewKeepsOthersWrites: a label written by someone else between two
// renewals costs a conflict and a read, not the lease, and survives the
// renewal.
func TestRenewKeepsOthersWrites(t *testing.T) {
	c := newCluster(t)
	l := campaign(t, c.store(t, testenv.KubeLimited), "labelled", "leader", 15*time.Second)
	defer backendtest.Release(t, l)
	c.k.Admin(t, http.MethodPatch, c.leasePath("labelled"), map[string]any{
		"metadata": map[string]any{"labels": map[string]string{"team": "billing"}},
	})
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	if err := l.Renew(ctx); err != nil {
		t.Fatalf("renew after a label was added: %v", err)
	}
	var obj struct {
		Metadata struct {
			Labels map[string]string `json:"labels"`
		} `json:"metadata"`
	}
	if err := json.Unmarshal(c.k.Admin(t, http.MethodGet, c.leasePath("labelled"), nil), &obj); err != nil {
		t.Fatal(err)
	}
	if obj.Metadata.Labels["team"] != "billing" {
		t.Errorf("labels after the renewal: %v, want team=billing kept", obj.Metadata.Labels)
	}
	select {
	case <-l.Lost():
		t.Errorf("a label change was taken for a loss: %v", l.Err())
	default:
	}
}

// TestFollowerTimesTheRecord: a follower takes the Lease over only once
// its record has not changed for leaseDurationSeconds on the follower's
// clock. While the holder renews (the record changes), the follower waits;
// once it stops, the follower takes over no earlier than the lease
// duration after the last renewal was sent, and not much later.
func TestFollowerTimesTheRecord(t *testing.T) {
	c := newCluster(t)
	const d = 2 * time.Second
	lh := campaign(t, c.store(t, testenv.KubeLimited), "timed", "holder", d)
	defer backendtest.Release(t, lh)
	follower := c.store(t, testenv.KubeLimited)
	got := make(chan *backends.Lease, 1)
	go func() {
		l, err := backends.Campaign(context.Background(), follower, "timed", candidate("follower", timings(d)))
		if err != nil {
			t.Errorf("follower: %v", err)
		}
		got <- l
	}()
	// Renew for three lease durations: each renewal restarts the
	// follower's clock.
	var lastSent, lastAck time.Time
	for end := time.Now().Add(3 * d); time.Now().Before(end); {
		select {
		case l := <-got:
			if l != nil {
				backendtest.Release(t, l)
			}
			t.Fatalf("the follower took the Lease while the holder renewed it")
		case <-time.After(d / 4):
		}
		lastSent = time.Now()
		if err := lh.Renew(context.Background()); err != nil {
			t.Fatalf("renew: %v", err)
		}
		lastAck = time.Now()
	}
	select {
	case l := <-got:
		if l == nil {
			return
		}
		at := l.Acquired()
		t.Logf("follower took over %v after the last renewal was sent (lease %v)", at.Sub(lastSent), d)
		if at.Sub(lastSent) < d {
			t.Errorf("follower took over %v after the last renewal was sent, before the lease duration %v", at.Sub(lastSent), d)
		}
		if at.Sub(lastAck) > d+time.Second {
			t.Errorf("follower took over %v after the last renewal, want within 1s of the lease duration %v", at.Sub(lastAck), d)
		}
		// Renewals under a second apart: a client-go elector could miss one.
		if want := d - time.Second; l.TTL() != want {
			t.Errorf("TTL %v, want %v", l.TTL(), want)
		}
		select {
		case <-lh.Lost():
		case <-time.After(time.Second):
			t.Error("the old holder did not see the takeover within 1s")
		}
		backendtest.Release(t, l)
	case <-time.After(d + 5*time.Second):
		t.Fatal("follower did not take over")
	}
}

// TestLeaseSecondsRoundUp: leaseDurationSeconds is whole seconds, rounded
// up; the TTL is what was written when renewals are a second or more
// apart, a second less when they are not (and never zero), and the same
// after a renewal.
func TestLeaseSecondsRoundUp(t *testing.T) {
	c := newCluster(t)
	s := c.store(t, testenv.KubeLimited)
	tests := []struct {
		name    string
		asked   time.Duration
		retry   time.Duration
		written int32
		ttl     time.Duration
	}{
		{"whole", 3 * time.Second, time.Second, 3, 3 * time.Second},
		{"fraction", 2500 * time.Millisecond, 2 * time.Second, 3, 3 * time.Second},
		{"below one second", 100 * time.Millisecond, time.Second, 1, time.Second},
		{"fast renewals", 3 * time.Second, 999 * time.Millisecond, 3, 2 * time.Second},
		{"fast renewals, fraction", 2100 * time.Millisecond, 500 * time.Millisecond, 3, 2 * time.Second},
		{"fast renewals of one second: never zero", time.Second, 500 * time.Millisecond, 1, time.Nanosecond},
	}
	for i, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			lock := fmt.Sprintf("seconds-%d", i)
			tm := backends.Timings{LeaseDuration: tt.asked, RetryPeriod: tt.retry}
			l, err := backends.Campaign(context.Background(), s, lock, candidate("a", tm))
			if err != nil {
				t.Fatal(err)
			}
			defer backendtest.Release(t, l)
			if got := c.spec(t, lock)["leaseDurationSeconds"]; got != float64(tt.written) {
				t.Errorf("leaseDurationSeconds %v written, want %v", got, tt.written)
			}
			for _, when := range []string{"granted", "renewed"} {
				if l.TTL() != tt.ttl {
					t.Errorf("TTL %v when %s, for %v asked with retry %v; want %v", l.TTL(), when, tt.asked, tt.retry, tt.ttl)
				}
				if err := l.Renew(context.Background()); err != nil {
					t.Fatal(err)
				}
			}
		})
	}
}

// TestCheckTimings: timings that a client-go elector could cut short are
// refused, naming the flags; the same lease with renewals a second apart
// is not.
func TestCheckTimings(t *testing.T) {
	s, err := kubernetes.Open(&kubernetes.APIConfig{REST: &rest.Config{Host: "https://127.0.0.1:1"}}, "")
	if err != nil {
		t.Fatal(err)
	}
	ms := time.Millisecond
	for _, tt := range []struct {
		name                          string
		lease, deadline, retry, grace time.Duration
		ok                            bool
	}{
		{"defaults", 15 * time.Second, 10 * time.Second, 2 * time.Second, 3 * time.Second, true},
		{"fast renewals leave too little", 3 * time.Second, 2 * time.Second, 500 * ms, 600 * ms, false},
		{"fast renewals with lease to spare", 4 * time.Second, 2 * time.Second, 500 * ms, 600 * ms, true},
		{"one-second renewals, the same lease", 3 * time.Second, 2 * time.Second, time.Second, 600 * ms, true},
		{"fast renewals of a one-second lease", time.Second, 400 * ms, 300 * ms, 100 * ms, false},
	} {
		t.Run(tt.name, func(t *testing.T) {
			err := s.CheckTimings(backends.Timings{LeaseDuration: tt.lease, RenewDeadline: tt.deadline, RetryPeriod: tt.retry, KillGrace: tt.grace})
			switch {
			case tt.ok && err != nil:
				t.Errorf("refused: %v", err)
			case !tt.ok && err == nil:
				t.Error("accepted")
			case !tt.ok:
				for _, w := range []string{"--lease-duration", "--retry-period", "--renew-deadline", "--kill-grace", "client-go"} {
					if !strings.Contains(err.Error(), w) {
						t.Errorf("%q does not name %s", err, w)
					}
				}
			}
		})
	}
}

// TestRenewalsInDistinctSeconds: with a retry period of 1s or more, every
// renewal writes a renewTime in a later whole second than the one before,
// which is what a client-go elector compares; one sent within the second
// of the one before waits for the next second. With a shorter period
// renewals are written at once.
func TestRenewalsInDistinctSeconds(t *testing.T) {
	c := newCluster(t)
	renewTime := func(lock string) time.Time {
		at, err := time.Parse(time.RFC3339Nano, c.spec(t, lock)["renewTime"].(string))
		if err != nil {
			t.Fatal(err)
		}
		return at
	}
	for _, tt := range []struct {
		name      string
		retry     time.Duration
		distinct  bool
		renewals  int
		maxWaited time.Duration
	}{
		{"one second", time.Second, true, 4, 1500 * time.Millisecond},
		{"half a second", 500 * time.Millisecond, false, 4, 300 * time.Millisecond},
	} {
		t.Run(tt.name, func(t *testing.T) {
			lock := "distinct-" + strings.ReplaceAll(tt.name, " ", "-")
			tm := backends.Timings{LeaseDuration: 5 * time.Second, RetryPeriod: tt.retry}
			l, err := backends.Campaign(context.Background(), c.store(t, testenv.KubeLimited), lock, candidate("a", tm))
			if err != nil {
				t.Fatal(err)
			}
			defer backendtest.Release(t, l)
			prev := renewTime(lock)
			same := 0
			// Back to back, far faster than the retry period: the worst
			// case of renewals sent within one second.
			for i := range tt.renewals {
				began := time.Now()
				if err := l.Renew(context.Background()); err != nil {
					t.Fatalf("renewal %d: %v", i, err)
				}
				took := time.Since(began)
				at := renewTime(lock)
				if at.Unix() == prev.Unix() {
					same++
				}
				if took > tt.maxWaited {
					t.Errorf("renewal %d took %v, want under %v", i, took, tt.maxWaited)
				}
				t.Logf("renewal %d: renewTime %s, took %v", i, at.Format("15:04:05.000000"), took.Round(time.Millisecond))
				prev = at
			}
			if tt.distinct && same > 0 {
				t.Errorf("%d renewals wrote a renewTime in the second of the one before", same)
			}
			if !tt.distinct && same == 0 {
				t.Errorf("no renewal shared its second with the one before: the fast case waited")
			}
		})
	}
}

// TestRecordAsClientGo: the spec is what client-go's LeaseLock writes and
// kubectl shows: the holder, the duration in seconds, MicroTime stamps, a
// transition counted per grant; a release clears the holder and sets the
// duration to 1 s as ReleaseOnCancel does. The token annotation keeps its
// format, with the candidacy's owner added.
func TestRecordAsClientGo(t *testing.T) {
	c := newCluster(t)
	s := c.store(t, testenv.KubeLimited)
	l := campaign(t, s, "record", "host-a:123", 15*time.Second)
	spec := c.spec(t, "record")
	if spec["holderIdentity"] != "host-a:123" || spec["leaseDurationSeconds"] != 15.0 || spec["leaseTransitions"] != 1.0 {
		t.Errorf("spec while held: %v", spec)
	}
	for _, f := range []string{"acquireTime", "renewTime"} {
		if s, _ := spec[f].(string); len(s) != len("2006-01-02T15:04:05.000000Z") {
			t.Errorf("%s = %v, want a MicroTime", f, spec[f])
		}
	}
	var obj struct {
		Metadata struct {
			Annotations map[string]string `json:"annotations"`
		} `json:"metadata"`
	}
	if err := json.Unmarshal(c.k.Admin(t, http.MethodGet, c.leasePath("record"), nil), &obj); err != nil {
		t.Fatal(err)
	}
	want := fmt.Sprintf(`{"token":"%d","holder":"host-a:123","transitions":1,"owner":"`, l.Token())
	if got := obj.Metadata.Annotations["leaderrun/token"]; !strings.HasPrefix(got, want) {
		t.Errorf("leaderrun/token = %s, want %s...", got, want)
	}
	backendtest.Release(t, l)
	spec = c.spec(t, "record")
	if spec["holderIdentity"] != "" || spec["leaseDurationSeconds"] != 1.0 || spec["leaseTransitions"] != 1.0 {
		t.Errorf("spec after release: %v", spec)
	}
	l = campaign(t, s, "record", "host-b:456", 15*time.Second)
	defer backendtest.Release(t, l)
	if spec = c.spec(t, "record"); spec["leaseTransitions"] != 2.0 {
		t.Errorf("leaseTransitions after the second grant: %v, want 2", spec["leaseTransitions"])
	}
}

// TestOldReleaseDocuments: history and markers that an older leaderrun
// wrote into the Lease's annotations (the same JSON) are read, and its
// grant (a token annotation without an owner) holds its Lease: a newer
// leaderrun waits, and takes over with a larger token.
func TestOldReleaseDocuments(t *testing.T) {
	c := newCluster(t)
	now := time.Now().UTC()
	stamp := now.Format("2006-01-02T15:04:05.000000Z")
	c.k.Admin(t, http.MethodPost, "/apis/coordination.k8s.io/v1/namespaces/"+c.ns+"/leases", map[string]any{
		"apiVersion": "coordination.k8s.io/v1", "kind": "Lease",
		"metadata": map[string]any{"name": "old", "annotations": map[string]string{
			"leaderrun/token":   `{"token":"9000","holder":"old-host","transitions":4}`,
			"leaderrun/history": `[{"identity":"older-host","token":8000,"acquired":"2026-01-01T00:00:00Z","ended":"2026-01-01T00:01:00Z","end":"exited","exit_code":0}]`,
			"leaderrun/markers": fmt.Sprintf(`[{"key":"day-1","identity":"older-host","token":8000,"at":%q,"expires":%q}]`,
				now.Format(time.RFC3339Nano), now.Add(time.Hour).Format(time.RFC3339Nano)),
		}},
		"spec": map[string]any{"holderIdentity": "old-host", "leaseDurationSeconds": 2,
			"acquireTime": stamp, "renewTime": stamp, "leaseTransitions": 4},
	})
	s := c.store(t, testenv.KubeLimited)
	ctx := context.Background()
	st, err := backends.ReadStatus(ctx, s, "old")
	if err != nil || !st.Held || st.Identity != "old-host" || st.Token != 9000 {
		t.Errorf("status of the old grant: %+v, %v", st, err)
	}
	terms, err := backends.ReadHistory(ctx, s, "old", 0)
	if err != nil || len(terms) != 1 || terms[0].Token != 8000 {
		t.Errorf("old history: %+v, %v", terms, err)
	}
	if m, err := backends.ReadMarker(ctx, s, "old", "day-1"); err != nil || m == nil || m.Token != 8000 {
		t.Errorf("old marker: %+v, %v", m, err)
	}
	start := time.Now()
	l := campaign(t, s, "old", "new-host", 5*time.Second)
	defer backendtest.Release(t, l)
	if took := time.Since(start); took < 2*time.Second || l.Token() <= 9000 {
		t.Errorf("took the old grant's Lease after %v with token %d; want after its 2s, with a token over 9000", took, l.Token())
	}
}

// TestTryOnStaleRecord: a try that finds a record whose timestamps say it
// expired long ago does not give up at once (the holder may be dead) but
// does not trust the timestamps either: it takes the Lease once the record
// has not changed for the lease duration on its own clock.
func TestTryOnStaleRecord(t *testing.T) {
	c := newCluster(t)
	stale := time.Now().Add(-time.Hour).UTC().Format("2006-01-02T15:04:05.000000Z")
	c.k.Admin(t, http.MethodPost, "/apis/coordination.k8s.io/v1/namespaces/"+c.ns+"/leases", map[string]any{
		"apiVersion": "coordination.k8s.io/v1", "kind": "Lease",
		"metadata": map[string]any{"name": "stale"},
		"spec": map[string]any{"holderIdentity": "dead-host", "leaseDurationSeconds": 1,
			"acquireTime": stale, "renewTime": stale, "leaseTransitions": 3},
	})
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	try := candidate("b", timings(5*time.Second))
	try.Try = true
	start := time.Now()
	l, err := backends.Campaign(ctx, c.store(t, testenv.KubeLimited), "stale", try)
	if err != nil {
		t.Fatalf("try on a stale record: %v", err)
	}
	defer backendtest.Release(t, l)
	took := time.Since(start)
	t.Logf("try took the stale Lease after %v", took)
	if took < time.Second {
		t.Errorf("took the Lease after %v, before its 1s lease duration passed on our clock", took)
	}

	// A live holder: ErrLocked at once.
	try.Identity = "c"
	start = time.Now()
	if l2, err := backends.Campaign(ctx, c.store(t, testenv.KubeLimited), "stale", try); !errors.Is(err, backends.ErrLocked) {
		if l2 != nil {
			backendtest.Release(t, l2)
		}
		t.Fatalf("try on a live holder: %v, want ErrLocked", err)
	}
	if d := time.Since(start); d > 100*time.Millisecond {
		t.Errorf("ErrLocked after %v, want well under 100ms", d)
	}
}

// TestRefusedVerbs: a user that lacks one of the verbs gets a refusal
// (ErrRefused, with ErrUnavailable), at once, in every mode that needs the
// verb, naming the verb, and never the token. A waiter needs neither
// create nor update while someone else holds the Lease: it waits.
func TestRefusedVerbs(t *testing.T) {
	k := testenv.SharedKube(t)
	all := []string{"get", "create", "update", "watch"}
	tests := []struct {
		name    string
		missing string
		try     bool
		held    bool // by a user with every verb
		waits   bool // the campaign needs no refused verb yet
	}{
		{name: "get/try", missing: "get", try: true},
		{name: "get/wait", missing: "get"},
		{name: "get/held", missing: "get", held: true},
		{name: "create/try", missing: "create", try: true},
		{name: "create/wait", missing: "create"},
		{name: "create/held", missing: "create", held: true, waits: true},
		{name: "update/try", missing: "update", try: true},
		{name: "update/wait", missing: "update"},
		{name: "update/held", missing: "update", held: true, waits: true},
		{name: "watch/try", missing: "watch", try: true},
		{name: "watch/wait", missing: "watch"},
		{name: "watch/held", missing: "watch", held: true},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			var verbs []string
			for _, v := range all {
				if v != tt.missing {
					verbs = append(verbs, v)
				}
			}
			c := &cluster{k: k, ns: k.Namespace(t)}
			k.Grant(t, c.ns, testenv.KubeLimited, verbs...)
			k.Grant(t, c.ns, testenv.KubeOther, all...)
			if tt.held {
				l := campaign(t, c.store(t, testenv.KubeOther), "refused", "holder", 15*time.Second)
				defer backendtest.Release(t, l)
			}
			timeout := 10 * time.Second
			if tt.waits {
				timeout = time.Second
			}
			ctx, cancel := context.WithTimeout(context.Background(), timeout)
			defer cancel()
			cand := candidate("limited", timings(15*time.Second))
			cand.Try = tt.try
			start := time.Now()
			l, err := backends.Campaign(ctx, c.store(t, testenv.KubeLimited), "refused", cand)
			if err == nil {
				backendtest.Release(t, l)
				t.Fatalf("campaign without %s succeeded", tt.missing)
			}
			if tt.waits {
				if !errors.Is(err, context.DeadlineExceeded) {
					t.Fatalf("waiting without %s while the Lease is held: %v, want to wait", tt.missing, err)
				}
				return
			}
			t.Logf("after %v: %v", time.Since(start), err)
			if !errors.Is(err, backends.ErrRefused) || !errors.Is(err, backends.ErrUnavailable) {
				t.Errorf("error %v does not wrap ErrRefused and ErrUnavailable", err)
			}
			if want := "cannot " + tt.missing + ` resource "leases"`; !strings.Contains(err.Error(), want) {
				t.Errorf("error %q does not say %q", err, want)
			}
			if strings.Contains(err.Error(), k.Token(testenv.KubeLimited)) {
				t.Errorf("error %q shows the token", err)
			}
			if d := time.Since(start); d > 2*time.Second {
				t.Errorf("refusal took %v, want at once", d)
			}
			// Nothing is left held by the refused candidate.
			st, err := backends.ReadStatus(ctx, c.store(t, testenv.KubeOther), "refused")
			if err != nil || st.Identity == "limited" {
				t.Errorf("status after the refusal: %+v, %v; want the Lease not held by the refused candidate", st, err)
			}
		})
	}
}

// TestMissingNamespace: a namespace that does not exist is a final error
// that names it, not a wait.
func TestMissingNamespace(t *testing.T) {
	c := &cluster{k: testenv.SharedKube(t), ns: "no-such-namespace"}
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	l, err := backends.Campaign(ctx, c.store(t, testenv.KubeAdmin), "lock", candidate("a", timings(5*time.Second)))
	if err == nil {
		backendtest.Release(t, l)
		t.Fatal("campaign in a namespace that does not exist succeeded")
	}
	if !errors.Is(err, backends.ErrRefused) || !strings.Contains(err.Error(), `namespaces "no-such-namespace" not found`) {
		t.Errorf("campaign in a missing namespace: %v, want a refusal naming it", err)
	}
}

// TestLockNames: lock names must be Lease names.
func TestLockNames(t *testing.T) {
	tests := []struct {
		name string
		lock string
		ok   bool
	}{
		{"plain", "billing", true},
		{"digits and dashes", "job-42", true},
		{"dotted", "billing.v2-eu", true},
		{"one character", "a", true},
		{"128 characters", strings.Repeat("a", 128), true},
		{"uppercase", "Billing", false},
		{"underscore", "bill_ing", false},
		{"leading dash", "-billing", false},
		{"trailing dash", "billing-", false},
		{"leading dot", ".billing", false},
		{"empty part", "a..b", false},
		{"part ending in dash", "a-.b", false},
		{"slash", "a/b", false},
		{"empty", "", false},
		{"129 characters", strings.Repeat("a", 129), false},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			err := kubernetes.ValidateLockName(tt.lock)
			if tt.ok && err != nil {
				t.Errorf("lock %q refused: %v", tt.lock, err)
			}
			if !tt.ok && (err == nil || !strings.Contains(err.Error(), "RFC 1123 subdomain")) {
				t.Errorf("lock %q: %v, want an error naming the rule", tt.lock, err)
			}
		})
	}
}

// TestRoleByName: a Role that names the Lease (resourceNames) for get,
// update and watch, and grants create, suffices: the watch selects the
// Lease by name, which RBAC authorizes as that name.
func TestRoleByName(t *testing.T) {
	k := testenv.SharedKube(t)
	c := &cluster{k: k, ns: k.Namespace(t)}
	rbac := "/apis/rbac.authorization.k8s.io/v1/namespaces/" + c.ns
	k.Admin(t, http.MethodPost, rbac+"/roles", map[string]any{
		"apiVersion": "rbac.authorization.k8s.io/v1", "kind": "Role",
		"metadata": map[string]any{"name": "one-lease"},
		"rules": []any{
			map[string]any{"apiGroups": []string{"coordination.k8s.io"}, "resources": []string{"leases"},
				"resourceNames": []string{"named"}, "verbs": []string{"get", "update", "watch"}},
			map[string]any{"apiGroups": []string{"coordination.k8s.io"}, "resources": []string{"leases"},
				"verbs": []string{"create"}},
		},
	})
	k.Admin(t, http.MethodPost, rbac+"/rolebindings", map[string]any{
		"apiVersion": "rbac.authorization.k8s.io/v1", "kind": "RoleBinding",
		"metadata": map[string]any{"name": "one-lease"},
		"roleRef":  map[string]any{"apiGroup": "rbac.authorization.k8s.io", "kind": "Role", "name": "one-lease"},
		"subjects": []any{map[string]any{"kind": "User", "apiGroup": "rbac.authorization.k8s.io", "name": testenv.KubeLimited}},
	})
	a, b := c.store(t, testenv.KubeLimited), c.store(t, testenv.KubeLimited)
	la := campaign(t, a, "named", "a", 5*time.Second)
	// A waiter watches: were the watch refused, this would be a refusal,
	// not the end of its wait.
	ctx, cancel := context.WithTimeout(context.Background(), 500*time.Millisecond)
	defer cancel()
	if lb, err := backends.Campaign(ctx, b, "named", candidate("b", timings(5*time.Second))); !errors.Is(err, context.DeadlineExceeded) {
		if lb != nil {
			backendtest.Release(t, lb)
		}
		t.Fatalf("waiter restricted to the Lease's name: %v, want to wait", err)
	}
	backendtest.Release(t, la)
	backendtest.Release(t, campaign(t, b, "named", "b", 5*time.Second))
	// Another lock's Lease is out of reach.
	if _, err := backends.Campaign(context.Background(), a, "other", candidate("a", timings(5*time.Second))); !errors.Is(err, backends.ErrRefused) {
		t.Errorf("campaign for a Lease the Role does not name: %v, want a refusal", err)
	}
}

// TestForbiddenAfterAllowed: an apiserver that has just restarted answers
// 403 until its authorizer has synced (seen in the e2e outage scenario).
// A waiting candidate retries a 403 to a verb the apiserver authorized
// before, as an outage, and wins the lock once authorized again; a 403
// to a verb never authorized stays a refusal at once (TestRefusedVerbs).
func TestForbiddenAfterAllowed(t *testing.T) {
	k := testenv.SharedKube(t)
	c := &cluster{k: k, ns: k.Namespace(t)}
	k.Grant(t, c.ns, testenv.KubeLimited, "get", "create", "update", "watch")
	k.Grant(t, c.ns, testenv.KubeOther, "get", "create", "update", "watch")
	limited := c.store(t, testenv.KubeLimited)
	// limited takes and gives up the lock once: every verb authorized.
	backendtest.Release(t, campaign(t, limited, "syncing", "limited", 15*time.Second))
	held := campaign(t, c.store(t, testenv.KubeOther), "syncing", "other", 15*time.Second)

	var logs syncBuffer
	cand := candidate("limited", timings(15*time.Second))
	cand.Wait = 60 * time.Second
	cand.Log = slog.New(slog.NewTextHandler(&logs, nil))
	type result struct {
		l   *backends.Lease
		err error
	}
	done := make(chan result, 1)
	go func() {
		l, err := backends.Campaign(context.Background(), limited, "syncing", cand)
		done <- result{l, err}
	}()
	// limited loses its permissions while it waits; the lock is freed.
	rbs := "/apis/rbac.authorization.k8s.io/v1/namespaces/" + c.ns + "/rolebindings"
	var list struct {
		Items []struct {
			Metadata struct{ Name string }
			Subjects []struct{ Name string }
		}
	}
	if err := json.Unmarshal(k.Admin(t, http.MethodGet, rbs, nil), &list); err != nil {
		t.Fatal(err)
	}
	for _, rb := range list.Items {
		if len(rb.Subjects) == 1 && rb.Subjects[0].Name == testenv.KubeLimited {
			k.Admin(t, http.MethodDelete, rbs+"/"+rb.Metadata.Name, nil)
		}
	}
	backendtest.Release(t, held)
	deadline := time.Now().Add(30 * time.Second)
	for !strings.Contains(logs.String(), "forbidden") {
		select {
		case r := <-done:
			t.Fatalf("campaign ended at a 403 to a verb authorized before: %v", r.err)
		default:
		}
		if time.Now().After(deadline) {
			t.Fatalf("no 403 retried within 30 s; log:\n%s", logs.String())
		}
		time.Sleep(20 * time.Millisecond) // polling the log: nothing to wait on
	}
	k.Grant(t, c.ns, testenv.KubeLimited, "get", "create", "update", "watch")
	r := <-done
	if r.err != nil {
		t.Fatalf("campaign: %v, want the lock once authorized again; log:\n%s", r.err, logs.String())
	}
	backendtest.Release(t, r.l)
}

// syncBuffer is a bytes.Buffer safe for a logger and a test's reads.
type syncBuffer struct {
	mu sync.Mutex
	b  bytes.Buffer
}

func (s *syncBuffer) Write(p []byte) (int, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.Write(p)
}
func (s *syncBuffer) String() string { s.mu.Lock(); defer s.mu.Unlock(); return s.b.String() }
