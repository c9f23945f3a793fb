package bench

import (
	"fmt"
	"html"
	"math"
	"strings"
	"time"
)

// plotRow is one strip of a panel: a tool's values of one figure.
type plotRow struct {
	label string
	color string
	s     *sample
}

// plotPanel is one figure: a strip per tool on a log time axis.
type plotPanel struct {
	title string
	rows  []plotRow
}

var toolColor = map[string]string{
	direct.id: "#8c8c8c", lrEtcd.id: "#2f6ea6", etcdctlLock.id: "#e8871e", lrConsul.id: "#3c9a3c", consulLock.id: "#c8413c",
	lrPostgres.id: "#7b4fa6", lrKube.id: "#1f9eb0", clientGo.id: "#b08a1f", lrZK.id: "#a6507b", lrLocal.id: "#555555",
}

// plot draws docs/benchmarks.svg: per figure, every run as a dot, the
// interquartile range as a box and the median as a bar, on a log scale;
// runs that never saw the event are counted at the right in red.
func (r *results) plot() string {
	rowsOf := func(m map[string]*sample, tools []*tool) []plotRow {
		var out []plotRow
		for _, tl := range tools {
			out = append(out, plotRow{tl.name, toolColor[tl.id], m[tl.id]})
		}
		return out
	}
	handover := rowsOf(r.handover, latencyTools)
	for _, col := range storeColumns {
		if h := r.herd[col.name]; h != nil && len(h.handover.vals) > 0 {
			handover = append(handover, plotRow{fmt.Sprintf("%s, %d followers", col.lr.name, h.followers), toolColor[col.lr.id], &h.handover})
		}
	}
	panels := []plotPanel{
		{"Start-to-child on a free lock (wrapper fork → child's main; client-go: → OnStartedLeading)", rowsOf(r.s2c, append([]*tool{direct}, wrappers...))},
		{"Exec-to-exit on a free lock (wrapper fork → its exit; the child exits at once)", rowsOf(r.exit, append([]*tool{direct}, nonElectors(wrappers)...))},
		{"Graceful handover (SIGTERM to the leader → follower's child starts)", handover},
		{"Loss reaction (the store drops the holder → child gets SIGTERM)", rowsOf(r.loss, latencyTools)},
		{"Crash failover (kill -9 of the leading wrapper → follower's child starts)", rowsOf(r.crash, latencyTools)},
	}
	const (
		width, left, right  = 1000.0, 250.0, 170.0
		rowH, titleH, axisH = 26.0, 30.0, 34.0
	)
	plotW := width - left - right
	height := 50.0
	for _, p := range panels {
		height += titleH + rowH*float64(len(p.rows)) + axisH
	}
	var b strings.Builder
	fmt.Fprintf(&b, `<svg xmlns="http://www.w3.org/2000/svg" width="%.0f" height="%.0f" font-family="sans-serif" font-size="12">`+"\n", width, height)
	b.WriteString(`<rect width="100%" height="100%" fill="white"/>` + "\n")
	fmt.Fprintf(&b, `<text x="10" y="22" font-size="15" font-weight="bold">leaderrun on every store vs etcdctl lock, consul lock and client-go's elector: latency distributions (log scale)</text>`+"\n")
	fmt.Fprintf(&b, `<text x="10" y="40" fill="#555">dots: runs; box: p25–p75; bar: median (value at right); red: runs in which it never happened within the bound</text>`+"\n")
	y := 50.0
	for _, p := range panels {
		lo, hi := panelRange(p.rows)
		x := func(d time.Duration) float64 {
			v := math.Log10(max(float64(d), float64(lo)))
			return left + plotW*(v-math.Log10(float64(lo)))/(math.Log10(float64(hi))-math.Log10(float64(lo)))
		}
		fmt.Fprintf(&b, `<text x="10" y="%.1f" font-size="13" font-weight="bold">%s</text>`+"\n", y+20, html.EscapeString(p.title))
		y += titleH
		top := y
		bottom := y + rowH*float64(len(p.rows))
		for _, tk := range ticks(lo, hi) {
			tx := x(tk)
			fmt.Fprintf(&b, `<line x1="%.1f" x2="%.1f" y1="%.1f" y2="%.1f" stroke="#e4e4e4"/>`+"\n", tx, tx, top, bottom)
			fmt.Fprintf(&b, `<text x="%.1f" y="%.1f" text-anchor="middle" fill="#555">%s</text>`+"\n", tx, bottom+15, tickLabel(tk))
		}
		fmt.Fprintf(&b, `<line x1="%.0f" x2="%.0f" y1="%.1f" y2="%.1f" stroke="#888"/>`+"\n", left, left+plotW, bottom, bottom)
		for i, row := range p.rows {
			cy := top + rowH*float64(i) + rowH/2
			if i%2 == 1 {
				fmt.Fprintf(&b, `<rect x="%.0f" y="%.1f" width="%.0f" height="%.0f" fill="#f6f6f6"/>`+"\n", left, cy-rowH/2, plotW, rowH)
			}
			fmt.Fprintf(&b, `<text x="%.0f" y="%.1f" text-anchor="end">%s</text>`+"\n", left-8, cy+4, html.EscapeString(row.label))
			s := row.s
			if s == nil || s.runs() == 0 {
				fmt.Fprintf(&b, `<text x="%.0f" y="%.1f" fill="#999">not measured</text>`+"\n", left+6, cy+4)
				continue
			}
			if len(s.vals) > 0 {
				q1, q3, med := percentile(s.vals, .25), percentile(s.vals, .75), percentile(s.vals, .5)
				fmt.Fprintf(&b, `<rect x="%.1f" y="%.1f" width="%.1f" height="%.0f" fill="%s" fill-opacity="0.18" stroke="%s"/>`+"\n",
					x(q1), cy-8, max(x(q3)-x(q1), 1), 16.0, row.color, row.color)
				for j, v := range s.vals {
					jitter := float64(j%7-3) * 1.8
					fmt.Fprintf(&b, `<circle cx="%.1f" cy="%.1f" r="2.6" fill="%s" fill-opacity="0.75"/>`+"\n", x(v), cy+jitter, row.color)
				}
				fmt.Fprintf(&b, `<line x1="%.1f" x2="%.1f" y1="%.1f" y2="%.1f" stroke="black" stroke-width="2.5"/>`+"\n", x(med), x(med), cy-10, cy+10)
				fmt.Fprintf(&b, `<text x="%.0f" y="%.1f">p50 %s</text>`+"\n", left+plotW+10, cy+4, fmtDur(med))
			}
			if s.never > 0 {
				label := fmt.Sprintf("never: %d of %d", s.never, s.runs())
				if len(s.vals) > 0 {
					label = fmt.Sprintf("+ never: %d", s.never)
				}
				tx := left + plotW - 4
				if len(s.vals) > 0 {
					tx = left + plotW + 95
				}
				fmt.Fprintf(&b, `<text x="%.0f" y="%.1f" fill="#c00" font-weight="bold" text-anchor="end">%s</text>`+"\n", tx, cy+4, label)
			}
		}
		y = bottom + axisH
	}
	b.WriteString("</svg>\n")
	return b.String()
}

