package azureblob_test

import (
	"context"
	"errors"
	"fmt"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/leaderrun/leaderrun/backends"
	"github.com/leaderrun/leaderrun/backends/azureblob"
)

// hostile is a blob service that answers every request with answer, and
// counts the requests.
func hostile(t *testing.T, answer func(w http.ResponseWriter, r *http.Request)) (*httptest.Server, *atomic.Int32) {
	var n atomic.Int32
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		n.Add(1)
		answer(w, r)
	}))
	t.Cleanup(srv.Close)
	return srv, &n
}

// against is a candidate of an account at srv, authenticated with a key.
func against(t *testing.T, srv *httptest.Server) *candidate {
	t.Helper()
	s, err := azureblob.Open(azureblob.Config{
		AccountURL:  srv.URL + "/acct",
		Container:   "locks",
		Credentials: azureblob.Credentials{Account: "acct", Key: "a2V5a2V5a2V5a2V5"},
		Prefix:      prefix,
	})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { s.Close() })
	return &candidate{s: s, lock: "hostile", retry: retry}
}

// TestHostileServer: what a server (or something posing as one) answers
// is bounded: bodies past 1 MiB and headers past 64 KiB are errors, never
// our memory; a redirect is not followed (it would send the signed
// request elsewhere); failures are retried twice, no more; a server that
// says nothing costs the caller's deadline, no more.
func TestHostileServer(t *testing.T) {
	ctx := context.Background()
	t.Run("BodyTooLarge", func(t *testing.T) {
		for _, declared := range []bool{true, false} {
			srv, _ := hostile(t, func(w http.ResponseWriter, r *http.Request) {
				if declared {
					w.Header().Set("Content-Length", fmt.Sprint(1<<30))
				}
				chunk := make([]byte, 64<<10)
				for i := 0; i < (1<<30)/len(chunk); i++ {
					if _, err := w.Write(chunk); err != nil {
						return
					}
				}
			})
			// A blob read (the SDK streams it to us), and an answer the
			// SDK reads whole itself (an acquisition's).
			began := time.Now()
			_, err := against(t, srv).History(ctx)
			t.Logf("declared %v, history: %v after %v", declared, err, time.Since(began).Round(time.Millisecond))
			if err == nil || !strings.Contains(err.Error(), "bytes") {
				t.Errorf("declared %v: a 1 GiB blob: %v, want an error on its size", declared, err)
			}
			began = time.Now()
			_, err = against(t, srv).Campaign(ctx, "big", false)
			t.Logf("declared %v, campaign: %v after %v", declared, err, time.Since(began).Round(time.Millisecond))
			if err == nil || !strings.Contains(err.Error(), "more than the 1048576") {
				t.Errorf("declared %v: a 1 GiB answer: %v, want an error on its size", declared, err)
			}
		}
	})
	t.Run("HeadersTooLarge", func(t *testing.T) {
		srv, _ := hostile(t, func(w http.ResponseWriter, r *http.Request) {
			w.Header().Set("x-ms-meta-big", strings.Repeat("x", 200<<10))
			w.WriteHeader(http.StatusOK)
		})
		if _, err := against(t, srv).Status(ctx); err == nil || !strings.Contains(err.Error(), "header") {
			t.Errorf("200 KiB of headers: %v, want an error on their size", err)
		}
	})
	t.Run("RedirectNotFollowed", func(t *testing.T) {
		elsewhere, reached := hostile(t, func(w http.ResponseWriter, r *http.Request) {})
		srv, _ := hostile(t, func(w http.ResponseWriter, r *http.Request) {
			http.Redirect(w, r, elsewhere.URL+r.URL.Path, http.StatusTemporaryRedirect)
		})
		b := against(t, srv)
		if _, err := b.Status(ctx); err == nil {
			t.Error("status through a redirect succeeded")
		}
		cctx, cancel := context.WithTimeout(ctx, 5*time.Second)
		defer cancel()
		if _, err := b.Campaign(cctx, "r", false); !errors.Is(err, backends.ErrUnavailable) {
			t.Errorf("campaign through a redirect: %v, want ErrUnavailable", err)
		}
		if n := reached.Load(); n != 0 {
			t.Errorf("%d requests followed the redirect", n)
		}
	})
	t.Run("RetriesBounded", func(t *testing.T) {
		srv, n := hostile(t, func(w http.ResponseWriter, r *http.Request) {
			w.Header().Set("x-ms-error-code", "ServerBusy")
			w.WriteHeader(http.StatusServiceUnavailable)
		})
		began := time.Now()
		_, err := against(t, srv).Status(ctx)
		took := time.Since(began)
		t.Logf("503 for ever: %v, %d requests in %v", err, n.Load(), took.Round(time.Millisecond))
		if err == nil || !strings.Contains(err.Error(), "503 ServerBusy") || n.Load() != 3 || took > 2*time.Second {
			t.Errorf("503 for ever: %v after %d requests and %v; want the 503 after 3 requests, within 2s", err, n.Load(), took)
		}
		if strings.Contains(err.Error(), "\n") {
			t.Errorf("the error spans lines: %q", err)
		}
	})
	t.Run("SilentServer", func(t *testing.T) {
		stop := make(chan struct{})
		srv, _ := hostile(t, func(w http.ResponseWriter, r *http.Request) {
			select {
			case <-stop:
			case <-r.Context().Done():
			}
		})
		defer close(stop)
		cctx, cancel := context.WithTimeout(ctx, time.Second)
		defer cancel()
		began := time.Now()
		_, err := against(t, srv).Status(cctx)
		if took := time.Since(began); err == nil || took > 2*time.Second {
			t.Errorf("a silent server: %v after %v, want an error at the caller's 1s deadline", err, took)
		}
	})
}

