package kubernetes

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"testing"
	"time"

	"k8s.io/client-go/rest"

	"github.com/leaderrun/leaderrun/backends"
	"github.com/leaderrun/leaderrun/internal/testenv"
)

// countingTransport counts the requests a store sends.
type countingTransport struct {
	base http.RoundTripper
	mu   sync.Mutex
	reqs []string
}

func (c *countingTransport) RoundTrip(r *http.Request) (*http.Response, error) {
	c.mu.Lock()
	c.reqs = append(c.reqs, r.Method+" "+r.URL.RequestURI())
	c.mu.Unlock()
	return c.base.RoundTrip(r)
}

func (c *countingTransport) requests() []string {
	c.mu.Lock()
	defer c.mu.Unlock()
	return append([]string(nil), c.reqs...)
}

// openLimited opens a store as KubeLimited, with every verb, in a
// namespace of the test's own.
func openLimited(t *testing.T) (*Store, *testenv.Kube, string) {
	t.Helper()
	k := testenv.SharedKube(t)
	ns := k.Namespace(t)
	k.Grant(t, ns, testenv.KubeLimited, "get", "create", "update", "watch")
	return openAs(t, k, ns), k, ns
}

func openAs(t *testing.T, k *testenv.Kube, ns string) *Store {
	t.Helper()
	cfg, err := LoadAPIConfig(LoadOptions{Kubeconfig: k.Kubeconfig(t, testenv.KubeLimited, ns)})
	if err != nil {
		t.Fatal(err)
	}
	s, err := Open(cfg, "")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { s.Close() })
	return s
}

// TestIdleFollowerOnlyWatches: a follower reads the Lease once and then
// only holds a watch open while the holder renews: every renewal wakes
// it, and costs it no request.
func TestIdleFollowerOnlyWatches(t *testing.T) {
	holder, k, ns := openLimited(t)
	follower := openAs(t, k, ns)
	counter := &countingTransport{base: follower.rest.Client.Transport}
	follower.rest.Client.Transport = counter
	ctx := context.Background()
	tm := backends.Timings{LeaseDuration: 2 * time.Second, RetryPeriod: 200 * time.Millisecond}
	lh, err := backends.Campaign(ctx, holder, "idle", backends.Candidate{Identity: "holder", Timings: tm})
	if err != nil {
		t.Fatal(err)
	}
	defer lh.Release(ctx, nil)
	wctx, cancel := context.WithTimeout(ctx, 3*time.Second)
	defer cancel()
	done := make(chan error, 1)
	go func() {
		_, err := backends.Campaign(wctx, follower, "idle", backends.Candidate{Identity: "follower", Timings: tm})
		done <- err
	}()
	renewals := 0
	for wctx.Err() == nil {
		time.Sleep(200 * time.Millisecond)
		if err := lh.Renew(ctx); err != nil {
			t.Fatalf("renew: %v", err)
		}
		renewals++
	}
	if err := <-done; !errors.Is(err, context.DeadlineExceeded) {
		t.Fatalf("follower: %v, want to have waited until its deadline", err)
	}
	// The driver also reads slot 1 once, beside the campaign, to check
	// that no pool holds the lock.
	reqs := counter.requests()
	t.Logf("follower sent %d requests while the holder renewed %d times: %q", len(reqs), renewals, reqs)
	kinds := map[string]int{}
	for _, r := range reqs {
		switch {
		case strings.Contains(r, "watch=true"):
			kinds["watch"]++
		case strings.HasSuffix(r, "/leases/idle"):
			kinds["read"]++
		case strings.HasSuffix(r, "/leases/idle.slot1"):
			kinds["slot 1"]++
		}
	}
	if len(reqs) != 3 || kinds["read"] != 1 || kinds["slot 1"] != 1 || kinds["watch"] != 1 {
		t.Errorf("follower sent %q, want one read, one of slot 1 and one watch", reqs)
	}
}

