package faults

import (
	"fmt"
	"slices"
	"sort"
	"strings"
	"time"
)

// outlivesSlack is how long a child may be seen after its leaderrun ended:
// the ledger notices a closed connection a moment after the fact, and after
// a SIGKILL of leaderrun the watchdog needs to see its socket close.
const outlivesSlack = time.Second

// verdict is what one trial showed.
type verdict struct {
	leaderChanges int
	overlap       []string // (a)
	tokenOrder    []string // (b)
	acceptedLower []string // (c)
	outlived      []string // (d)
	falseFailover bool     // (e)
	staleRejected int
	failover      time.Duration // fault → new leader's first write; -1 if none
	lives         []life
	writes        []write
}

func (v verdict) violations() int {
	n := len(v.overlap) + len(v.tokenOrder) + len(v.acceptedLower) + len(v.outlived)
	if v.falseFailover {
		n++
	}
	return n
}

func (v verdict) problems() string {
	var all []string
	all = append(all, v.overlap...)
	all = append(all, v.tokenOrder...)
	all = append(all, v.acceptedLower...)
	all = append(all, v.outlived...)
	if v.falseFailover {
		all = append(all, "(e) leadership changed although the fault should not cause a failover")
	}
	return strings.Join(all, "\n")
}

// check evaluates the invariants on a finished trial.
func (tr *trial) check() verdict {
	if tr.slots != nil {
		return tr.checkPool()
	}
	writes, lives := tr.ledger.snapshot()
	sort.Slice(lives, func(i, j int) bool { return lives[i].Start.Before(lives[j].Start) })
	v := verdict{lives: lives, writes: writes, failover: -1}
	for i := range lives {
		if lives[i].End.IsZero() {
			lives[i].End = tr.end
		}
	}
	terms := termsOf(lives)
	v.leaderChanges = max(len(terms)-1, 0)

	// (a) No two leaders' trees at once (a child and the helpers it
	// started are one tree), except a paused old tree whose every write
	// after the takeover was rejected.
	for i := 1; i < len(terms); i++ {
		prev, cur := terms[i-1], terms[i]
		if !cur.Start.Before(prev.End) {
			continue
		}
		if tr.fault.overlapAllowed {
			// The takeover is the new leader's first accepted write.
			takeover, ok := firstAcceptedOf(writes, cur.writers)
			for _, w := range writes {
				if ok && slices.Contains(prev.writers, w.Writer) && w.Accepted && w.At.After(takeover) {
					v.overlap = append(v.overlap, fmt.Sprintf("(a) stale child %s (token %d) had a write accepted %v after %s (token %d) took over",
						w.Writer, prev.Token, w.At.Sub(takeover).Round(time.Millisecond), cur.Writer, cur.Token))
				}
			}
			continue
		}
		v.overlap = append(v.overlap, fmt.Sprintf("(a) %s (token %d) started %v before %s (token %d) ended",
			cur.Writer, cur.Token, prev.End.Sub(cur.Start).Round(time.Millisecond), prev.lastWriter, prev.Token))
	}
	// (b) The token grows at every change of leader.
	for i := 1; i < len(terms); i++ {
		if terms[i].Token <= terms[i-1].Token {
			v.tokenOrder = append(v.tokenOrder, fmt.Sprintf("(b) token went from %d (%s) to %d (%s)",
				terms[i-1].Token, terms[i-1].Writer, terms[i].Token, terms[i].Writer))
		}
	}
	// (c) No write accepted with a token below one already accepted.
	var high uint64
	for _, w := range writes {
		if !w.Accepted {
			v.staleRejected++
			continue
		}
		if w.Token < high {
			v.acceptedLower = append(v.acceptedLower, fmt.Sprintf("(c) write by %s with token %d accepted after token %d", w.Writer, w.Token, high))
		}
		high = max(high, w.Token)
	}
	// (d) No child outlives its leaderrun.
	for _, lf := range lives {
		exit, ok := tr.exits[lf.Identity]
		if ok && !exit.IsZero() && lf.End.After(exit.Add(outlivesSlack)) {
			v.outlived = append(v.outlived, fmt.Sprintf("(d) child %s ran %v after its leaderrun exited",
				lf.Writer, lf.End.Sub(exit).Round(time.Millisecond)))
		}
	}
	for _, pid := range tr.orphans {
		v.outlived = append(v.outlived, fmt.Sprintf("(d) child pid %d still alive after every leaderrun exited", pid))
	}
	if tr.fault.treeGone != nil {
		bound := tr.fault.treeGone(tr.timing)
		for _, lf := range lives {
			if lf.Identity == tr.leaderAtFault && lf.Start.Before(tr.faultStart) && lf.End.After(tr.faultStart.Add(bound)) {
				v.outlived = append(v.outlived, fmt.Sprintf("(d) %s of the leader's tree ran %v after the fault began, more than %v",
					lf.Writer, lf.End.Sub(tr.faultStart).Round(time.Millisecond), bound))
			}
		}
	}
	// (e) No failover where none is expected: count changes of leader
	// between the fault and the teardown.
	changes := 0
	for _, lf := range terms {
		if lf.Start.After(tr.faultStart) && lf.Start.Before(tr.end) && lf.Identity != tr.leaderAtFault {
			changes++
			if v.failover < 0 {
				v.failover = lf.Start.Sub(tr.faultStart)
			}
		}
	}
	if !tr.fault.failover && changes > 0 {
		v.falseFailover = true
	}
	return v
}

