//go:build linux

package e2e

import (
	"bytes"
	"net/http"
	"net/http/httptest"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/leaderrun/leaderrun/internal/testenv"
)

// Bounds on a leaderrun facing a hostile Consul agent (issue 24).
const (
	hostileDeadline = 15 * time.Second
	hostileMaxRSS   = 64 << 20
)

// hostileChunk is what a hostile agent writes again and again.
func hostileChunk(s string) []byte { return bytes.Repeat([]byte(s), 64<<10/len(s)) }

// streamForever writes head once, then chunk until the client goes or
// stop closes.
func streamForever(w http.ResponseWriter, stop <-chan struct{}, head string, chunk []byte) {
	w.Header().Set("Content-Type", "application/json")
	w.Header().Set("X-Consul-Index", "7")
	w.WriteHeader(http.StatusOK)
	if _, err := w.Write([]byte(head)); err != nil {
		return
	}
	for {
		select {
		case <-stop:
			return
		default:
		}
		if _, err := w.Write(chunk); err != nil {
			return
		}
	}
}

// requestLog records the requests a listener got and the credentials they
// carried.
type requestLog struct {
	mu     sync.Mutex
	reqs   []string
	tokens []string
}

func (l *requestLog) record(r *http.Request) {
	l.mu.Lock()
	defer l.mu.Unlock()
	l.reqs = append(l.reqs, r.Method+" "+r.URL.RequestURI())
	if tok := r.Header.Get("X-Consul-Token"); tok != "" {
		l.tokens = append(l.tokens, tok)
	}
	if _, pw, ok := r.BasicAuth(); ok {
		l.tokens = append(l.tokens, pw)
	}
}

func (l *requestLog) get() (reqs, tokens []string) {
	l.mu.Lock()
	defer l.mu.Unlock()
	return slices.Clone(l.reqs), slices.Clone(l.tokens)
}

// hostileAnswer answers one request of leaderrun's; stop closes when the
// test ends.
type hostileAnswer func(w http.ResponseWriter, r *http.Request, stop <-chan struct{})

// runHostile runs leaderrun with args against a fake agent that answers
// every request with answer, and returns its output, its exit code and
// the requests the agent got. It fails the test if leaderrun runs longer
// than hostileDeadline or its peak RSS (wait4's ru_maxrss, measured by a
// small process of its own: see testenv.RunMeasured) reaches
// hostileMaxRSS.
func runHostile(t *testing.T, answer hostileAnswer, args ...string) (string, int, []string) {
	t.Helper()
	stop := make(chan struct{})
	got := &requestLog{}
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		got.record(r)
		answer(w, r, stop)
	}))
	t.Cleanup(func() {
		close(stop)
		srv.CloseClientConnections()
		srv.Close()
	})
	argv := append([]string{testenv.Leaderrun(t), "--consul-addr", srv.Listener.Addr().String()}, args...)
	m := testenv.RunMeasured(t, hostileDeadline, argv...)
	reqs, _ := got.get()
	t.Logf("exit %d after %v, peak RSS %.1f MiB, %d requests: %s\n%s", m.Code, m.Took.Round(time.Millisecond),
		float64(m.PeakRSS)/(1<<20), len(reqs), strings.Join(reqs, ", "), strings.TrimSpace(m.Output))
	if m.PeakRSS >= hostileMaxRSS {
		t.Errorf("peak RSS %.1f MiB, want under %d MiB", float64(m.PeakRSS)/(1<<20), hostileMaxRSS>>20)
	}
	return m.Output, m.Code, reqs
}

