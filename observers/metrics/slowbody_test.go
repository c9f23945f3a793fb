package metrics

import (
	"fmt"
	"io"
	"net"
	"net/http"
	"runtime"
	"sync"
	"testing"
	"time"
)

// TestScrapeDespiteSlowBodies: another user of the host keeps more
// connections than the cap open to a real metrics server, each a POST
// that announces a body of 200000 bytes (under what the server would read
// to reuse the connection) and sends it a byte every 50 ms, and opens a
// new one at its next byte whenever the server closes one (the attackers'
// bytes spread over those 50 ms, not all at once: a burst of connections
// over the cap is a flood of connects, which TestScrapeDespiteIdleConnections
// covers). Every scrape of /metrics and /healthz is still answered,
// promptly: nearly all at the first try, and each within three.
func TestScrapeDespiteSlowBodies(t *testing.T) {
	srv := startServer(t, 30*time.Second)
	raiseFileLimit(t, 4096)
	stop := make(chan struct{})
	var wg sync.WaitGroup
	const attackers = DefaultMaxConns + 16
	for i := range attackers {
		wg.Add(1)
		go func() {
			defer wg.Done()
			// This attacker's phase within dripEvery.
			select {
			case <-stop:
				return
			case <-time.After(dripEvery * time.Duration(i) / attackers):
			}
			tick := time.NewTicker(dripEvery)
			defer tick.Stop()
			for {
				c, err := net.Dial("tcp", srv.addr)
				if err != nil {
					return
				}
				dripBody(c, tick.C, stop)
				c.Close()
				select {
				case <-stop:
					return
				case <-tick.C:
				}
			}
		}()
	}
	defer func() {
		close(stop)
		wg.Wait()
	}()
	// Let the flood fill the cap: the server holds MaxConns descriptors more.
	base := openFiles(t, srv.pid)
	deadline := time.Now().Add(10 * time.Second)
	for openFiles(t, srv.pid) < base+DefaultMaxConns/2 && time.Now().Before(deadline) {
		runtime.Gosched()
	}
	client := &http.Client{Timeout: 2 * time.Second, Transport: &http.Transport{DisableKeepAlives: true}}
	scrape := func(path string) error {
		start := time.Now()
		resp, err := client.Get("http://" + srv.addr + path)
		if err != nil {
			return err
		}
		_, err = io.ReadAll(resp.Body)
		resp.Body.Close()
		switch {
		case err != nil:
			return err
		case resp.StatusCode != http.StatusOK:
			return fmt.Errorf("%s", resp.Status)
		}
		if d := time.Since(start); d > time.Second {
			t.Errorf("%s took %v while slow bodies filled the cap", path, d)
		}
		return nil
	}
	// A scrape whose connection was accepted, but not yet read when the
	// flood's next connections came, may be the one closed for them: on
	// a machine starved of CPU (CI's, under -race) the server's goroutine
	// for it can wait that long. A scraper then fails that one scrape and
	// is answered at the next, as a second try here is; a flood that
	// locked it out would fail every try.
	const tries = 3
	first := 0
	var failures []string
	for i := range 10 {
		path := []string{"/metrics", "/healthz"}[i%2]
		for try := 1; ; try++ {
			err := scrape(path)
			if err == nil {
				if try == 1 {
					first++
				}
				break
			}
			failures = append(failures, fmt.Sprintf("%s, try %d: %v", path, try, err))
			if try == tries {
				t.Errorf("%s not answered in %d tries while slow bodies filled the cap", path, tries)
				break
			}
		}
	}
	t.Logf("%d of 10 scrapes answered at the first try; failed tries: %v", first, failures)
	if first < 8 {
		t.Errorf("%d of 10 scrapes answered at the first try while slow bodies filled the cap, want at least 8: %v", first, failures)
	}
}

// dripEvery is how often a slow body gets a byte.
const dripEvery = 50 * time.Millisecond

