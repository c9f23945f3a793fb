package kubernetes

import (
	"context"
	"errors"
	"net/http"
	"sync"
	"testing"
	"time"

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
	counter := &countingTransport{base: follower.client.http.Transport}
	follower.client.http.Transport = counter
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