// TestWriteFindsLoss: a renewal or a fenced document written after
// someone else took the Lease finds that holder's record: the write
// reports the loss, and the other holder's record is left alone.
func TestWriteFindsLoss(t *testing.T) {
	s, k, ns := openLimited(t)
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	tests := []struct {
		name  string
		write func(l *lock, held backends.Record) error
	}{
		{"keep", func(l *lock, held backends.Record) error {
			_, err := l.Keep(ctx, held)
			return err
		}},
		{"document", func(l *lock, held backends.Record) error {
			d, err := l.ReadDoc(ctx, backends.DocMarkers)
			if err != nil {
				return err
			}
			d.Data = []byte("[]")
			return l.WriteDocHeld(ctx, d, held)
		}},
	}
	for i, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			name := fmt.Sprintf("write-loss-%d", i)
			l := s.Lock(name).(*lock)
			prev, err := l.Get(ctx)
			if err != nil {
				t.Fatal(err)
			}
			held, err := l.Take(ctx, prev, backends.Claim{Identity: "leader", Owner: "o1", Timings: backends.DefaultTimings})
			if err != nil {
				t.Fatal(err)
			}
			path := "/apis/coordination.k8s.io/v1/namespaces/" + ns + "/leases/" + name
			k.Admin(t, http.MethodPatch, path, map[string]any{"spec": map[string]any{"holderIdentity": "intruder"}})
			if err := tt.write(l, held); !errors.Is(err, backends.ErrLeaseLost) || !strings.Contains(err.Error(), `taken by "intruder"`) {
				t.Errorf("%s after the holder was changed: %v, want ErrLeaseLost naming the intruder", tt.name, err)
			}
			var obj struct {
				Spec struct {
					HolderIdentity string `json:"holderIdentity"`
				} `json:"spec"`
				Metadata struct {
					Annotations map[string]string `json:"annotations"`
				} `json:"metadata"`
			}
			if err := json.Unmarshal(k.Admin(t, http.MethodGet, path, nil), &obj); err != nil {
				t.Fatal(err)
			}
			if obj.Spec.HolderIdentity != "intruder" || obj.Metadata.Annotations[annotationDoc+backends.DocMarkers] != "" {
				t.Errorf("after the failed %s: holder %q, annotations %q; want the intruder's record untouched",
					tt.name, obj.Spec.HolderIdentity, obj.Metadata.Annotations)
			}
			if err := l.Free(ctx, held); err != nil {
				t.Errorf("free of a lost grant: %v, want nil", err)
			}
			if obj := l.cur; obj == nil || deref(obj.Spec.HolderIdentity) != "intruder" {
				t.Errorf("the free wrote over the intruder's record")
			}
		})
	}
}

// TestGuaranteedTTL: what the runner may count on after its last
// renewal's send time, given the seconds written and the retry period.
func TestGuaranteedTTL(t *testing.T) {
	for _, tt := range []struct {
		name    string
		seconds int32
		retry   time.Duration
		want    time.Duration
	}{
		{"default retry", 15, 2 * time.Second, 15 * time.Second},
		{"one second retry", 3, time.Second, 3 * time.Second},
		{"just under a second", 3, 999 * time.Millisecond, 2 * time.Second},
		{"fast", 10, 200 * time.Millisecond, 9 * time.Second},
		{"retry unknown", 10, 0, 9 * time.Second},
		{"one second lease, slow renewals", 1, time.Second, time.Second},
		{"one second lease, fast renewals: never zero", 1, 500 * time.Millisecond, time.Nanosecond},
	} {
		t.Run(tt.name, func(t *testing.T) {
			if got := guaranteedTTL(tt.seconds, tt.retry); got != tt.want {
				t.Errorf("guaranteedTTL(%d, %v) = %v, want %v", tt.seconds, tt.retry, got, tt.want)
			}
		})
	}
}

