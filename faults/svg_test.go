package faults

import (
	"fmt"
	"html"
	"strings"
	"time"
)

// timeline draws one trial: a row per candidate, its children's lives as
// bars labelled with their tokens, the fault shaded, accepted writes as
// thin ticks and rejected (stale) writes as red crosses.
func timeline(title string, tr *trial, v verdict) string {
	const (
		left, right, top, rowH, barH = 70.0, 20.0, 40.0, 46.0, 22.0
		width                        = 1000.0
	)
	span := tr.end.Sub(tr.begin)
	if span <= 0 {
		span = time.Second
	}
	plot := width - left - right
	x := func(t time.Time) float64 {
		return left + plot*float64(t.Sub(tr.begin))/float64(span)
	}
	rowOf := map[string]int{}
	for i, c := range tr.cands {
		rowOf[c.id] = i
	}
	height := top + rowH*float64(len(tr.cands)) + 56
	var b strings.Builder
	fmt.Fprintf(&b, `<svg xmlns="http://www.w3.org/2000/svg" width="%.0f" height="%.0f" font-family="sans-serif" font-size="12">`+"\n", width, height)
	fmt.Fprintf(&b, `<rect width="100%%" height="100%%" fill="white"/>`+"\n")
	fmt.Fprintf(&b, `<text x="%.0f" y="20" font-size="14" font-weight="bold">%s</text>`+"\n", left, html.EscapeString(title))
	// The fault.
	fx0, fx1 := x(tr.faultStart), x(tr.faultEnd)
	if fx1-fx0 < 2 {
		fx1 = fx0 + 2
	}
	fmt.Fprintf(&b, `<rect x="%.1f" y="%.0f" width="%.1f" height="%.0f" fill="#f4c7c3" opacity="0.6"/>`+"\n",
		fx0, top-8, fx1-fx0, rowH*float64(len(tr.cands))+8)
	fmt.Fprintf(&b, `<text x="%.1f" y="%.0f" fill="#a33">%s</text>`+"\n", fx0+3, top+rowH*float64(len(tr.cands))-6, html.EscapeString(tr.fault.name))
	colors := []string{"#4e79a7", "#59a14f", "#f28e2b", "#b07aa1"}
	for i, c := range tr.cands {
		y := top + rowH*float64(i)
		fmt.Fprintf(&b, `<text x="8" y="%.1f">%s</text>`+"\n", y+barH/2+4, c.id)
		fmt.Fprintf(&b, `<line x1="%.0f" x2="%.0f" y1="%.1f" y2="%.1f" stroke="#ddd"/>`+"\n", left, width-right, y+barH/2, y+barH/2)
	}
	writerRow := map[string]int{}
	for _, lf := range v.lives {
		i, ok := rowOf[lf.Identity]
		if !ok {
			continue
		}
		writerRow[lf.Writer] = i
		y := top + rowH*float64(i)
		x0, x1 := x(lf.Start), x(lf.End)
		fmt.Fprintf(&b, `<rect x="%.1f" y="%.1f" width="%.1f" height="%.0f" fill="%s" rx="3"/>`+"\n",
			x0, y, max(x1-x0, 1), barH, colors[i%len(colors)])
		fmt.Fprintf(&b, `<text x="%.1f" y="%.1f" fill="white" font-weight="bold">token %d</text>`+"\n", x0+4, y+barH/2+4, lf.Token)
	}
	for _, w := range v.writes {
		i, ok := writerRow[w.Writer]
		if !ok {
			continue
		}
		y := top + rowH*float64(i)
		wx := x(w.At)
		if w.Accepted {
			fmt.Fprintf(&b, `<line x1="%.1f" x2="%.1f" y1="%.1f" y2="%.1f" stroke="#333" stroke-width="0.5"/>`+"\n", wx, wx, y+barH, y+barH+5)
		} else {
			fmt.Fprintf(&b, `<path d="M%.1f %.1f l6 6 m0 -6 l-6 6" stroke="#d00" stroke-width="2"/>`+"\n", wx-3, y+barH+2)
		}
	}
	// Time axis.
	axisY := top + rowH*float64(len(tr.cands)) + 10
	step := time.Second
	if span > 30*time.Second {
		step = 5 * time.Second
	}
	for t := time.Duration(0); t <= span; t += step {
		tx := left + plot*float64(t)/float64(span)
		fmt.Fprintf(&b, `<line x1="%.1f" x2="%.1f" y1="%.0f" y2="%.0f" stroke="#999"/>`+"\n", tx, tx, axisY-4, axisY)
		fmt.Fprintf(&b, `<text x="%.1f" y="%.0f" text-anchor="middle" fill="#666">%ds</text>`+"\n", tx, axisY+14, int(t.Seconds()))
	}
	fmt.Fprintf(&b, `<text x="%.0f" y="%.0f" fill="#666">bars: a child's life (token); ticks: accepted writes; red crosses: writes rejected as stale</text>`+"\n", left, axisY+30)
	b.WriteString("</svg>\n")
	return b.String()
}
