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

// countingTransport counts the requests a backend sends.
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

// TestIdleFollowerOnlyWatches: a follower reads the Lease once and then
// only holds a watch open while the holder renews: no polling.
func TestIdleFollowerOnlyWatches(t *testing.T) {
	k := testenv.SharedKube(t)
	ns := k.Namespace(t)
	k.Grant(t, ns, testenv.KubeLimited, "get", "create", "update", "watch")
	newB := func() *Backend {
		cfg, err := LoadAPIConfig(LoadOptions{Kubeconfig: k.Kubeconfig(t, testenv.KubeLimited, ns)})
		if err != nil {
			t.Fatal(err)
		}
		b, err := New(Config{API: cfg, Lock: "idle"})
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { b.Close() })
		return b
	}
	holder, follower := newB(), newB()
	counter := &countingTransport{base: follower.client.rest.Client.Transport}
	follower.client.rest.Client.Transport = counter
	ctx := context.Background()
	lh, err := holder.Campaign(ctx, backends.CampaignOptions{Identity: "holder", LeaseDuration: 2 * time.Second})
	if err != nil {
		t.Fatal(err)
	}
	defer lh.Release(ctx, nil)
	wctx, cancel := context.WithTimeout(ctx, 3*time.Second)
	defer cancel()
	done := make(chan error, 1)
	go func() {
		_, err := follower.Campaign(wctx, backends.CampaignOptions{Identity: "follower", LeaseDuration: 2 * time.Second})
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
	reqs := counter.requests()
	t.Logf("follower sent %d requests while the holder renewed %d times: %q", len(reqs), renewals, reqs)
	if len(reqs) != 2 {
		t.Errorf("follower sent %d requests, want one read and one watch", len(reqs))
	}
}

// TestWriteFindsLoss: with the watch stopped, so that only the write can
// tell, a renewal or a completion marker sent after someone else took the
// Lease conflicts with that holder's record: the write reports the loss,
// Lost closes with the reason, and the other holder's record is left
// alone.
func TestWriteFindsLoss(t *testing.T) {
	k := testenv.SharedKube(t)
	ns := k.Namespace(t)
	k.Grant(t, ns, testenv.KubeLimited, "get", "create", "update", "watch")
	tests := []struct {
		name  string
		write func(ctx context.Context, l *lease) error
	}{
		{"renew", func(ctx context.Context, l *lease) error { return l.Renew(ctx) }},
		{"complete", func(ctx context.Context, l *lease) error {
			return l.Complete(ctx, backends.Marker{Key: "k", Identity: "leader", Token: l.Token(), At: time.Now(), Expires: time.Now().Add(time.Hour)})
		}},
	}
	for i, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			lock := fmt.Sprintf("write-loss-%d", i)
			cfg, err := LoadAPIConfig(LoadOptions{Kubeconfig: k.Kubeconfig(t, testenv.KubeLimited, ns)})
			if err != nil {
				t.Fatal(err)
			}
			b, err := New(Config{API: cfg, Lock: lock})
			if err != nil {
				t.Fatal(err)
			}
			defer b.Close()
			ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
			defer cancel()
			bl, err := b.Campaign(ctx, backends.CampaignOptions{Identity: "leader", LeaseDuration: 15 * time.Second})
			if err != nil {
				t.Fatal(err)
			}
			l := bl.(*lease)
			defer l.Release(ctx, nil)
			l.w.stop() // the watch can no longer tell
			path := "/apis/coordination.k8s.io/v1/namespaces/" + ns + "/leases/" + lock
			k.Admin(t, http.MethodPatch, path, map[string]any{"spec": map[string]any{"holderIdentity": "intruder"}})
			if err := tt.write(ctx, l); !errors.Is(err, backends.ErrLeaseLost) {
				t.Errorf("%s after the holder was changed: %v, want ErrLeaseLost", tt.name, err)
			}
			select {
			case <-l.Lost():
			default:
				t.Fatal("Lost not closed")
			}
			if err := l.Err(); !errors.Is(err, backends.ErrLeaseLost) || !strings.Contains(err.Error(), `taken by "intruder"`) {
				t.Errorf("Err() = %v, want the takeover", err)
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
			if obj.Spec.HolderIdentity != "intruder" || obj.Metadata.Annotations[annotationMarkers] != "" {
				t.Errorf("after the failed %s: holder %q, markers %q; want the intruder's record untouched",
					tt.name, obj.Spec.HolderIdentity, obj.Metadata.Annotations[annotationMarkers])
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
// them all, and one event of more than 4 MiB, after them, breaks it.
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
	b, err := New(Config{API: &APIConfig{REST: &rest.Config{Host: srv.URL}, Source: "test"}, Namespace: "ns", Lock: "w"})
	if err != nil {
		t.Fatal(err)
	}
	defer b.Close()
	w := startWatch(b.client, nil)
	defer w.stop()
	got := 0
	deadline := time.After(30 * time.Second)
	for {
		select {
		case ch := <-w.changes:
			if len(ch.obj.Annotations["x"]) != len(big) {
				t.Fatalf("event %d has an annotation of %d bytes", got, len(ch.obj.Annotations["x"]))
			}
			got++
		case err := <-w.broken:
			t.Logf("after %d events: %v", got, err)
			if got != events || !errors.Is(err, errProtocol) || !strings.Contains(err.Error(), "larger than 4 MiB") {
				t.Fatalf("after %d of %d events: %v; want all of them, then the oversized one refused", got, events, err)
			}
			return
		case <-deadline:
			t.Fatalf("%d of %d events, and no error for the oversized one", got, events)
		}
	}
}
