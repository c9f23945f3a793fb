// Package metrics exposes the runner's events as Prometheus metrics, and
// /healthz, on --metrics-addr.
//
// The metrics are kept with VictoriaMetrics' small metrics package rather
// than the Prometheus client: its package init costs next to nothing, which
// every run of leaderrun pays whether --metrics-addr is set or not.
package metrics

import (
	"context"
	"errors"
	"fmt"
	"io"
	"log"
	"net"
	"net/http"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	vm "github.com/VictoriaMetrics/metrics"

	"github.com/leaderrun/leaderrun/backends"
	"github.com/leaderrun/leaderrun/runner"
)

// renewBuckets are the upper bounds of leaderrun_renewal_duration_seconds.
var renewBuckets = []float64{.0005, .001, .0025, .005, .01, .025, .05, .1, .25, .5, 1, 2.5, 5}

// Metrics is a runner.Observer that keeps the counters.
type Metrics struct {
	set    *vm.Set
	labels string // lock="...",backend="..."

	leader        float64 // 1 while leading; read by the two gauges
	slot          float64 // the slot held (--holders), -1 while not leading
	mu            sync.Mutex
	acquisitions  *vm.Counter
	renewLatency  *vm.PrometheusHistogram
	renewFailures *vm.Counter
	childStarts   *vm.Counter
	onceSkipped   *vm.Counter
	progress      progressGauge // progress.go; its times under mu
}

// New returns metrics for lock, in a set of their own; the handler adds
// the Go runtime's and the process's own metrics.
func New(lock, backend string) *Metrics {
	// # TYPE lines, so that scrapers know counters from gauges.
	vm.ExposeMetadata(true)
	m := &Metrics{set: vm.NewSet(), labels: "lock=" + quote(lock) + ",backend=" + quote(backend), slot: -1}
	m.set.NewGauge("leaderrun_is_leader{"+m.labels+"}", m.leading)
	// The name and label that Kubernetes' leader election exports, so
	// that dashboards built for it work unchanged.
	m.set.NewGauge("leader_election_master_status{name="+quote(lock)+"}", m.leading)
	// Which slot of a pool (--holders) this run holds: a gauge rather
	// than a label, so that every series keeps its name and labels
	// whichever slot a run wins.
	m.set.NewGauge("leaderrun_slot{"+m.labels+"}", m.heldSlot)
	m.acquisitions = m.set.NewCounter("leaderrun_acquisitions_total{" + m.labels + "}")
	m.renewLatency = m.set.NewPrometheusHistogramExt("leaderrun_renewal_duration_seconds{"+m.labels+"}", renewBuckets)
	m.renewFailures = m.set.NewCounter("leaderrun_renewal_failures_total{" + m.labels + "}")
	m.childStarts = m.set.NewCounter("leaderrun_child_starts_total{" + m.labels + "}")
	// Runs not started because --once-per or --once-key found them done.
	m.onceSkipped = m.set.NewCounter("leaderrun_once_skipped_total{" + m.labels + "}")
	return m
}