// TestConsulHostileAgent: a Consul agent that answers every request with
// (a) endless JSON whitespace, (b) a JSON document without end, or (c) a
// redirect to another listener. leaderrun exits 69 within 15 s with its
// peak RSS under 64 MiB, and in (c) the other listener never hears from
// it: neither the ACL token nor anything else.
func TestConsulHostileAgent(t *testing.T) {
	t.Parallel()
	const secret = "s3cret-acl-token-0123456789"
	other := &requestLog{}
	elsewhere := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		other.record(r)
		_, _ = w.Write([]byte("[]"))
	}))
	t.Cleanup(elsewhere.Close)
	// An entry of a KV list, as Consul writes them, with a value of 6 KiB.
	entry := `{"LockIndex":0,"Key":"leaderrun/x","Flags":0,"Value":"` + strings.Repeat("QUFB", 2<<10) + `","CreateIndex":5,"ModifyIndex":5},`
	cases := []struct {
		name   string
		answer hostileAnswer
	}{
		{name: "endless whitespace", answer: func(w http.ResponseWriter, _ *http.Request, stop <-chan struct{}) {
			streamForever(w, stop, "", hostileChunk(" \n\t\r"))
		}},
		{name: "huge JSON document", answer: func(w http.ResponseWriter, _ *http.Request, stop <-chan struct{}) {
			streamForever(w, stop, "[", hostileChunk(entry))
		}},
		{name: "redirect to another listener", answer: func(w http.ResponseWriter, r *http.Request, _ <-chan struct{}) {
			http.Redirect(w, r, elsewhere.URL+r.URL.RequestURI(), http.StatusTemporaryRedirect)
		}},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			out, code, reqs := runHostile(t, tc.answer, "--consul-token", secret, "--lock", "hostile", "--", "true")
			if code != 69 {
				t.Errorf("exit %d, want 69", code)
			}
			if strings.Contains(out, secret) {
				t.Error("the output shows the ACL token")
			}
			if len(reqs) == 0 {
				t.Error("leaderrun sent the hostile agent nothing: the test tested nothing")
			}
			if oreqs, otokens := other.get(); len(oreqs) > 0 || len(otokens) > 0 {
				t.Errorf("the listener the agent redirected to got %d requests (%v) and %d tokens", len(oreqs), oreqs, len(otokens))
			}
		})
	}
}

// TestConsulAnswerCutShort: an agent that answers like Consul until the
// acquisition, whose answer (409: the key is held) ends in the middle of
// its JSON: with --try, leaderrun exits 69 (the store failed), never 75
// (held by another).
func TestConsulAnswerCutShort(t *testing.T) {
	t.Parallel()
	const session = "5e8ec2fd-59d2-b109-261e-d988bf737aae"
	answer := func(w http.ResponseWriter, r *http.Request, _ <-chan struct{}) {
		w.Header().Set("Content-Type", "application/json")
		w.Header().Set("X-Consul-Index", "7")
		switch p := r.URL.Path; {
		case p == "/v1/agent/checks":
			_, _ = w.Write([]byte("{}"))
		case strings.HasPrefix(p, "/v1/agent/check/"):
		case p == "/v1/session/create":
			_, _ = w.Write([]byte(`{"ID":"` + session + `"}`))
		case strings.HasPrefix(p, "/v1/session/info/"):
			_, _ = w.Write([]byte(`[{"ID":"` + session + `","Name":"x","TTL":"15s","LockDelay":4000000000}]`))
		case strings.HasPrefix(p, "/v1/session/destroy/"):
			_, _ = w.Write([]byte("true"))
		case p == "/v1/txn":
			// Promise more than is sent, then hang up.
			w.Header().Set("Content-Length", "400")
			w.WriteHeader(http.StatusConflict)
			_, _ = w.Write([]byte(`{"Results":null,"Errors":[{"OpIndex":0,"What":"failed to lock key: lock is`))
			if c, _, err := http.NewResponseController(w).Hijack(); err == nil {
				c.Close()
			}
		default:
			http.Error(w, "not in this test", http.StatusNotFound)
		}
	}
	_, code, reqs := runHostile(t, answer, "--try", "--lock", "cut", "--", "true")
	if code != 69 {
		t.Errorf("exit %d, want 69 (the store failed), not 75 (held)", code)
	}
	if !slices.ContainsFunc(reqs, func(r string) bool { return strings.HasPrefix(r, "PUT /v1/txn") }) {
		t.Errorf("no acquisition was tried (%v): the test tested nothing", reqs)
	}
}
