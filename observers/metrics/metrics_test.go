package metrics

import (
	"bufio"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"slices"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/leaderrun/leaderrun/backends"
	"github.com/leaderrun/leaderrun/internal/testenv"
	"github.com/leaderrun/leaderrun/runner"
	"github.com/leaderrun/leaderrun/signals"
)

// TestMain doubles the test binary as a metrics server of its own process
// (serverMain), so that a test can measure that process's descriptors and
// memory without counting its own client sockets.
func TestMain(m *testing.M) {
	if os.Getenv("METRICS_TEST_SERVER") != "" {
		os.Exit(serverMain())
	}
	os.Exit(m.Run())
}

// serverMain serves metrics on a free loopback port with the idle and
// header timeouts in $METRICS_TEST_TIMEOUT, prints the address, and serves
// until its stdin closes.
func serverMain() int {
	timeout, err := time.ParseDuration(os.Getenv("METRICS_TEST_TIMEOUT"))
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		return 2
	}
	s, err := Serve("127.0.0.1:0", New("job", "local"), Limits{IdleTimeout: timeout, ReadHeaderTimeout: timeout})
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		return 1
	}
	fmt.Println(s.Addr())
	_, _ = io.Copy(io.Discard, os.Stdin)
	if err := s.Close(); err != nil {
		fmt.Fprintln(os.Stderr, err)
		return 1
	}
	return 0
}

// server is a metrics server in a process of its own.
type server struct {
	addr string
	pid  int
}

func startServer(t *testing.T, timeout time.Duration) server {
	t.Helper()
	self, err := os.Executable()
	if err != nil {
		t.Fatal(err)
	}
	cmd := exec.Command(self)
	cmd.Env = append(os.Environ(), "METRICS_TEST_SERVER=1", "METRICS_TEST_TIMEOUT="+timeout.String())
	stdin, err := cmd.StdinPipe()
	if err != nil {
		t.Fatal(err)
	}
	stdout, err := cmd.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	cmd.Stderr = os.Stderr
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		stdin.Close()
		done := make(chan error, 1)
		go func() { done <- cmd.Wait() }()
		select {
		case err := <-done:
			if err != nil {
				t.Errorf("metrics server: %v", err)
			}
		case <-time.After(10 * time.Second):
			_ = cmd.Process.Kill()
			<-done
			t.Errorf("metrics server did not stop within 10s of its stdin closing")
		}
	})
	line, err := bufio.NewReader(stdout).ReadString('\n')
	if err != nil {
		t.Fatalf("metrics server's address: %v", err)
	}
	return server{addr: strings.TrimSpace(line), pid: cmd.Process.Pid}
}

// openFiles counts pid's open descriptors.
func openFiles(t *testing.T, pid int) int {
	t.Helper()
	ents, err := os.ReadDir(filepath.Join("/proc", strconv.Itoa(pid), "fd"))
	if err != nil {
		t.Fatal(err)
	}
	return len(ents)
}

// raiseFileLimit makes room for n more descriptors in this process.
func raiseFileLimit(t *testing.T, n uint64) {
	t.Helper()
	var lim syscall.Rlimit
	if err := syscall.Getrlimit(syscall.RLIMIT_NOFILE, &lim); err != nil {
		t.Fatal(err)
	}
	if lim.Cur >= n {
		return
	}
	lim.Cur = n
	lim.Max = max(lim.Max, n)
	if err := syscall.Setrlimit(syscall.RLIMIT_NOFILE, &lim); err != nil {
		t.Fatalf("raise RLIMIT_NOFILE to %d for the test's client sockets: %v", n, err)
	}
}

