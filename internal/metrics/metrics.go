// Package metrics exposes the runner's events as Prometheus metrics, and
// /healthz, on --metrics-addr.
package metrics

import (
	"context"
	"errors"
	"fmt"
	"io"
	"log"
	"net"
	"net/http"
	"strconv"
	"sync"
	"sync/atomic"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/collectors"
	"github.com/prometheus/client_golang/prometheus/promhttp"

	"github.com/leaderrun/leaderrun/backends"
	"github.com/leaderrun/leaderrun/runner"
)

// Metrics is a runner.Observer that keeps the counters.
type Metrics struct {
	reg *prometheus.Registry

	isLeader      prometheus.Gauge
	masterStatus  prometheus.Gauge
	acquisitions  prometheus.Counter
	losses        *prometheus.CounterVec
	renewLatency  prometheus.Histogram
	renewFailures prometheus.Counter
	childStarts   prometheus.Counter
	childExits    *prometheus.CounterVec
}

// New returns metrics for lock, in a registry of their own with the Go and
// process collectors.
func New(lock, backend string) *Metrics {
	reg := prometheus.NewRegistry()
	labels := prometheus.Labels{"lock": lock, "backend": backend}
	m := &Metrics{
		reg: reg,
		isLeader: prometheus.NewGauge(prometheus.GaugeOpts{Name: "leaderrun_is_leader", ConstLabels: labels,
			Help: "1 while this process holds the lock, else 0."}),
		// The name and label that Kubernetes' leader election exports, so
		// that dashboards built for it work unchanged.
		masterStatus: prometheus.NewGauge(prometheus.GaugeOpts{Name: "leader_election_master_status",
			ConstLabels: prometheus.Labels{"name": lock},
			Help:        "1 while this process is the leader of the named lock, else 0 (Kubernetes-compatible)."}),
		acquisitions: prometheus.NewCounter(prometheus.CounterOpts{Name: "leaderrun_acquisitions_total", ConstLabels: labels,
			Help: "Times leadership was acquired."}),
		losses: prometheus.NewCounterVec(prometheus.CounterOpts{Name: "leaderrun_losses_total", ConstLabels: labels,
			Help: "Times leadership was lost while the command ran, by reason (lease_lost: the store said so; renew_deadline: no acknowledged renewal in time)."},
			[]string{"reason"}),
		renewLatency: prometheus.NewHistogram(prometheus.HistogramOpts{Name: "leaderrun_renewal_duration_seconds", ConstLabels: labels,
			Help:    "Time from sending a renewal to its acknowledgement.",
			Buckets: []float64{.0005, .001, .0025, .005, .01, .025, .05, .1, .25, .5, 1, 2.5, 5}}),
		renewFailures: prometheus.NewCounter(prometheus.CounterOpts{Name: "leaderrun_renewal_failures_total", ConstLabels: labels,
			Help: "Renewals that failed or timed out."}),
		childStarts: prometheus.NewCounter(prometheus.CounterOpts{Name: "leaderrun_child_starts_total", ConstLabels: labels,
			Help: "Times the command was started."}),
		childExits: prometheus.NewCounterVec(prometheus.CounterOpts{Name: "leaderrun_child_exits_total", ConstLabels: labels,
			Help: "Command exits by exit code (128+N for signal N)."}, []string{"code"}),
	}
	reg.MustRegister(m.isLeader, m.masterStatus, m.acquisitions, m.losses, m.renewLatency, m.renewFailures,
		m.childStarts, m.childExits,
		collectors.NewGoCollector(), collectors.NewProcessCollector(collectors.ProcessCollectorOpts{}))
	return m
}

// Observe implements runner.Observer.
func (m *Metrics) Observe(e runner.Event) {
	switch e.Kind {
	case runner.Acquired:
		m.acquisitions.Inc()
		m.setLeader(1)
	case runner.ChildStarted:
		m.childStarts.Inc()
	case runner.Renewed:
		m.renewLatency.Observe(e.Latency.Seconds())
	case runner.RenewFailed:
		m.renewFailures.Inc()
	case runner.Lost:
		reason := "renew_deadline"
		if errors.Is(e.Err, backends.ErrLeaseLost) {
			reason = "lease_lost"
		}
		m.losses.WithLabelValues(reason).Inc()
		m.setLeader(0)
	case runner.ChildExited:
		m.childExits.WithLabelValues(strconv.Itoa(e.Status.ExitCode())).Inc()
	case runner.Released:
		m.setLeader(0)
	}
}

func (m *Metrics) setLeader(v float64) {
	m.isLeader.Set(v)
	m.masterStatus.Set(v)
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
	// ReadTimeout bounds the reading of a whole request. Default 10 s.
	ReadTimeout time.Duration
	// WriteTimeout bounds the writing of a response to a client that reads
	// slowly. Default 10 s.
	WriteTimeout time.Duration
	// IdleTimeout closes a keep-alive connection that has sent no new
	// request this long after its last response. Too short costs a scraper
	// a reconnect per scrape, nothing more. Default 30 s.
	IdleTimeout time.Duration
	// MaxConns caps the connections open at once; one more is closed as
	// soon as it is accepted, rather than queued behind the others, so a
	// flood costs neither descriptors nor memory and a scraper gets in as
	// soon as the timeouts free a slot. Default 64.
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
	mux.Handle("/metrics", promhttp.HandlerFor(m.reg, promhttp.HandlerOpts{}))
	mux.HandleFunc("/healthz", func(w http.ResponseWriter, _ *http.Request) {
		_, _ = w.Write([]byte("ok\n"))
	})
	s := &Server{
		srv: &http.Server{
			Handler:           mux,
			ReadHeaderTimeout: lim.ReadHeaderTimeout,
			ReadTimeout:       lim.ReadTimeout,
			WriteTimeout:      lim.WriteTimeout,
			IdleTimeout:       lim.IdleTimeout,
			MaxHeaderBytes:    8 << 10,
			// The server's own log would go to stderr unstructured, one
			// line per bad client.
			ErrorLog: log.New(io.Discard, "", 0),
		},
		ln: &capped{Listener: ln, max: int64(lim.MaxConns)},
	}
	s.wg.Add(1)
	go func() {
		defer s.wg.Done()
		_ = s.srv.Serve(s.ln)
	}()
	return s, nil
}

// capped is a listener that keeps at most max connections open: it closes
// the ones over the cap as it accepts them.
type capped struct {
	net.Listener
	max  int64
	open atomic.Int64
}

func (l *capped) Accept() (net.Conn, error) {
	for {
		c, err := l.Listener.Accept()
		if err != nil {
			return nil, err
		}
		if l.open.Add(1) <= l.max {
			return &cappedConn{Conn: c, l: l}, nil
		}
		l.open.Add(-1)
		c.Close()
	}
}

// cappedConn frees its slot when it is closed, once however often Close
// is called.
type cappedConn struct {
	net.Conn
	l    *capped
	once sync.Once
}

func (c *cappedConn) Close() error {
	err := c.Conn.Close()
	c.once.Do(func() { c.l.open.Add(-1) })
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
