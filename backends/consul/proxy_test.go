package consul_test

import (
	"io"
	"log"
	"net/http"
	"net/http/httptest"
	"net/http/httputil"
	"net/url"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"
)

// countingProxy forwards HTTP to an agent and records every request. If
// hook is set, it sees each request first, and answers it itself if it
// returns true (to fail it, or to play a stale server).
type countingProxy struct {
	srv  *httptest.Server
	hook func(w http.ResponseWriter, r *http.Request) bool

	mu   sync.Mutex
	reqs []proxied
}

// proxied is one request that went through a proxy.
type proxied struct {
	method, path string // path without the query
	query        url.Values
	start, end   time.Time
	// index is the request's ?index (0: not a blocking query); got is the
	// X-Consul-Index of the answer.
	index, got uint64
	status     int
}

func (r proxied) String() string {
	q := r.query.Encode()
	if q != "" {
		q = "?" + q
	}
	return r.method + " " + r.path + q
}

// blocking reports whether r was a blocking query.
func (r proxied) blocking() bool { return r.method == http.MethodGet && r.index > 0 }

// woke reports whether r was a blocking query answered because the index
// moved, not at the end of its wait.
func (r proxied) woke() bool { return r.blocking() && r.got != 0 && r.got != r.index }

func newCountingProxy(t *testing.T, target string) *countingProxy {
	return newHookedProxy(t, target, nil)
}

func newHookedProxy(t *testing.T, target string, hook func(w http.ResponseWriter, r *http.Request) bool) *countingProxy {
	t.Helper()
	u, err := url.Parse("http://" + target)
	if err != nil {
		t.Fatal(err)
	}
	p := &countingProxy{hook: hook}
	rp := httputil.NewSingleHostReverseProxy(u)
	rp.ErrorLog = log.New(io.Discard, "", 0)
	p.srv = httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		rec := proxied{method: r.Method, path: r.URL.Path, query: r.URL.Query(), start: time.Now()}
		rec.index, _ = strconv.ParseUint(rec.query.Get("index"), 10, 64)
		p.mu.Lock()
		i := len(p.reqs)
		p.reqs = append(p.reqs, rec)
		p.mu.Unlock()
		sw := &statusWriter{ResponseWriter: w, status: http.StatusOK}
		if p.hook == nil || !p.hook(sw, r) {
			rp.ServeHTTP(sw, r)
		}
		got, _ := strconv.ParseUint(sw.Header().Get("X-Consul-Index"), 10, 64)
		p.mu.Lock()
		p.reqs[i].end, p.reqs[i].status, p.reqs[i].got = time.Now(), sw.status, got
		p.mu.Unlock()
	}))
	t.Cleanup(func() {
		// A blocking query forwarded for a candidate that is gone would
		// keep Close waiting until Consul answers it.
		p.srv.CloseClientConnections()
		p.srv.Close()
	})
	return p
}

type statusWriter struct {
	http.ResponseWriter
	status int
}

func (w *statusWriter) WriteHeader(code int) {
	w.status = code
	w.ResponseWriter.WriteHeader(code)
}

func (w *statusWriter) Flush() {
	if f, ok := w.ResponseWriter.(http.Flusher); ok {
		f.Flush()
	}
}

func (p *countingProxy) addr() string { return strings.TrimPrefix(p.srv.URL, "http://") }

// requests returns the requests sent so far; those not answered yet have
// a zero end.
func (p *countingProxy) requests() []proxied {
	p.mu.Lock()
	defer p.mu.Unlock()
	return append([]proxied(nil), p.reqs...)
}

// between returns the requests answered in [from, to).
func (p *countingProxy) between(from, to time.Time) []proxied {
	var out []proxied
	for _, r := range p.requests() {
		if !r.end.IsZero() && !r.end.Before(from) && r.end.Before(to) {
			out = append(out, r)
		}
	}
	return out
}

// woken counts the blocking queries answered by a change in [from, to).
func (p *countingProxy) woken(from, to time.Time) int {
	n := 0
	for _, r := range p.between(from, to) {
		if r.woke() {
			n++
		}
	}
	return n
}

// count counts the requests sent so far.
func (p *countingProxy) count() int {
	p.mu.Lock()
	defer p.mu.Unlock()
	return len(p.reqs)
}

// blocked reports whether a blocking query on path (any path if "") is
// outstanding: the candidate behind the proxy is waiting on it.
func (p *countingProxy) blocked(path string) bool {
	for _, r := range p.requests() {
		if r.blocking() && r.end.IsZero() && (path == "" || r.path == path) {
			return true
		}
	}
	return false
}

// waitBlocked waits until a blocking query on path (any if "") is
// outstanding.
func (p *countingProxy) waitBlocked(t *testing.T, path string) {
	t.Helper()
	waitUntil(t, "a blocking query on "+path, func() bool { return p.blocked(path) })
}

// waitUntil polls cond, a condition in another process, for up to 10 s.
func waitUntil(t *testing.T, what string, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(10 * time.Second)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("timed out waiting for %s", what)
		}
		time.Sleep(5 * time.Millisecond)
	}
}