// TestIdleConnectionsAreClosed: 3000 connections opened to a real metrics
// server and left idle (every other one after a keep-alive request, the
// rest without sending a byte) never hold more than MaxConns descriptors
// in the server, do not grow its memory, are all closed by the server
// (the ones it kept, by the idle or header timeout), and /metrics still
// answers afterwards.
func TestIdleConnectionsAreClosed(t *testing.T) {
	const (
		conns   = 3000
		timeout = time.Second
	)
	raiseFileLimit(t, conns+1000)
	srv := startServer(t, timeout)

	// Memory and descriptors once the server has answered a scrape, so
	// that the baseline includes what serving itself costs.
	if body := scrape(t, srv.addr); !strings.Contains(body, "leaderrun_is_leader") {
		t.Fatalf("/metrics lacks leaderrun_is_leader:\n%s", body)
	}
	baseFiles := openFiles(t, srv.pid)
	_, baseRSS, err := testenv.Memory(srv.pid)
	if err != nil {
		t.Fatal(err)
	}

	// Sample the server's descriptors while the connections are opened
	// and held: the highest count is what a flood costs it.
	stop := make(chan struct{})
	peak := make(chan int)
	go func() {
		top := 0
		tick := time.NewTicker(2 * time.Millisecond)
		defer tick.Stop()
		for {
			if ents, err := os.ReadDir(filepath.Join("/proc", strconv.Itoa(srv.pid), "fd")); err == nil {
				top = max(top, len(ents))
			}
			select {
			case <-stop:
				peak <- top
				return
			case <-tick.C:
			}
		}
	}()

	type result struct {
		held   bool          // the server answered the request, or kept the silent connection past 100 ms
		closed time.Duration // from the end of the request (or the connect) to the server's close
		err    error
	}
	results := make([]result, conns)
	var wg sync.WaitGroup
	opened := time.Now()
	for i := range conns {
		c, err := net.Dial("tcp", srv.addr)
		if err != nil {
			t.Fatalf("connection %d: %v", i, err)
		}
		sent := time.Now()
		if i%2 == 0 {
			if _, err := io.WriteString(c, "GET /healthz HTTP/1.1\r\nHost: test\r\n\r\n"); err != nil {
				// The server may already have closed a connection over its cap.
				c.Close()
				results[i] = result{closed: time.Since(sent)}
				continue
			}
		}
		wg.Add(1)
		go func() {
			defer wg.Done()
			defer c.Close()
			// Long past the timeouts: a connection still open then was
			// not closed by the server.
			_ = c.SetReadDeadline(sent.Add(timeout + 10*time.Second))
			data, err := io.ReadAll(c)
			// Held: kept until the idle or header timeout closed it.
			// The rest were shed: replaced by newer connections (or
			// closed at once) while the cap was reached.
			r := result{closed: time.Since(sent), held: time.Since(sent) >= timeout-100*time.Millisecond}
			if ne, ok := err.(net.Error); ok && ne.Timeout() {
				r.err = fmt.Errorf("still open %v after it went idle", r.closed.Round(time.Millisecond))
			}
			_ = data
			results[i] = r
		}()
	}
	openedIn := time.Since(opened)
	wg.Wait()
	close(stop)
	peakFiles := <-peak
	hwm, _, err := testenv.Memory(srv.pid)
	if err != nil {
		t.Fatal(err)
	}

	var held, shed []time.Duration
	failed := 0
	for i, r := range results {
		switch {
		case r.err != nil:
			if failed++; failed <= 5 {
				t.Errorf("connection %d: %v", i, r.err)
			}
		case r.held:
			held = append(held, r.closed)
		default:
			shed = append(shed, r.closed)
		}
	}
	if failed > 5 {
		t.Errorf("... and %d more connections the server never closed", failed-5)
	}
	t.Logf("%d connections opened in %v; server held %d (closed after %s), closed %d at once (after %s)",
		conns, openedIn.Round(time.Millisecond), len(held), spread(held), len(shed), spread(shed))
	t.Logf("server descriptors: %d before, %d at the peak (cap %d); memory: VmRSS %d KiB before, VmHWM %d KiB at the peak (+%d KiB)",
		baseFiles, peakFiles, DefaultMaxConns, baseRSS, hwm, hwm-baseRSS)

	if extra := peakFiles - baseFiles; extra > DefaultMaxConns+1 {
		t.Errorf("the server held %d more descriptors during the flood, want at most %d (its cap, plus one being shed)", extra, DefaultMaxConns+1)
	}
	for _, d := range held {
		if d < timeout-100*time.Millisecond || d > timeout+2*time.Second {
			t.Errorf("a held connection was closed %v after it went idle, want the %v timeout (+2s)", d, timeout)
			break
		}
	}
	if len(held) == 0 {
		t.Errorf("the server held no connection: the test did not exercise the timeouts")
	}
	// 3000 connections held by the server cost it about 85 MB; its cap
	// keeps a flood to a few, and the garbage of those it replaced.
	// (Measured without the race detector: +5.7 MiB.)
	if grew := hwm - baseRSS; grew > memoryScale*16*1024 {
		t.Errorf("server memory grew by %d KiB during the flood, want under %d MiB", grew, memoryScale*16)
	}
	if body := scrape(t, srv.addr); !strings.Contains(body, "leaderrun_is_leader") {
		t.Errorf("/metrics after the flood lacks leaderrun_is_leader:\n%s", body)
	}
	if n := openFiles(t, srv.pid); n > baseFiles+1 {
		t.Errorf("server has %d descriptors after the flood, %d before", n, baseFiles)
	}
}