// TestSameSecondWait: a renewal in the whole second of the one before
// waits for the next second; one in a later (or, the clock stepped back,
// an earlier) second does not.
func TestSameSecondWait(t *testing.T) {
	base := time.Date(2030, 1, 2, 3, 4, 5, 0, time.UTC)
	at := func(d time.Duration) time.Time { return base.Add(d) }
	for _, tt := range []struct {
		name      string
		prev, now time.Time
		want      time.Duration
	}{
		{"no renewal before", time.Time{}, at(300 * time.Millisecond), 0},
		{"same second", at(100 * time.Millisecond), at(900 * time.Millisecond), 100 * time.Millisecond},
		{"same second, microseconds apart", at(999_990 * time.Microsecond), at(999_995 * time.Microsecond), 5 * time.Microsecond},
		{"on the boundary", at(999 * time.Millisecond), at(time.Second), 0},
		{"next second", at(900 * time.Millisecond), at(1100 * time.Millisecond), 0},
		{"clock stepped back a second", at(1500 * time.Millisecond), at(400 * time.Millisecond), 0},
		{"clock stepped back within the second", at(800 * time.Millisecond), at(200 * time.Millisecond), 800 * time.Millisecond},
		{"other time zone", at(100 * time.Millisecond).In(time.FixedZone("X", 5400)), at(600 * time.Millisecond), 400 * time.Millisecond},
	} {
		t.Run(tt.name, func(t *testing.T) {
			if got := sameSecondWait(tt.prev, tt.now); got != tt.want {
				t.Errorf("sameSecondWait(%v, %v) = %v, want %v", tt.prev, tt.now, got, tt.want)
			}
		})
	}
}

// TestWatchBoundIsPerEvent: the 4 MiB bound of a watch counts each event,
// not the stream: a watch of 60 events of 200 KiB each (12 MiB) delivers
// them all, and one event of more than 4 MiB, after them, breaks it, for
// good: Get says so, as a refusal.
func TestWatchBoundIsPerEvent(t *testing.T) {
	big := strings.Repeat("a", 200<<10)
	event := func(rv int, annotation string) string {
		return fmt.Sprintf(`{"type":"MODIFIED","object":{"apiVersion":"coordination.k8s.io/v1","kind":"Lease",`+
			`"metadata":{"name":"w","namespace":"ns","resourceVersion":"%d","annotations":{"x":%q}},"spec":{"holderIdentity":"h"}}}`+"\n", rv, annotation)
	}
	const events = 60
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.URL.Query().Get("watch") != "true" {
			http.NotFound(w, r)
			return
		}
		w.Header().Set("Content-Type", "application/json")
		for i := range events {
			fmt.Fprint(w, event(i+2, big))
		}
		fmt.Fprint(w, event(events+2, strings.Repeat("b", maxAnswer+1)))
		<-r.Context().Done()
	}))
	defer srv.Close()
	s, err := Open(&APIConfig{REST: &rest.Config{Host: srv.URL}, Source: "test"}, "ns")
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	l := s.Lock("w").(*lock)
	f, err := l.Follow(context.Background(), backends.Claim{}, nil)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	deadline := time.After(30 * time.Second)
	for {
		select {
		case <-f.Changed():
		case <-deadline:
			t.Fatal("no error for the oversized event")
		}
		l.mu.Lock()
		last, broken := l.cur, l.broken
		l.mu.Unlock()
		if broken == nil {
			continue
		}
		t.Logf("after the event of version %s: %v", last.ResourceVersion, broken)
		if last.ResourceVersion != fmt.Sprint(events+1) || len(last.Annotations["x"]) != len(big) {
			t.Fatalf("the last event taken in is of version %s, want all %d", last.ResourceVersion, events)
		}
		if !errors.Is(broken, errProtocol) || !strings.Contains(broken.Error(), "larger than 4 MiB") {
			t.Fatalf("watch broken by %v, want the oversized event refused", broken)
		}
		if _, err := l.Get(context.Background()); !errors.Is(err, backends.ErrRefused) {
			t.Fatalf("Get after the oversized event: %v, want a refusal", err)
		}
		return
	}
}
