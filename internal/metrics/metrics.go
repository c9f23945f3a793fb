// Package metrics exposes the runner's events as Prometheus metrics, and
// /healthz, on --metrics-addr.
package metrics

import (
	"context"
	"errors"
	"fmt"
	"net"
	"net/http"
	"strconv"
	"sync"
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

// Serve listens on addr (host:port) and serves until Close.
func Serve(addr string, m *Metrics) (*Server, error) {
	ln, err := net.Listen("tcp", addr)
	if err != nil {
		return nil, fmt.Errorf("metrics: listen on %s: %w", addr, err)
	}
	mux := http.NewServeMux()
	mux.Handle("/metrics", promhttp.HandlerFor(m.reg, promhttp.HandlerOpts{}))
	mux.HandleFunc("/healthz", func(w http.ResponseWriter, _ *http.Request) {
		_, _ = w.Write([]byte("ok\n"))
	})
	s := &Server{srv: &http.Server{Handler: mux, ReadHeaderTimeout: 5 * time.Second}, ln: ln}
	s.wg.Add(1)
	go func() {
		defer s.wg.Done()
		_ = s.srv.Serve(ln)
	}()
	return s, nil
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