// TestScrapeDespiteIdleConnections: connections that another user of the
// host opens and keeps open, reconnecting whenever one is closed, so that
// the server is always at its cap, never keep a scraper out: every scrape
// is answered, promptly.
func TestScrapeDespiteIdleConnections(t *testing.T) {
	srv := startServer(t, 30*time.Second)
	stop := make(chan struct{})
	var wg sync.WaitGroup
	for range DefaultMaxConns {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for {
				c, err := net.Dial("tcp", srv.addr)
				if err != nil {
					return
				}
				done := make(chan struct{})
				go func() {
					_, _ = io.Copy(io.Discard, c) // returns when the server closes it
					close(done)
				}()
				select {
				case <-done:
					c.Close()
				case <-stop:
					c.Close()
					<-done
					return
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
	for i := range 20 {
		start := time.Now()
		if body := scrape(t, srv.addr); !strings.Contains(body, "leaderrun_is_leader") {
			t.Fatalf("scrape %d lacks leaderrun_is_leader", i)
		}
		if d := time.Since(start); d > time.Second {
			t.Errorf("scrape %d took %v while idle connections filled the cap", i, d)
		}
	}
}

// scrape fetches /metrics on a fresh connection.
func scrape(t *testing.T, addr string) string {
	t.Helper()
	client := &http.Client{Timeout: 5 * time.Second, Transport: &http.Transport{DisableKeepAlives: true}}
	resp, err := client.Get("http://" + addr + "/metrics")
	if err != nil {
		t.Fatalf("scrape /metrics: %v", err)
	}
	defer resp.Body.Close()
	body, err := io.ReadAll(resp.Body)
	if err != nil || resp.StatusCode != http.StatusOK {
		t.Fatalf("scrape /metrics: %s, %v", resp.Status, err)
	}
	return string(body)
}

// spread summarises durations as min/median/max.
func spread(ds []time.Duration) string {
	if len(ds) == 0 {
		return "-"
	}
	s := slices.Clone(ds)
	slices.Sort(s)
	r := func(d time.Duration) time.Duration { return d.Round(time.Millisecond) }
	return fmt.Sprintf("min %v, median %v, max %v", r(s[0]), r(s[len(s)/2]), r(s[len(s)-1]))
}

// TestListenAsGiven: the address is bound as given: a loopback address
// only answers on itself, a bare :PORT on every address of the host
// (127.0.0.2 stands for "another interface": a socket bound to 127.0.0.1
// does not accept connections to it).
func TestListenAsGiven(t *testing.T) {
	tests := []struct {
		name  string
		addr  string
		reach map[string]bool
	}{
		{name: "loopback", addr: "127.0.0.1:0", reach: map[string]bool{"127.0.0.1": true, "127.0.0.2": false}},
		{name: "bare port", addr: ":0", reach: map[string]bool{"127.0.0.1": true, "127.0.0.2": true}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			s, err := Serve(tt.addr, New("job", "local"), Limits{})
			if err != nil {
				t.Fatal(err)
			}
			defer s.Close()
			_, port, err := net.SplitHostPort(s.Addr())
			if err != nil {
				t.Fatal(err)
			}
			for ip, want := range tt.reach {
				c, err := net.DialTimeout("tcp", net.JoinHostPort(ip, port), 2*time.Second)
				if got := err == nil; got != want {
					t.Errorf("listening on %s (%s): connect to %s:%s: %v, want reachable=%t", tt.addr, s.Addr(), ip, port, err, want)
				}
				if c != nil {
					c.Close()
				}
			}
		})
	}
}

// TestExposition: every metric the README lists is served under its name
// and labels, with the values the runner's events gave it, beside the Go
// runtime's and the process's own metrics.
func TestExposition(t *testing.T) {
	m := New("nightly", "etcd")
	for _, e := range []runner.Event{
		{Kind: runner.Acquired},
		{Kind: runner.ChildStarted},
		{Kind: runner.Renewed, Latency: 3 * time.Millisecond},
		{Kind: runner.RenewFailed},
		{Kind: runner.Lost, Err: fmt.Errorf("gone: %w", backends.ErrLeaseLost)},
		{Kind: runner.ChildExited, Status: signals.Status{Code: 3}},
		{Kind: runner.Skipped},
		{Kind: runner.Skipped},
	} {
		m.Observe(e)
	}
	srv := httptest.NewServer(m)
	defer srv.Close()
	body := get(t, srv.URL)
	const l = `lock="nightly",backend="etcd"`
	for _, want := range []string{
		`leaderrun_is_leader{` + l + `} 0`,
		`leader_election_master_status{name="nightly"} 0`,
		`leaderrun_acquisitions_total{` + l + `} 1`,
		`leaderrun_losses_total{` + l + `,reason="lease_lost"} 1`,
		`leaderrun_renewal_duration_seconds_bucket{` + l + `,le="0.005"} 1`,
		`leaderrun_renewal_duration_seconds_count{` + l + `} 1`,
		`leaderrun_renewal_failures_total{` + l + `} 1`,
		`leaderrun_child_starts_total{` + l + `} 1`,
		`leaderrun_child_exits_total{` + l + `,code="3"} 1`,
		`leaderrun_once_skipped_total{` + l + `} 2`,
		`# TYPE leaderrun_acquisitions_total counter`,
		"\ngo_goroutines ",
		"\nprocess_resident_memory_bytes ",
	} {
		if !strings.Contains(body, want) {
			t.Errorf("exposition lacks %q:\n%s", want, body)
		}
	}
}

// TestLeaderGauges: both leadership gauges follow acquisition and release.
func TestLeaderGauges(t *testing.T) {
	tests := []struct {
		name   string
		events []runner.EventKind
		want   string
	}{
		{"acquired", []runner.EventKind{runner.Acquired}, "1"},
		{"released", []runner.EventKind{runner.Acquired, runner.Released}, "0"},
		{"never led", nil, "0"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			m := New("g", "local")
			for _, k := range tt.events {
				m.Observe(runner.Event{Kind: k})
			}
			srv := httptest.NewServer(m)
			defer srv.Close()
			body := get(t, srv.URL)
			for _, name := range []string{`leaderrun_is_leader{lock="g",backend="local"}`, `leader_election_master_status{name="g"}`} {
				if !strings.Contains(body, "\n"+name+" "+tt.want+"\n") {
					t.Errorf("want %s %s in:\n%s", name, tt.want, body)
				}
			}
		})
	}
}

// TestHealthz: the server answers /healthz and /metrics.
func TestHealthz(t *testing.T) {
	s, err := Serve("127.0.0.1:0", New("h", "local"), Limits{})
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	if body := get(t, "http://"+s.Addr()+"/healthz"); body != "\nok\n" {
		t.Errorf("/healthz: %q", body)
	}
	if body := get(t, "http://"+s.Addr()+"/metrics"); !strings.Contains(body, "leaderrun_is_leader") {
		t.Errorf("/metrics: %q", body)
	}
}

func get(t *testing.T, url string) string {
	t.Helper()
	resp, err := http.Get(url)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	data, _ := io.ReadAll(resp.Body)
	if resp.StatusCode != http.StatusOK {
		t.Fatalf("%s: %s", url, resp.Status)
	}
	return "\n" + string(data)
}

// TestSlotGauge: leaderrun_slot is the slot a run holds (--holders), and
// -1 before it leads and once it no longer does.
func TestSlotGauge(t *testing.T) {
	tests := []struct {
		name   string
		events []runner.Event
		want   string
	}{
		{"never led", nil, "-1"},
		{"slot 2", []runner.Event{{Kind: runner.Acquired, Slot: 2}, {Kind: runner.ChildStarted, Slot: 2}}, "2"},
		{"one holder", []runner.Event{{Kind: runner.Acquired}}, "0"},
		{"lost", []runner.Event{{Kind: runner.Acquired, Slot: 1}, {Kind: runner.Lost, Slot: 1, Err: backends.ErrLeaseLost}}, "-1"},
		{"released", []runner.Event{{Kind: runner.Acquired, Slot: 1}, {Kind: runner.Released, Slot: 1}}, "-1"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			m := New("g", "local")
			for _, e := range tt.events {
				m.Observe(e)
			}
			srv := httptest.NewServer(m)
			defer srv.Close()
			if body, want := get(t, srv.URL), "\nleaderrun_slot{lock=\"g\",backend=\"local\"} "+tt.want+"\n"; !strings.Contains(body, want) {
				t.Errorf("want %q in:\n%s", want, body)
			}
		})
	}
}