// term is one leader's tree as the ledger saw it: the lives of one
// identity with one token (the child, and any helper it started), from the
// first start to the last end. lastWriter is the writer that ended last.
type term struct {
	life
	writers    []string
	lastWriter string
}

// termsOf merges lives, sorted by start, into terms in the same order.
func termsOf(lives []life) []term {
	var terms []term
	index := map[string]int{}
	for _, lf := range lives {
		k := fmt.Sprintf("%s/%d", lf.Identity, lf.Token)
		i, ok := index[k]
		if !ok {
			index[k] = len(terms)
			terms = append(terms, term{life: lf, writers: []string{lf.Writer}, lastWriter: lf.Writer})
			continue
		}
		t := &terms[i]
		t.writers = append(t.writers, lf.Writer)
		if lf.End.After(t.End) {
			t.End, t.lastWriter = lf.End, lf.Writer
		}
	}
	return terms
}

// firstAcceptedOf is the first accepted write by any of writers.
func firstAcceptedOf(writes []write, writers []string) (time.Time, bool) {
	for _, w := range writes {
		if w.Accepted && slices.Contains(writers, w.Writer) {
			return w.At, true
		}
	}
	return time.Time{}, false
}

// row is one line of the report: a store and a scenario over its trials.
type row struct {
	store, scenario string
	trials          int
	leaderChanges   int
	a, b, c, d      int
	staleRejected   int
	failovers       []time.Duration
	falseFailovers  int
	expectFailover  bool
}

func (r *row) add(v verdict) {
	r.trials++
	r.leaderChanges += v.leaderChanges
	r.a += len(v.overlap)
	r.b += len(v.tokenOrder)
	r.c += len(v.acceptedLower)
	r.d += len(v.outlived)
	r.staleRejected += v.staleRejected
	if v.falseFailover {
		r.falseFailovers++
	}
	if r.expectFailover && v.failover >= 0 {
		r.failovers = append(r.failovers, v.failover)
	}
}

func (r *row) violations() int { return r.a + r.b + r.c + r.d + r.falseFailovers }

func percentile(ds []time.Duration, p float64) time.Duration {
	if len(ds) == 0 {
		return -1
	}
	s := append([]time.Duration(nil), ds...)
	sort.Slice(s, func(i, j int) bool { return s[i] < s[j] })
	i := int(p*float64(len(s))+0.999999) - 1
	return s[min(max(i, 0), len(s)-1)]
}

func fmtDur(d time.Duration) string {
	if d < 0 {
		return "–"
	}
	return fmt.Sprintf("%.2fs", d.Seconds())
}

// table renders the rows as markdown.
func table(rows []*row) string {
	var b strings.Builder
	b.WriteString("| store | scenario | trials | leader changes | (a) overlap | (b) token order | (c) lower token accepted | (d) child outlived | (e) false failovers | stale writes rejected | failover p50 | p99 | max |\n")
	b.WriteString("|---|---|---|---|---|---|---|---|---|---|---|---|---|\n")
	for _, r := range rows {
		fmt.Fprintf(&b, "| %s | %s | %d | %d | %d | %d | %d | %d | %d | %d | %s | %s | %s |\n",
			r.store, r.scenario, r.trials, r.leaderChanges, r.a, r.b, r.c, r.d, r.falseFailovers, r.staleRejected,
			fmtDur(percentile(r.failovers, .5)), fmtDur(percentile(r.failovers, .99)), fmtDur(percentile(r.failovers, 1)))
	}
	return b.String()
}