func nonElectors(tools []*tool) []*tool {
	var out []*tool
	for _, tl := range tools {
		if !tl.elector {
			out = append(out, tl)
		}
	}
	return out
}

// panelRange is a log axis's ends: around every value, snapped out to a
// 1-2-5 step, at least one decade wide.
func panelRange(rows []plotRow) (lo, hi time.Duration) {
	lo, hi = time.Duration(math.MaxInt64), 0
	for _, r := range rows {
		if r.s == nil {
			continue
		}
		for _, v := range r.s.vals {
			lo, hi = min(lo, v), max(hi, v)
		}
	}
	if hi == 0 {
		return time.Millisecond, time.Second
	}
	lo, hi = max(lo, 10*time.Microsecond), max(hi, lo)
	steps := ticks(time.Microsecond, 1000*time.Second)
	for i := len(steps) - 1; i >= 0; i-- {
		if steps[i] <= lo {
			lo = steps[i]
			break
		}
	}
	for _, s := range steps {
		if s >= hi {
			hi = s
			break
		}
	}
	if float64(hi)/float64(lo) < 10 {
		hi = lo * 10
	}
	return lo, hi
}

// ticks are the 1-2-5 steps within [lo, hi].
func ticks(lo, hi time.Duration) []time.Duration {
	var out []time.Duration
	for dec := time.Microsecond; dec <= 1000*time.Second; dec *= 10 {
		for _, m := range []time.Duration{1, 2, 5} {
			if v := dec * m; v >= lo && v <= hi {
				out = append(out, v)
			}
		}
	}
	return out
}

func tickLabel(d time.Duration) string {
	switch {
	case d >= time.Second:
		return fmt.Sprintf("%g s", d.Seconds())
	case d >= time.Millisecond:
		return fmt.Sprintf("%g ms", float64(d)/1e6)
	}
	return fmt.Sprintf("%g µs", float64(d)/1e3)
}
