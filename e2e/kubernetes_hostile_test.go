//go:build linux

package e2e

import (
	"fmt"
	"net/http"
	"net/http/httptest"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/leaderrun/leaderrun/internal/testenv"
)

// maxRSSProgram is a small parent that runs its arguments, forwards
// SIGTERM and SIGINT to them, and writes their peak RSS in KiB (wait4's
// ru_maxrss) to $MAXRSS_FILE. The test cannot take ru_maxrss of a process
// it starts itself: Linux counts the memory of the parent that forked it
// (the test process, large under the race detector) as the child's until
// it execs, so every child of the test would show at least the test's own
// peak. Built without the race detector, this parent is a few MiB.
const maxRSSProgram = `package main

import (
	"errors"
	"os"
	"os/exec"
	"os/signal"
	"strconv"
	"syscall"
)

func main() {
	sigs := make(chan os.Signal, 1)
	signal.Notify(sigs, syscall.SIGTERM, syscall.SIGINT)
	cmd := exec.Command(os.Args[1], os.Args[2:]...)
	cmd.Stdin, cmd.Stdout, cmd.Stderr = os.Stdin, os.Stdout, os.Stderr
	if err := cmd.Start(); err != nil {
		os.Exit(127)
	}
	go func() {
		for sig := range sigs {
			_ = cmd.Process.Signal(sig)
		}
	}()
	err := cmd.Wait()
	ru := cmd.ProcessState.SysUsage().(*syscall.Rusage)
	if os.WriteFile(os.Getenv("MAXRSS_FILE"), []byte(strconv.FormatInt(ru.Maxrss, 10)), 0o600) != nil {
		os.Exit(127)
	}
	var ee *exec.ExitError
	if errors.As(err, &ee) {
		if ws := ee.Sys().(syscall.WaitStatus); ws.Signaled() {
			os.Exit(128 + int(ws.Signal()))
		}
		os.Exit(ee.ExitCode())
	}
}
`

// buildMaxRSS builds maxRSSProgram.
func buildMaxRSS(t *testing.T) string {
	t.Helper()
	dir := t.TempDir()
	for name, data := range map[string]string{"main.go": maxRSSProgram, "go.mod": "module maxrss\n\ngo 1.26\n"} {
		if err := os.WriteFile(filepath.Join(dir, name), []byte(data), 0o600); err != nil {
			t.Fatal(err)
		}
	}
	bin := filepath.Join(dir, "maxrss")
	cmd := exec.Command("go", "build", "-o", bin, ".")
	cmd.Dir = dir
	cmd.Env = append(os.Environ(), "GOWORK=off", "CGO_ENABLED=0", "GOFLAGS=-buildvcs=false")
	if out, err := cmd.CombinedOutput(); err != nil {
		t.Fatalf("build the measuring parent: %v\n%s", err, out)
	}
	return bin
}

// startMeasured starts leaderrun with args under the measuring parent
// (buildMaxRSS); maxRSS reads its peak RSS in KiB once it has exited.
func startMeasured(t *testing.T, parent string, args ...string) (p *proc, maxRSS func() int64) {
	t.Helper()
	out := filepath.Join(t.TempDir(), "maxrss")
	p = startProgram(t, []string{"MAXRSS_FILE=" + out}, parent, append([]string{testenv.Leaderrun(t)}, args...)...)
	return p, func() int64 {
		data, err := os.ReadFile(out)
		if err != nil {
			t.Fatalf("peak RSS not written: %v", err)
		}
		n, _ := strconv.ParseInt(string(data), 10, 64)
		return n
	}
}

// hostileToken is the bearer token of the kubeconfig pointed at a hostile
// server: it must never reach anyone else, nor leaderrun's log.
const hostileToken = "hostile-test-bearer-token-7f3a"

// hostileKube is an HTTP server of the test's own that plays an apiserver
// (or something in its place) answering with what no apiserver sends.
type hostileKube struct {
	srv  *httptest.Server
	sent atomic.Int64 // bytes of hostile answers written
	// started is closed when the first hostile bytes went out.
	started chan struct{}
	once    atomic.Bool
	// slow: write 16 KiB every 20 ms, so that the answer lasts seconds.
	slow bool
}

