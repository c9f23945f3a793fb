package metrics

import (
	"time"

	"github.com/leaderrun/leaderrun/runner"
)

// progressGauge is the time since the child's last progress report
// (--progress-timeout), exposed only while a child runs with the progress
// clock: a gauge that read 0 or went on counting without a child would
// page someone for nothing.
type progressGauge struct {
	last     time.Time // when the clock started or last moved; zero: not exposed
	gaugeKey string
}

// observeProgress follows the progress clock's events. m.mu guards the
// gauge's state, which the scrape reads.
func (m *Metrics) observeProgress(e runner.Event) {
	switch e.Kind {
	case runner.ProgressReported:
		m.mu.Lock()
		expose := m.progress.last.IsZero()
		m.progress.last = time.Now()
		m.mu.Unlock()
		if expose {
			m.progress.gaugeKey = "leaderrun_seconds_since_last_progress{" + m.labels + "}"
			m.set.GetOrCreateGauge(m.progress.gaugeKey, m.sinceProgress)
			// Exposed from the first clock on, so that a rate of 0 is
			// visible rather than absent.
			m.set.GetOrCreateCounter("leaderrun_progress_stalls_total{" + m.labels + "}")
		}
	case runner.Stalled:
		m.set.GetOrCreateCounter("leaderrun_progress_stalls_total{" + m.labels + "}").Inc()
		m.hideProgress()
	case runner.Lost, runner.Stopping, runner.ChildExited, runner.Released:
		m.hideProgress()
	}
}

// hideProgress stops exposing the gauge: no child runs under the clock.
func (m *Metrics) hideProgress() {
	m.mu.Lock()
	shown := !m.progress.last.IsZero()
	m.progress.last = time.Time{}
	m.mu.Unlock()
	if shown {
		m.set.UnregisterMetric(m.progress.gaugeKey)
	}
}

func (m *Metrics) sinceProgress() float64 {
	m.mu.Lock()
	defer m.mu.Unlock()
	if m.progress.last.IsZero() {
		return 0
	}
	return time.Since(m.progress.last).Seconds()
}
