package bench

import (
	"encoding/binary"
	"fmt"
	"math"
	"net/url"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/leaderrun/leaderrun/internal/testenv"
)

// sample is one tool's measurements of one quantity: the values measured,
// and the runs in which the awaited event did not come within the bound.
type sample struct {
	vals  []time.Duration
	never int
}

func (s *sample) add(d time.Duration) { s.vals = append(s.vals, d) }

// runs is how many runs s counts; none for a phase that was not run.
func (s *sample) runs() int {
	if s == nil {
		return 0
	}
	return len(s.vals) + s.never
}

// percentile is the nearest-rank p-quantile (0 < p ≤ 1) of ds: the
// smallest value with at least p of the sample at or below it. With 30
// values p90 is the 27th smallest and p99 the largest. -1 if ds is empty.
func percentile(ds []time.Duration, p float64) time.Duration {
	if len(ds) == 0 {
		return -1
	}
	s := slices.Sorted(slices.Values(ds))
	return s[min(max(nearestRank(p, len(s))-1, 0), len(s)-1)]
}

// nearestRank is the 1-based rank of the nearest-rank p-quantile among n
// values.
func nearestRank(p float64, n int) int { return int(math.Ceil(p * float64(n))) }

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

// mib is kib in MiB, or in KiB below a tenth of a MiB (the built-in
// watchdog's few pages would read 0.0 MiB).
func mib(kib int) string {
	if kib > 0 && kib < 103 {
		return fmt.Sprintf("%d KiB", kib)
	}
	return fmt.Sprintf("%.1f MiB", float64(kib)/1024)
}

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

// TestClassify checks how each store's requests are named and sorted
// into classes, which decides whether an idle follower counts as
// polling.
func TestClassify(t *testing.T) {
	consul := []struct {
		name, method, url, key, class string
	}{
		{"blocking query", "GET", "/v1/kv/leaderrun/x?index=42&wait=7s", "GET /v1/kv/KEY?index", classBlocking},
		{"plain read", "GET", "/v1/kv/leaderrun/x?consistent=", "GET /v1/kv/KEY", classOther},
		{"index 0 does not block", "GET", "/v1/kv/x?index=0", "GET /v1/kv/KEY", classOther},
		{"acquire", "PUT", "/v1/kv/x/.lock?acquire=abc", "PUT /v1/kv/KEY?acquire", classOther},
		{"queue listing", "GET", "/v1/kv/leaderrun/x:queue/?recurse=", "GET /v1/kv/KEY?recurse", classOther},
		{"queue blocking", "GET", "/v1/kv/leaderrun/x:queue/abc?index=7", "GET /v1/kv/KEY?index", classBlocking},
		{"renew", "PUT", "/v1/session/renew/abc-123", "PUT /v1/session/renew/ID", classKeepalive},
		{"check pass", "PUT", "/v1/agent/check/pass/leaderrun:0123abcd", "PUT /v1/agent/check/pass/ID", classKeepalive},
		{"destroy", "PUT", "/v1/session/destroy/abc", "PUT /v1/session/destroy/ID", classOther},
	}
	for _, c := range consul {
		t.Run("consul "+c.name, func(t *testing.T) {
			u, err := url.Parse(c.url)
			if err != nil {
				t.Fatal(err)
			}
			if got := classify(c.method, u); got != (reqKey{c.key, c.class}) {
				t.Errorf("classify(%s %s) = %+v; want %q, %q", c.method, c.url, got, c.key, c.class)
			}
		})
	}
	postgres := []struct {
		name, line, role, key, class string
	}{
		{"renew", `2026-12-01 10:00:00.123 UTC [4242] cost-lrp-a@postgres LOG:  execute <unnamed>: WITH r AS (`, "cost-lrp-a", "renew", classKeepalive},
		{"acquire", `2026-12-01 10:00:00.123 UTC [4242] herd-lrp-007@postgres LOG:  execute <unnamed>: WITH cur AS (`, "herd-lrp-007", "acquire", classOther},
		{"listen", `2026-12-01 10:00:00.123 UTC [99] x@postgres LOG:  statement: LISTEN "leaderrun_leases"`, "x", "LISTEN", classBlocking},
		{"ping", `2026-12-01 10:00:00.123 UTC [99] x@postgres LOG:  statement: -- ping`, "x", "ping", classBlocking},
		{"parameters are not statements", `2026-12-01 10:00:00.123 UTC [99] x@postgres DETAIL:  parameters: $1 = 'a'`, "", "", ""},
	}
	for _, c := range postgres {
		t.Run("postgres "+c.name, func(t *testing.T) {
			m := postgresLine.FindStringSubmatch(c.line)
			if c.role == "" {
				if m != nil {
					t.Errorf("%q read as a statement of %q", c.line, m[1])
				}
				return
			}
			if m == nil || m[1] != c.role {
				t.Fatalf("%q: matched %q, want the role %q", c.line, m, c.role)
			}
			if got := postgresStatement(m[2]); got != (reqKey{c.key, c.class}) {
				t.Errorf("postgresStatement(%q) = %+v, want %q, %q", m[2], got, c.key, c.class)
			}
		})
	}
	for _, c := range []struct {
		verb      string
		code      int
		key, kind string
	}{{"watch", 200, "watch", classBlocking}, {"update", 200, "update", classKeepalive}, {"update", 409, "update (409 Conflict)", classKeepalive}, {"get", 200, "get", classOther}} {
		if got := kubeKey(testenv.KubeRequest{Verb: c.verb, Code: c.code}); got != (reqKey{c.key, c.kind}) {
			t.Errorf("kubeKey(%s %d) = %+v, want %q, %q", c.verb, c.code, got, c.key, c.kind)
		}
	}
	if got := etcdRequests(map[string]float64{"Range": 3, "LeaseKeepAlive": 10}, map[string]float64{"LeaseKeepAlive": 5, "Watch": 9}); got["Range"] != 3 || got["LeaseKeepAlive"] != 5 || got["Watch"] != 0 {
		t.Errorf("etcdRequests = %v", got)
	}
	lo, hi := panelRange([]plotRow{{s: &sample{vals: []time.Duration{3 * time.Millisecond, 40 * time.Millisecond}}}})
	if lo != 2*time.Millisecond || hi != 50*time.Millisecond {
		t.Errorf("panelRange = %v, %v; want 2ms, 50ms", lo, hi)
	}
}

