package bench

import (
	"fmt"
	"math"
	"net/url"
	"slices"
	"testing"
	"time"
)

// sample is one tool's measurements of one quantity: the values measured,
// and the runs in which the awaited event did not come within the bound.
type sample struct {
	vals  []time.Duration
	never int
}

func (s *sample) add(d time.Duration) { s.vals = append(s.vals, d) }
func (s *sample) runs() int           { return len(s.vals) + s.never }

// percentile is the nearest-rank p-quantile (0 < p ≤ 1) of ds: the
// smallest value with at least p of the sample at or below it. With 30
// values p90 is the 27th smallest and p99 the largest. -1 if ds is empty.
func percentile(ds []time.Duration, p float64) time.Duration {
	if len(ds) == 0 {
		return -1
	}
	s := slices.Sorted(slices.Values(ds))
	k := int(math.Ceil(p*float64(len(s)))) - 1
	return s[min(max(k, 0), len(s)-1)]
}

// fmtDur prints a duration at a precision that suits its size.
func fmtDur(d time.Duration) string {
	switch {
	case d < 0:
		return "–"
	case d < 10*time.Millisecond:
		return fmt.Sprintf("%.2f ms", float64(d)/1e6)
	case d < time.Second:
		return fmt.Sprintf("%.1f ms", float64(d)/1e6)
	default:
		return fmt.Sprintf("%.2f s", d.Seconds())
	}
}

// pair prints "p50 X / pN Y", and the runs that never got there.
func (s *sample) pair(p float64) string {
	if s == nil || s.runs() == 0 {
		return "not measured"
	}
	if len(s.vals) == 0 {
		return fmt.Sprintf("never (%d of %d runs)", s.never, s.runs())
	}
	out := fmt.Sprintf("%s / %s", fmtDur(percentile(s.vals, .5)), fmtDur(percentile(s.vals, p)))
	if s.never > 0 {
		out += fmt.Sprintf("; never in %d of %d runs", s.never, s.runs())
	}
	return out
}

// ratio is a/b as "0.83×".
func ratio(a, b time.Duration) string {
	if a < 0 || b <= 0 {
		return "–"
	}
	return fmt.Sprintf("%.2f×", float64(a)/float64(b))
}

func mib(kib int) string { return fmt.Sprintf("%.1f MiB", float64(kib)/1024) }

// TestStats checks the helpers that every figure of the benchmark goes
// through. It runs always, unlike TestBench.
func TestStats(t *testing.T) {
	ms := func(vs ...int) []time.Duration {
		out := make([]time.Duration, len(vs))
		for i, v := range vs {
			out[i] = time.Duration(v) * time.Millisecond
		}
		return out
	}
	thirty := make([]int, 30)
	for i := range thirty {
		thirty[i] = 30 - i // unsorted on purpose
	}
	cases := []struct {
		name string
		vals []time.Duration
		p    float64
		want time.Duration
	}{
		{"empty", nil, .5, -1},
		{"one value", ms(7), .99, 7 * time.Millisecond},
		{"median of odd", ms(5, 1, 3), .5, 3 * time.Millisecond},
		{"median of even is the lower middle", ms(4, 1, 3, 2), .5, 2 * time.Millisecond},
		{"p90 of 30 is the 27th", ms(thirty...), .9, 27 * time.Millisecond},
		{"p99 of 30 is the largest", ms(thirty...), .99, 30 * time.Millisecond},
		{"p99 of 10 is the largest", ms(1, 2, 3, 4, 5, 6, 7, 8, 9, 10), .99, 10 * time.Millisecond},
		{"p100", ms(2, 9, 4), 1, 9 * time.Millisecond},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			in := slices.Clone(c.vals)
			if got := percentile(c.vals, c.p); got != c.want {
				t.Errorf("percentile(%v, %v) = %v, want %v", c.vals, c.p, got, c.want)
			}
			if !slices.Equal(in, c.vals) {
				t.Errorf("percentile reordered its input")
			}
		})
	}

	pairs := []struct {
		name string
		s    *sample
		want string
	}{
		{"not measured", &sample{}, "not measured"},
		{"all never", &sample{never: 3}, "never (3 of 3 runs)"},
		{"values", &sample{vals: ms(10, 30, 20)}, "20.0 ms / 30.0 ms"},
		{"some never", &sample{vals: ms(1500), never: 1}, "1.50 s / 1.50 s; never in 1 of 2 runs"},
	}
	for _, c := range pairs {
		t.Run(c.name, func(t *testing.T) {
			if got := c.s.pair(.9); got != c.want {
				t.Errorf("pair = %q, want %q", got, c.want)
			}
		})
	}

	durs := []struct {
		d    time.Duration
		want string
	}{{-1, "–"}, {1234 * time.Microsecond, "1.23 ms"}, {45600 * time.Microsecond, "45.6 ms"}, {5250 * time.Millisecond, "5.25 s"}}
	for _, c := range durs {
		if got := fmtDur(c.d); got != c.want {
			t.Errorf("fmtDur(%v) = %q, want %q", c.d, got, c.want)
		}
	}
	if got := ratio(30*time.Millisecond, 40*time.Millisecond); got != "0.75×" {
		t.Errorf("ratio = %q, want 0.75×", got)
	}
}

// TestClassify checks how Consul requests are named and sorted into
// classes, which decides whether an idle follower counts as polling.
func TestClassify(t *testing.T) {
	cases := []struct {
		name, method, url, key, class string
	}{
		{"blocking query", "GET", "/v1/kv/leaderrun/x?index=42&wait=7s", "GET /v1/kv/KEY?index", classBlocking},
		{"plain read", "GET", "/v1/kv/leaderrun/x?consistent=", "GET /v1/kv/KEY", classOther},
		{"index 0 does not block", "GET", "/v1/kv/x?index=0", "GET /v1/kv/KEY", classOther},
		{"acquire", "PUT", "/v1/kv/x/.lock?acquire=abc", "PUT /v1/kv/KEY?acquire", classOther},
		{"renew", "PUT", "/v1/session/renew/abc-123", "PUT /v1/session/renew/ID", classKeepalive},
		{"destroy", "PUT", "/v1/session/destroy/abc", "PUT /v1/session/destroy/ID", classOther},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			u, err := url.Parse(c.url)
			if err != nil {
				t.Fatal(err)
			}
			key, class := classify(c.method, u)
			if key != c.key || class != c.class {
				t.Errorf("classify(%s %s) = %q, %q; want %q, %q", c.method, c.url, key, class, c.key, c.class)
			}
			if _, back := classifyKey(key); back != class {
				t.Errorf("classifyKey(%q) = %q, want %q", key, back, class)
			}
		})
	}
	if got := etcdRequests(map[string]float64{"Range": 3, "LeaseKeepAlive": 10}, map[string]float64{"LeaseKeepAlive": 5, "Watch": 9}); got["Range"] != 3 || got["LeaseKeepAlive"] != 5 || got["Watch"] != 0 {
		t.Errorf("etcdRequests = %v", got)
	}
	lo, hi := panelRange([]plotRow{{s: &sample{vals: []time.Duration{3 * time.Millisecond, 40 * time.Millisecond}}}})
	if lo != 2*time.Millisecond || hi != 50*time.Millisecond {
		t.Errorf("panelRange = %v, %v; want 2ms, 50ms", lo, hi)
	}
}