// dripBody sends a POST that announces 200000 bytes of body on c, then a
// byte at every tick, until the server closes c (or answers) or stop
// closes.
func dripBody(c net.Conn, tick <-chan time.Time, stop <-chan struct{}) {
	if _, err := io.WriteString(c, "POST /metrics HTTP/1.1\r\nHost: x\r\nContent-Length: 200000\r\n\r\n"); err != nil {
		return
	}
	closed := make(chan struct{})
	go func() {
		defer close(closed)
		_, _ = io.Copy(io.Discard, c)
	}()
	for {
		select {
		case <-stop:
			c.Close()
			<-closed
			return
		case <-closed:
			return
		case <-tick:
			if _, err := c.Write([]byte("x")); err != nil {
				c.Close()
				<-closed
				return
			}
		}
	}
}

// TestBusyConnectionsMakeRoom: at the cap, with every connection busy
// serving a request that does not end, a new connection takes the place
// of the one busy the longest, and its request is answered.
func TestBusyConnectionsMakeRoom(t *testing.T) {
	const max = 4
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	l := &capped{Listener: ln, max: max}
	entered := make(chan struct{})
	release := make(chan struct{})
	mux := http.NewServeMux()
	mux.HandleFunc("/stuck", func(w http.ResponseWriter, r *http.Request) {
		entered <- struct{}{}
		select {
		case <-release:
		case <-r.Context().Done():
		}
	})
	mux.HandleFunc("/fast", func(w http.ResponseWriter, _ *http.Request) { _, _ = w.Write([]byte("ok\n")) })
	srv := &http.Server{Handler: mux, ConnState: l.track}
	done := make(chan struct{})
	go func() {
		defer close(done)
		_ = srv.Serve(l)
	}()
	defer func() {
		close(release)
		srv.Close()
		<-done
	}()
	// max connections, each busy with a request that does not end; the
	// first to get busy is the one that must go.
	stuck := make([]chan error, max)
	for i := range stuck {
		c, err := net.Dial("tcp", ln.Addr().String())
		if err != nil {
			t.Fatal(err)
		}
		defer c.Close()
		if _, err := io.WriteString(c, "GET /stuck HTTP/1.1\r\nHost: x\r\n\r\n"); err != nil {
			t.Fatal(err)
		}
		<-entered
		stuck[i] = make(chan error, 1)
		go func() {
			_, err := c.Read(make([]byte, 1))
			stuck[i] <- err
		}()
	}
	client := &http.Client{Timeout: 5 * time.Second, Transport: &http.Transport{DisableKeepAlives: true}}
	resp, err := client.Get("http://" + ln.Addr().String() + "/fast")
	if err != nil {
		t.Fatalf("a request at the cap, every connection busy: %v", err)
	}
	resp.Body.Close()
	select {
	case err := <-stuck[0]:
		t.Logf("the connection busy the longest was closed: %v", err)
	case <-time.After(5 * time.Second):
		t.Error("the connection busy the longest is still open")
	}
	for i := 1; i < max; i++ {
		select {
		case err := <-stuck[i]:
			t.Errorf("busy connection %d was closed too: %v", i, err)
		default:
		}
	}
}

// TestBodiesRefused: a request with a body, or a method other than GET
// and HEAD, is answered at once (413, 405) without its body being read,
// and its connection closed.
func TestBodiesRefused(t *testing.T) {
	srv := startServer(t, 30*time.Second)
	for _, tc := range []struct {
		name, request string
		status        string
	}{
		{"POST", "POST /metrics HTTP/1.1\r\nHost: x\r\nContent-Length: 200000\r\n\r\n", "405"},
		{"GET with a body", "GET /healthz HTTP/1.1\r\nHost: x\r\nContent-Length: 200000\r\n\r\n", "413"},
		{"GET with a chunked body", "GET /healthz HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: chunked\r\n\r\n", "413"},
		{"GET", "GET /healthz HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n", "200"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			c, err := net.Dial("tcp", srv.addr)
			if err != nil {
				t.Fatal(err)
			}
			defer c.Close()
			_ = c.SetDeadline(time.Now().Add(5 * time.Second))
			if _, err := io.WriteString(c, tc.request); err != nil {
				t.Fatal(err)
			}
			// No byte of the body is sent: the answer and the close
			// must come all the same.
			out, err := io.ReadAll(c)
			if err != nil {
				t.Fatalf("reading the answer: %v (got %q)", err, out)
			}
			if want := "HTTP/1.1 " + tc.status + " "; len(out) < len(want) || string(out[:len(want)]) != want {
				t.Errorf("answer %q, want status %s", out, tc.status)
			}
		})
	}
}