// TestZKInspector feeds the proxy's reader ZooKeeper's framing split at
// every byte: the connect frames are skipped, requests are named by
// operation (a read that sets a watch as such), and only xid −1 from the
// server is a watch event.
func TestZKInspector(t *testing.T) {
	i32 := func(v int32) []byte { return binary.BigEndian.AppendUint32(nil, uint32(v)) }
	i64 := func(v int64) []byte { return binary.BigEndian.AppendUint64(nil, uint64(v)) }
	str := func(s string) []byte { return append(i32(int32(len(s))), s...) }
	full := func(parts ...[]byte) []byte { // the length, then the frame
		body := slices.Concat(parts...)
		return append(i32(int32(len(body))), body...)
	}
	up := slices.Concat(
		full(i32(0), i64(0), i32(6000), i64(0), str("0123456789abcdef")),           // connect request
		full(i32(1), i32(3), str("/leaderrun/x/_c_a-latch-0000000001"), []byte{1}), // exists, watch
		full(i32(2), i32(4), str("/leaderrun/x/_c_a-latch-0000000001"), []byte{0}), // getData
		full(i32(-2), i32(11)),                    // ping
		full(i32(3), i32(9), str("/leaderrun/x")), // sync
	)
	down := slices.Concat(
		full(i32(0), i32(6000), i64(42), str("0123456789abcdef")),                                 // connect response
		full(i32(1), i64(7), i32(0), []byte{1}),                                                   // exists answered
		full(i32(-1), i64(-1), i32(0), i32(2), i32(3), str("/leaderrun/x/_c_a-latch-0000000001")), // watch event
		full(i32(-2), i64(7), i32(0)),                                                             // ping answered
	)
	p := &tcpProxy{}
	ins := newZKInspector()
	for i := range up {
		ins.client(up[i:i+1], time.Duration(i), p)
	}
	for i := range down {
		ins.server(down[i:i+1], time.Duration(i), p)
	}
	var got []reqKey
	for _, r := range p.reqs {
		got = append(got, r.key)
	}
	want := []reqKey{{"exists (watch)", classBlocking}, {"getData", classOther}, {"ping", classKeepalive}, {"sync", classOther}}
	if !slices.Equal(got, want) {
		t.Errorf("requests %+v, want %+v", got, want)
	}
	if len(p.events) != 1 {
		t.Errorf("%d watch events, want 1", len(p.events))
	}
}