// TestLeaseDurations: Azure grants 15 to 60 s, whole seconds; a fraction
// is rounded up, and what it rounds to must be in range.
func TestLeaseDurations(t *testing.T) {
	b, err := azureblob.Open(azureblob.Config{Container: "locks",
		Credentials: azureblob.Credentials{Account: "acct", Key: "a2V5a2V5a2V5a2V5"}})
	if err != nil {
		t.Fatal(err)
	}
	for _, tc := range []struct {
		d  time.Duration
		ok bool
	}{
		{0, false}, {-time.Second, false}, {14 * time.Second, false}, {14*time.Second + time.Millisecond, true},
		{15 * time.Second, true}, {60 * time.Second, true}, {60*time.Second + time.Millisecond, false}, {time.Hour, false},
	} {
		if err := b.CheckTimings(backends.Timings{LeaseDuration: tc.d}); (err == nil) != tc.ok {
			t.Errorf("CheckTimings(lease %v) = %v, want ok %v", tc.d, err, tc.ok)
		}
	}
}

// TestConfigRefused: configurations Open refuses, with a message naming
// what is wrong and never a secret.
func TestConfigRefused(t *testing.T) {
	const key = "c2VjcmV0a2V5c2VjcmV0a2V5"
	base := azureblob.Config{Container: "locks", Credentials: azureblob.Credentials{Account: "acct", Key: key}}
	for _, tc := range []struct {
		name string
		edit func(*azureblob.Config)
		want string
	}{
		{"no container", func(c *azureblob.Config) { c.Container = "" }, "container name"},
		{"container with capitals", func(c *azureblob.Config) { c.Container = "Locks" }, "container name"},
		{"container with two hyphens", func(c *azureblob.Config) { c.Container = "a--b" }, "container name"},
		{"prefix with a backslash", func(c *azureblob.Config) { c.Prefix = `a\b` }, "prefix"},
		{"no credentials", func(c *azureblob.Config) { c.Credentials = azureblob.Credentials{Account: "acct"} }, "no credentials"},
		{"no account", func(c *azureblob.Config) { c.Credentials = azureblob.Credentials{Key: key} }, "no storage account"},
		{"URL with user", func(c *azureblob.Config) { c.AccountURL = "https://user:" + key + "@acct.blob.core.windows.net" }, "account URL"},
		{"URL with a SAS", func(c *azureblob.Config) { c.AccountURL = "https://acct.blob.core.windows.net?sig=" + key }, "account URL"},
		{"URL and connection string", func(c *azureblob.Config) {
			c.AccountURL = "https://acct.blob.core.windows.net"
			c.Credentials = azureblob.Credentials{ConnectionString: "AccountName=acct;AccountKey=" + key}
		}, "connection string"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			cfg := base
			tc.edit(&cfg)
			_, err := azureblob.Open(cfg)
			if err == nil || !strings.Contains(err.Error(), tc.want) {
				t.Fatalf("Open: %v, want an error saying %q", err, tc.want)
			}
			if strings.Contains(err.Error(), key) {
				t.Errorf("the error shows the key: %v", err)
			}
		})
	}
}