// heldLease is a Lease that someone else renewed just now, for an hour:
// a candidate waits, and watches it.
func heldLease() string {
	now := time.Now().UTC().Format("2006-01-02T15:04:05.000000Z")
	return fmt.Sprintf(`{"apiVersion":"coordination.k8s.io/v1","kind":"Lease","metadata":{"name":"job","namespace":"hostile",`+
		`"resourceVersion":"5"},"spec":{"holderIdentity":"other","leaseDurationSeconds":3600,"acquireTime":%q,"renewTime":%q,"leaseTransitions":1}}`,
		now, now)
}

// endless writes prefix, then fill forever (until the client goes), then
// never the end.
func (h *hostileKube) endless(w http.ResponseWriter, prefix string, fill byte) {
	w.Header().Set("Content-Type", "application/json")
	w.WriteHeader(http.StatusOK)
	if _, err := w.Write([]byte(prefix)); err != nil {
		return
	}
	chunk := []byte(strings.Repeat(string(fill), 16<<10))
	for {
		n, err := w.Write(chunk)
		h.sent.Add(int64(n))
		if h.once.CompareAndSwap(false, true) {
			close(h.started)
		}
		if err != nil {
			return
		}
		w.(http.Flusher).Flush()
		if h.slow {
			time.Sleep(20 * time.Millisecond) // the server's pace, not synchronisation
		}
	}
}

func startHostileKube(t *testing.T, slow bool, handler func(h *hostileKube, w http.ResponseWriter, r *http.Request)) *hostileKube {
	t.Helper()
	h := &hostileKube{started: make(chan struct{}), slow: slow}
	h.srv = httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) { handler(h, w, r) }))
	t.Cleanup(h.srv.Close)
	return h
}

func isWatch(r *http.Request) bool { return r.URL.Query().Get("watch") == "true" }

// hostileKubeconfig points at server with hostileToken.
func hostileKubeconfig(t *testing.T, server string) string {
	t.Helper()
	cfg := fmt.Sprintf(`apiVersion: v1
kind: Config
clusters:
- name: hostile
  cluster: {server: %s}
users:
- name: u
  user: {token: %s}
contexts:
- name: c
  context: {cluster: hostile, user: u, namespace: hostile}
current-context: c
`, server, hostileToken)
	p := filepath.Join(t.TempDir(), "kubeconfig")
	if err := os.WriteFile(p, []byte(cfg), 0o600); err != nil {
		t.Fatal(err)
	}
	return p
}