// TestInitTrace: each process's lines of GODEBUG=inittrace=1 apart (a
// process started by another prints after it), summed.
func TestInitTrace(t *testing.T) {
	out := `init internal/bytealg @0.005 ms, 0 ms clock, 0 bytes, 0 allocs
init runtime @0.10 ms, 0.20 ms clock, 100 bytes, 1 allocs
some log line
init example.com/a @3.0 ms, 0.50 ms clock, 2000 bytes, 10 allocs
init internal/bytealg @0.006 ms, 0 ms clock, 0 bytes, 0 allocs
init example.com/b @1.0 ms, 0.25 ms clock, 300 bytes, 3 allocs
`
	first, second := parseInitTrace(out, 0), parseInitTrace(out, 1)
	if first.count != 3 || first.total != 700*time.Microsecond || first.bytes != 2100 || first.pkgBytes["example.com/a"] != 2000 {
		t.Errorf("first process: %+v", first)
	}
	if second.count != 2 || second.total != 250*time.Microsecond || second.bytes != 300 || second.pkgs["example.com/a"] != 0 {
		t.Errorf("second process: %+v", second)
	}
	if third := parseInitTrace(out, 2); third.count != 0 {
		t.Errorf("a third process: %+v", third)
	}
}

// TestGoals renders the report of a run in which every store met its
// goals but Consul's herd, and checks the verdicts and that every store
// is a column of the table.
func TestGoals(t *testing.T) {
	r := newResults(3)
	ms := func(v ...int) *sample {
		s := &sample{}
		for _, x := range v {
			s.add(time.Duration(x) * time.Millisecond)
		}
		return s
	}
	for _, tl := range append([]*tool{direct}, wrappers...) {
		r.s2c[tl.id], r.exit[tl.id] = ms(10, 11, 12), ms(15, 16, 17)
		r.rss[tl.id] = rssRec{wrapper: 10 * 1024, helpers: 1024, wrapperSmaps: smaps{rss: 10 * 1024, anon: 1024}}
		r.loss[tl.id], r.handover[tl.id] = ms(2, 3, 4), ms(12, 13, 14)
		r.crash[tl.id] = ms(4000, 4100, 4200)
		r.crashOld[tl.id] = crashOld{trials: 3, died: []time.Duration{time.Millisecond, time.Millisecond, time.Millisecond}}
		r.cost[tl.id] = &costRes{leader: rates{{"ping", classKeepalive}: 2}, first: rates{{"ping", classKeepalive}: 0.5},
			second: rates{}, perProcess: true, followersOver: 30 * time.Second}
	}
	r.s2c[etcdctlLock.id], r.exit[etcdctlLock.id], r.s2c[consulLock.id] = ms(20, 21, 22), ms(20, 21, 22), ms(100, 110, 120)
	// Followers without a session of their own: a PostgreSQL follower
	// tries once per lease, a Kubernetes one only watches.
	r.cost[lrPostgres.id].first = rates{{"acquire", classOther}: 0.2}
	r.cost[lrKube.id].first = rates{{"watch", classBlocking}: 0.03}
	// A MySQL first in line within PostgreSQL's budget.
	r.cost[lrMySQL.id].first = rates{{"read the row", classOther}: 0.2, {"wait on the holder's named lock (GET_LOCK)", classBlocking}: 0.2}
	for _, col := range storeColumns {
		if col.latency {
			r.herd[col.name] = &herdRes{followers: 200, changes: []herdChange{{woken: 1}, {woken: 1}, {woken: 1}}, handover: *ms(10, 20, 30)}
		}
	}
	r.herd["consul"].changes = []herdChange{{woken: 3}, {woken: 3}, {woken: 1}}
	// Memory: one more instance 3 MiB alone, 4 MiB with its 1 MiB
	// watchdog, against etcdctl lock's 4 MiB; local's watchdog over its
	// goal.
	for _, col := range storeColumns {
		wd := 1024
		if col.name == "local" {
			wd = 2048
		}
		r.pss[col.lr.id] = pssRec{1: {wrapperPss: 20000, watchdogPss: 1500, watchdogs: 1},
			5:  {wrapperPss: 20000 + 4*3072, watchdogPss: 1500 + 4*wd, watchdogs: 5},
			20: {wrapperPss: 20000 + 19*3072, watchdogPss: 1500 + 19*wd, watchdogs: 20}}
	}
	r.pss[etcdctlLock.id] = pssRec{1: {wrapperPss: 10000}, 20: {wrapperPss: 10000 + 19*4096}}
	if m, ok := r.pss[lrEtcd.id].marginal(memSum.pss); !ok || m != 4096 {
		t.Errorf("marginal Pss %d KiB (%v), want 4096", m, ok)
	}
	// A pool: consul lock -n runs over its size after SIGKILL, and so
	// does leaderrun in one trial.
	r.pool[consulPool.id] = &poolRes{trials: map[string][]poolTrial{
		"SIGKILL": {{takeover: 20 * time.Second, oldAlive: true, oldGone: -1, most: 4}},
		"SIGTERM": {{takeover: 10 * time.Millisecond, oldSig: true, oldGone: 5 * time.Millisecond, most: 3}}}}
	lp := lrPool(lrConsul)
	r.pool[lp.id] = &poolRes{trials: map[string][]poolTrial{
		"SIGKILL": {{takeover: 5 * time.Second, oldSig: true, oldGone: time.Millisecond, most: 3}, {takeover: 5 * time.Second, oldAlive: true, oldGone: -1, most: 4}},
		"SIGTERM": {{takeover: 10 * time.Millisecond, oldSig: true, oldGone: 5 * time.Millisecond, most: 3}}}}
	var missed []string
	for _, g := range r.goals() {
		if !g.met {
			missed = append(missed, g.store+" "+g.kind)
		}
	}
	if want := []string{"Consul followers woken", "local watchdog memory", "Consul pool of holders"}; !slices.Equal(missed, want) {
		t.Errorf("missed %v, want %v", missed, want)
	}
	tbl := r.table()
	for _, tl := range wrappers {
		if !strings.Contains(strings.SplitN(tbl, "\n", 2)[0], " "+tl.name+" |") {
			t.Errorf("%s is not a column of the table", tl.name)
		}
	}
	md := r.markdown()
	for _, want := range []string{"## Goals", "## Analysis", "**Consul.**", "**ZooKeeper.**", "client-go", "Memory as a host pays it",
		"| leaderrun (etcd) | 21.0 MiB / 37.0 MiB / 97.0 MiB |", "A pool of 3 holders", "ran beside the waiter's in 1 of 1", "| 4 |"} {
		if !strings.Contains(md, want) {
			t.Errorf("the report lacks %q", want)
		}
	}
	if svg := r.plot(); !strings.Contains(svg, "client-go elector") || !strings.Contains(svg, "leaderrun (ZooKeeper)") {
		t.Error("the plot lacks a tool")
	}
}

// TestSourceIPs: every proxy connects from an address of its own.
func TestSourceIPs(t *testing.T) {
	seen := map[string]bool{}
	for range 600 {
		ip := nextSourceIP()
		if seen[ip.String()] || !ip.IsLoopback() || ip.To4()[3] == 0 {
			t.Fatalf("source address %v: repeated, not loopback or a network address", ip)
		}
		seen[ip.String()] = true
	}
}

// TestEveryStoreExplained: the analysis explains each latency column's
// figures (loss, crash failover, herd, idle cost) and how its herd was
// counted; a store added without them printed "Loss:  Crash failover: ".
func TestEveryStoreExplained(t *testing.T) {
	texts := map[string]map[string]string{"lossWhy": lossWhy, "crashWhy": crashWhy, "herdWhy": herdWhy, "idleWhy": idleWhy, "herdHow": herdHow}
	for _, col := range storeColumns {
		if !col.latency {
			continue
		}
		for name, m := range texts {
			if m[col.name] == "" {
				t.Errorf("%s has no %s entry", col.name, name)
			}
		}
	}
}