// quote is a label value in the exposition format's quotes.
func quote(v string) string {
	return `"` + strings.NewReplacer(`\`, `\\`, `"`, `\"`, "\n", `\n`).Replace(v) + `"`
}

func (m *Metrics) leading() float64 {
	m.mu.Lock()
	defer m.mu.Unlock()
	return m.leader
}

func (m *Metrics) heldSlot() float64 {
	m.mu.Lock()
	defer m.mu.Unlock()
	return m.slot
}

// Observe implements runner.Observer.
func (m *Metrics) Observe(e runner.Event) {
	m.observeProgress(e)
	switch e.Kind {
	case runner.Acquired:
		m.acquisitions.Inc()
		m.setLeader(1)
		m.mu.Lock()
		m.slot = float64(e.Slot)
		m.mu.Unlock()
	case runner.ChildStarted:
		m.childStarts.Inc()
	case runner.Renewed:
		m.renewLatency.Update(e.Latency.Seconds())
	case runner.RenewFailed:
		m.renewFailures.Inc()
	case runner.Lost:
		reason := "renew_deadline"
		if errors.Is(e.Err, backends.ErrLeaseLost) {
			reason = "lease_lost"
		}
		m.set.GetOrCreateCounter("leaderrun_losses_total{" + m.labels + ",reason=" + quote(reason) + "}").Inc()
		m.setLeader(0)
	case runner.ChildExited:
		code := strconv.Itoa(e.Status.ExitCode())
		m.set.GetOrCreateCounter("leaderrun_child_exits_total{" + m.labels + ",code=" + quote(code) + "}").Inc()
	case runner.Skipped:
		m.onceSkipped.Inc()
	case runner.Released:
		m.setLeader(0)
	}
}

func (m *Metrics) setLeader(v float64) {
	m.mu.Lock()
	m.leader = v
	if v == 0 {
		m.slot = -1
	}
	m.mu.Unlock()
}

// ServeHTTP writes the exposition: leaderrun's metrics, then the Go
// runtime's (go_*) and the process's (process_*).
func (m *Metrics) ServeHTTP(w http.ResponseWriter, _ *http.Request) {
	w.Header().Set("Content-Type", "text/plain; version=0.0.4; charset=utf-8")
	m.set.WritePrometheus(w)
	vm.WriteProcessMetrics(w)
}

// Server serves /metrics and /healthz.
type Server struct {
	srv *http.Server
	ln  net.Listener
	wg  sync.WaitGroup
}

// The defaults of Limits. A scrape is one small request and response (a
// Prometheus scrape times out after 10 s by default), and a scraper comes
// back every 15 s to a minute: nothing legitimate needs a connection to
// stay idle, send its headers slowly or hold one of many slots.
const (
	DefaultReadHeaderTimeout = 5 * time.Second
	DefaultReadTimeout       = 10 * time.Second
	DefaultWriteTimeout      = 10 * time.Second
	DefaultIdleTimeout       = 30 * time.Second
	DefaultMaxConns          = 64
)

// Limits bound what clients can make the metrics server hold: without
// them every idle keep-alive connection keeps a descriptor and a goroutine
// forever, and a flood of them takes memory and the descriptors that
// renewals and the child need. Each field's zero value is its default.
type Limits struct {
	// ReadHeaderTimeout closes a connection whose request headers have not
	// all arrived this long after it was accepted, or after its previous
	// response (a client that connects and sends nothing). Default 5 s.
	ReadHeaderTimeout time.Duration
	// ReadTimeout bounds the reading of a whole request, headers and
	// all: no body is ever read (a request with one is refused, see
	// bodiless). Default 10 s.
	ReadTimeout time.Duration
	// WriteTimeout bounds the writing of a response to a client that reads
	// slowly. Default 10 s.
	WriteTimeout time.Duration
	// IdleTimeout closes a keep-alive connection that has sent no new
	// request this long after its last response. Too short costs a scraper
	// a reconnect per scrape, nothing more. Default 30 s.
	IdleTimeout time.Duration
	// MaxConns caps the connections open at once. One more takes the
	// place of the oldest connection that is not serving a request, or,
	// if all are, of the one that has been serving its request longest,
	// so a flood costs neither descriptors nor memory, and neither idle
	// nor busy connections can lock a scraper out. Default 64.
	MaxConns int
}

func (l Limits) withDefaults() Limits {
	def := func(d *time.Duration, v time.Duration) {
		if *d <= 0 {
			*d = v
		}
	}
	def(&l.ReadHeaderTimeout, DefaultReadHeaderTimeout)
	def(&l.ReadTimeout, DefaultReadTimeout)
	def(&l.WriteTimeout, DefaultWriteTimeout)
	def(&l.IdleTimeout, DefaultIdleTimeout)
	if l.MaxConns <= 0 {
		l.MaxConns = DefaultMaxConns
	}
	return l
}

// Serve listens on addr (host:port) as given, so ":9464" means every
// interface, and serves within lim until Close.
func Serve(addr string, m *Metrics, lim Limits) (*Server, error) {
	lim = lim.withDefaults()
	ln, err := net.Listen("tcp", addr)
	if err != nil {
		return nil, fmt.Errorf("metrics: listen on %s: %w", addr, err)
	}
	mux := http.NewServeMux()
	mux.Handle("/metrics", m)
	mux.HandleFunc("/healthz", func(w http.ResponseWriter, _ *http.Request) {
		_, _ = w.Write([]byte("ok\n"))
	})
	capped := &capped{Listener: ln, max: lim.MaxConns}
	s := &Server{
		srv: &http.Server{
			Handler:           bodiless(mux),
			ReadHeaderTimeout: lim.ReadHeaderTimeout,
			ReadTimeout:       lim.ReadTimeout,
			WriteTimeout:      lim.WriteTimeout,
			IdleTimeout:       lim.IdleTimeout,
			MaxHeaderBytes:    8 << 10,
			// The server's own log would go to stderr unstructured, one
			// line per bad client.
			ErrorLog: log.New(io.Discard, "", 0),
		},
		ln: capped,
	}
	s.srv.ConnState = capped.track
	s.wg.Add(1)
	go func() {
		defer s.wg.Done()
		_ = s.srv.Serve(s.ln)
	}()
	return s, nil
}

// bodiless refuses, at once and without reading it, a request that has a
// body or a method other than GET and HEAD (405, or 413), and closes its
// connection then and there. The server would otherwise read up to 256
// KiB of an unread body before it answers, so as to reuse the connection,
// and a client that sends the body a byte at a time would keep the
// connection busy for the whole ReadTimeout; with many such, busy
// connections fill the cap.
func bodiless(h http.Handler) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		status := 0
		switch {
		case r.Method != http.MethodGet && r.Method != http.MethodHead:
			w.Header().Set("Allow", "GET, HEAD")
			status = http.StatusMethodNotAllowed
		case r.ContentLength != 0 || len(r.TransferEncoding) > 0:
			status = http.StatusRequestEntityTooLarge
		default:
			h.ServeHTTP(w, r)
			return
		}
		w.Header().Set("Connection", "close")
		w.Header().Set("Content-Length", "0")
		w.WriteHeader(status)
		// Hijacking sends the answer; closing the connection ourselves
		// spares it the half-second the server lingers on a connection
		// whose body it left unread.
		if c, _, err := http.NewResponseController(w).Hijack(); err == nil {
			c.Close()
		}
	})
}

// capped is a listener that keeps at most max connections open. At the
// cap, a new connection takes the place of the oldest one that is not
// serving a request (new, or idle between keep-alive requests), or, when
// every open connection is busy, of the one that has been busy longest: a
// scrape takes milliseconds, so what stays busy (a request or a reader
// that trickles) is what keeps others out. So connections left open by
// anyone (another user of the host, say) can never lock a scraper out: a
// scraper's connection is the newest, and is done with its request before
// the others have been busy as long.
type capped struct {
	net.Listener
	max  int
	mu   sync.Mutex
	open []*cappedConn // in the order they were accepted
}

func (l *capped) Accept() (net.Conn, error) {
	c, err := l.Listener.Accept()
	if err != nil {
		return nil, err
	}
	cc := &cappedConn{Conn: c, l: l}
	l.mu.Lock()
	var victim *cappedConn
	if len(l.open) >= l.max {
		victim = l.victim()
	}
	l.open = append(l.open, cc)
	l.mu.Unlock()
	if victim != nil {
		victim.Close()
	}
	return cc, nil
}

// victim is the connection to close for a new one, with l.mu held: the
// oldest that is new or idle, else the one busy the longest.
func (l *capped) victim() *cappedConn {
	var busiest *cappedConn
	for _, o := range l.open {
		if st := http.ConnState(o.state.Load()); st == http.StateNew || st == http.StateIdle {
			return o
		}
		if busiest == nil || o.busySince.Load() < busiest.busySince.Load() {
			busiest = o
		}
	}
	return busiest
}

// track is the server's ConnState hook: it records each connection's
// state, and when it became busy, for Accept to choose what it may close.
func (l *capped) track(c net.Conn, st http.ConnState) {
	if cc, ok := c.(*cappedConn); ok {
		if st == http.StateActive {
			cc.busySince.Store(int64(time.Since(epoch)))
		}
		cc.state.Store(int32(st))
	}
}

// epoch is what busySince counts from, on the monotonic clock.
var epoch = time.Now()

// cappedConn frees its slot when it is closed, once however often Close
// is called.
type cappedConn struct {
	net.Conn
	l     *capped
	state atomic.Int32 // an http.ConnState; StateNew (0) until the server says
	// busySince is when the connection last became busy (StateActive),
	// in nanoseconds since epoch.
	busySince atomic.Int64
	once      sync.Once
}

func (c *cappedConn) Close() error {
	err := c.Conn.Close()
	c.once.Do(func() {
		c.l.mu.Lock()
		defer c.l.mu.Unlock()
		if i := slices.Index(c.l.open, c); i >= 0 {
			c.l.open = slices.Delete(c.l.open, i, i+1)
		}
	})
	return err
}

// Addr is the address actually listened on (useful with port 0).
func (s *Server) Addr() string { return s.ln.Addr().String() }

// Close shuts the server down and waits for it.
func (s *Server) Close() error {
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
	defer cancel()
	err := s.srv.Shutdown(ctx)
	s.wg.Wait()
	return err
}