// TestKubernetesHostileServer (issue 24): a server that answers with
// endless whitespace (to the read of the Lease, and to the watch of a
// Lease held by someone else), with a JSON document without end, or with
// a redirect to another listener. leaderrun exits 69 within 15 s, its
// peak RSS (wait4's ru_maxrss) stays under 64 MiB, its log shows no token, and the other
// listener never sees a request. While a hostile answer trickles in,
// SIGTERM ends leaderrun within 1 s.
func TestKubernetesHostileServer(t *testing.T) {
	t.Parallel()
	var otherSaw atomic.Int64 // requests, and those carrying the token
	var otherToken atomic.Bool
	other := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		otherSaw.Add(1)
		if strings.Contains(r.Header.Get("Authorization"), hostileToken) {
			otherToken.Store(true)
		}
		w.Header().Set("Content-Type", "application/json")
		fmt.Fprint(w, heldLease())
	}))
	defer other.Close()
	parent := buildMaxRSS(t)
	huge := `{"apiVersion":"coordination.k8s.io/v1","kind":"Lease","metadata":{"name":"job","annotations":{"x":"`
	cases := []struct {
		name    string
		handler func(h *hostileKube, w http.ResponseWriter, r *http.Request)
		says    string
		sigterm bool // a second run, slowed, gets SIGTERM during the answer
	}{
		{name: "whitespace on get", says: "larger than 4 MiB", sigterm: true,
			handler: func(h *hostileKube, w http.ResponseWriter, r *http.Request) { h.endless(w, "", ' ') }},
		{name: "whitespace on watch", says: "larger than 4 MiB", sigterm: true,
			handler: func(h *hostileKube, w http.ResponseWriter, r *http.Request) {
				if !isWatch(r) {
					w.Header().Set("Content-Type", "application/json")
					fmt.Fprint(w, heldLease())
					return
				}
				h.endless(w, "", '\n')
			}},
		{name: "huge document on get", says: "larger than 4 MiB",
			handler: func(h *hostileKube, w http.ResponseWriter, r *http.Request) { h.endless(w, huge, 'a') }},
		{name: "huge event on watch", says: "larger than 4 MiB", sigterm: true,
			handler: func(h *hostileKube, w http.ResponseWriter, r *http.Request) {
				if !isWatch(r) {
					w.Header().Set("Content-Type", "application/json")
					fmt.Fprint(w, heldLease())
					return
				}
				h.endless(w, `{"type":"MODIFIED","object":`+huge, 'a')
			}},
		{name: "redirect with the token", says: "a redirect, not followed",
			handler: func(h *hostileKube, w http.ResponseWriter, r *http.Request) {
				if h.once.CompareAndSwap(false, true) {
					close(h.started)
				}
				http.Redirect(w, r, other.URL+r.URL.RequestURI(), http.StatusTemporaryRedirect)
			}},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			h := startHostileKube(t, false, tc.handler)
			kc := hostileKubeconfig(t, h.srv.URL)
			began := time.Now()
			p, peak := startMeasured(t, parent, append(append([]string{"--kubeconfig", kc, "--lock", "job"}, kubeTimings...), "--", "/bin/true")...)
			code := p.wait(15 * time.Second)
			took := time.Since(began)
			maxRSS := peak() // KiB
			out := p.stderr.String()
			t.Logf("exit %d after %v, peak RSS %.1f MiB, %d hostile bytes sent: %s",
				code, took.Round(time.Millisecond), float64(maxRSS)/1024, h.sent.Load(), lastLine(out))
			if code != 69 || !strings.Contains(out, tc.says) {
				t.Errorf("exit %d, want 69 saying %q:\n%s", code, tc.says, out)
			}
			if maxRSS >= 64<<10 {
				t.Errorf("peak RSS %.1f MiB, want under 64 MiB", float64(maxRSS)/1024)
			}
			if strings.Contains(out, hostileToken) {
				t.Errorf("the log shows the token:\n%s", out)
			}
			select {
			case <-h.started:
			default:
				t.Errorf("the hostile answer was never sent: the test did not test it")
			}
			if tc.sigterm {
				sigtermDuring(t, tc.handler)
			}
		})
	}
	if n := otherSaw.Load(); n != 0 || otherToken.Load() {
		t.Errorf("the other listener saw %d requests (token among them: %v), want none", n, otherToken.Load())
	}
}

// sigtermDuring runs leaderrun against a server that sends the hostile
// answer slowly, and sends SIGTERM once part of it went out: leaderrun
// withdraws and exits 143 within 1 s.
func sigtermDuring(t *testing.T, handler func(h *hostileKube, w http.ResponseWriter, r *http.Request)) {
	t.Helper()
	h := startHostileKube(t, true, handler)
	kc := hostileKubeconfig(t, h.srv.URL)
	p := start(t, nil, append(append([]string{"--kubeconfig", kc, "--lock", "job"}, kubeTimings...), "--", "/bin/true")...)
	select {
	case <-h.started:
	case <-time.After(10 * time.Second):
		t.Fatal("the slow hostile answer never started")
	}
	waitFor(t, 5*time.Second, "256 KiB of the slow answer sent", func() bool { return h.sent.Load() >= 256<<10 })
	if p.exited() {
		t.Fatalf("leaderrun exited before SIGTERM (%d bytes sent):\n%s", h.sent.Load(), p.stderr.String())
	}
	sent := time.Now()
	p.signal(syscall.SIGTERM)
	code := p.wait(5 * time.Second)
	took := time.Since(sent)
	t.Logf("SIGTERM after %d KiB of the slow answer: exit %d after %v", h.sent.Load()>>10, code, took.Round(time.Millisecond))
	if code != 128+int(syscall.SIGTERM) || took > time.Second {
		t.Errorf("SIGTERM during the answer: exit %d after %v, want %d within 1s:\n%s", code, took, 128+int(syscall.SIGTERM), p.stderr.String())
	}
}
