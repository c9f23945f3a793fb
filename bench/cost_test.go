package bench

import (
	"fmt"
	"io"
	"log"
	"net"
	"net/http"
	"net/http/httputil"
	"net/url"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"time"

	"github.com/leaderrun/leaderrun/internal/testenv"
)

// request is one HTTP request that a counting proxy passed to Consul.
type request struct {
	start, end time.Duration // mono()
	key        string        // "METHOD /path" with ids replaced, and the query flags that matter
	class      string        // classBlocking, classKeepalive or classOther
	woke       bool          // a blocking query answered because the index moved (not at its wait's end)
}

// Request classes. An idle follower should send only keep-alives of its
// lease and blocking queries (etcd: watches); anything else is polling.
const (
	classBlocking  = "blocking/watch"
	classKeepalive = "keep-alive"
	classOther     = "other"
)

// classify names a Consul request by method and path, with key names and
// session ids replaced, and sorts it into a class.
func classify(method string, u *url.URL) (key, class string) {
	path := u.Path
	for _, pfx := range []string{"/v1/kv/", "/v1/session/renew/", "/v1/session/destroy/", "/v1/session/info/"} {
		if strings.HasPrefix(path, pfx) {
			if pfx == "/v1/kv/" {
				path = pfx + "KEY"
			} else {
				path = pfx + "ID"
			}
		}
	}
	q := u.Query()
	for _, flag := range []string{"acquire", "release"} {
		if q.Has(flag) {
			path += "?" + flag
		}
	}
	blocking := method == http.MethodGet && consulIndexOf(u) > 0
	if blocking {
		path += "?index"
	}
	key = method + " " + path
	switch {
	case blocking:
		class = classBlocking
	case method == http.MethodPut && strings.HasPrefix(u.Path, "/v1/session/renew/"):
		class = classKeepalive
	default:
		class = classOther
	}
	return key, class
}

// etcdClass sorts an etcd gRPC method into a class.
func etcdClass(method string) string {
	switch method {
	case "LeaseKeepAlive":
		return classKeepalive
	case "Watch":
		return classBlocking
	}
	return classOther
}

// countingProxy is an HTTP reverse proxy in front of the Consul agent for
// one process, which records every request it passes. It connects to the
// agent from a source address of its own: Consul limits each client
// address to 200 connections, and in production every host would talk to
// its own agent anyway.
type countingProxy struct {
	ln  net.Listener
	srv *http.Server

	mu   sync.Mutex
	reqs []request
}

func newCountingProxy(target string, source net.IP) (*countingProxy, error) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return nil, err
	}
	to := &url.URL{Scheme: "http", Host: target}
	dialer := &net.Dialer{LocalAddr: &net.TCPAddr{IP: source}}
	rp := &httputil.ReverseProxy{
		Rewrite:   func(pr *httputil.ProxyRequest) { pr.SetURL(to) },
		Transport: &http.Transport{DialContext: dialer.DialContext, MaxIdleConnsPerHost: 16},
		ErrorLog:  log.New(io.Discard, "", 0),
	}
	p := &countingProxy{ln: ln}
	p.srv = &http.Server{Handler: http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		rec := request{start: mono()}
		rec.key, rec.class = classify(r.Method, r.URL)
		index := consulIndexOf(r.URL)
		rp.ServeHTTP(w, r)
		rec.end = mono()
		if rec.class == classBlocking {
			got, _ := strconv.ParseUint(w.Header().Get("X-Consul-Index"), 10, 64)
			rec.woke = got != 0 && got != index
		}
		p.mu.Lock()
		p.reqs = append(p.reqs, rec)
		p.mu.Unlock()
	}), ErrorLog: log.New(io.Discard, "", 0)}
	go func() { _ = p.srv.Serve(ln) }()
	return p, nil
}

func (p *countingProxy) addr() string { return p.ln.Addr().String() }

// started lists the requests that began in [from, to).
func (p *countingProxy) started(from, to time.Duration) []request {
	p.mu.Lock()
	defer p.mu.Unlock()
	var out []request
	for _, r := range p.reqs {
		if r.start >= from && r.start < to {
			out = append(out, r)
		}
	}
	return out
}

// woken counts the blocking queries answered by a change in [from, to).
func (p *countingProxy) woken(from, to time.Duration) int {
	p.mu.Lock()
	defer p.mu.Unlock()
	n := 0
	for _, r := range p.reqs {
		if r.woke && r.end >= from && r.end < to {
			n++
		}
	}
	return n
}

func (p *countingProxy) close() { p.srv.Close() }

// sourceIP is the i-th loopback source address for proxies: 127.0.1.1,
// 127.0.1.2, ... (Linux routes all of 127/8 to the loopback device).
func sourceIP(i int) net.IP { return net.IPv4(127, 0, byte(1+i/250), byte(1+i%250)) }

// rates is requests per second by name.
type rates map[string]float64

func (r rates) byClass(store string) map[string]float64 {
	out := map[string]float64{}
	for k, v := range r {
		c := classOther
		if store == "etcd" {
			c = etcdClass(k)
		} else {
			_, c = classifyKey(k)
		}
		out[c] += v
	}
	return out
}

// classifyKey recovers the class from a key made by classify.
func classifyKey(key string) (string, string) {
	switch {
	case strings.HasSuffix(key, "?index"):
		return key, classBlocking
	case strings.HasPrefix(key, "PUT /v1/session/renew/"):
		return key, classKeepalive
	}
	return key, classOther
}

func countRates(reqs []request, over time.Duration) rates {
	r := rates{}
	for _, q := range reqs {
		r[q.key] += 1 / over.Seconds()
	}
	return r
}

// costRes is what one tool's leader and one idle follower send the store,
// per second, and what one whole run on a free lock sends (counts).
type costRes struct {
	leader, follower rates
	window           time.Duration
	oneRun           rates
	followerBlocking []time.Duration // Consul: how long the follower's blocking queries lasted
}

func (c *costRes) shortBlocking() int {
	n := 0
	for _, d := range c.followerBlocking {
		if d < time.Second {
			n++
		}
	}
	return n
}

// ended lists the requests that ended in [from, to).
func (p *countingProxy) ended(from, to time.Duration) []request {
	p.mu.Lock()
	defer p.mu.Unlock()
	var out []request
	for _, r := range p.reqs {
		if r.end >= from && r.end < to {
			out = append(out, r)
		}
	}
	return out
}

// measureCost: requests per second that one leader, and one idle
// follower, send to the store. etcd: from etcd's own gRPC counters, with
// only the measured processes connected: each etcd tool gets a server of
// its own, the leader is measured alone, then with its follower, and the
// difference is the follower's. Consul: at a counting proxy in front of
// the agent for each process.
func (b *bench) measureCost() {
	etcd2 := testenv.StartEtcd(b.t, 1)
	etcdURL := map[string]string{lrEtcd.id: b.etcdURL, etcdctlLock.id: etcd2.Endpoints()[0]}
	proxies := map[string]*countingProxy{}
	defer func() {
		b.killAll()
		for _, p := range proxies {
			p.close()
		}
	}()
	newProxy := func(name string) string {
		p, err := newCountingProxy(b.consulAddr, sourceIP(len(proxies)))
		if err != nil {
			b.t.Fatal(err)
		}
		proxies[name] = p
		return p.addr()
	}
	// What one start-to-child run (acquire, child exits, release) asks
	// of the store, counted the same way.
	oneRun := map[string]rates{}
	for _, tl := range wrappers {
		addr := etcdURL[tl.id]
		var before map[string]float64
		if tl.store == "etcd" {
			before, _, _ = etcdMetrics(addr)
		} else {
			addr = newProxy(tl.id + "/once")
		}
		tag := "cost-once-" + tl.id
		p, err := b.start(tl, tag, tag, addr, false)
		if err != nil {
			b.t.Fatal(err)
		}
		if _, ok := b.hub.started(tag, 15*time.Second); !ok || !p.waitExit(15*time.Second) {
			b.t.Fatalf("%s: one run did not complete:\n%s", tl.name, p.tail())
		}
		counts := rates{}
		if tl.store == "etcd" {
			after, _, _ := etcdMetrics(addr)
			for k, v := range delta(before, after) {
				counts[k] = v
			}
		} else {
			for _, r := range proxies[tl.id+"/once"].started(0, mono()) {
				counts[r.key]++
			}
		}
		oneRun[tl.id] = counts
	}
	// Consul: leader and follower of each tool, each behind its proxy.
	for _, tl := range []*tool{lrConsul, consulLock} {
		lock := "cost-" + tl.id
		leader, err := b.start(tl, lock, lock+"-a", newProxy(tl.id+"/leader"), true)
		if err != nil {
			b.t.Fatal(err)
		}
		if _, ok := b.hub.started(leader.tag, 15*time.Second); !ok {
			b.t.Fatalf("%s: no child within 15 s:\n%s", tl.name, leader.tail())
		}
		if _, err := b.start(tl, lock, lock+"-b", newProxy(tl.id+"/follower"), true); err != nil {
			b.t.Fatal(err)
		}
		if err := b.waitCandidates(tl, lock, 2, 15*time.Second); err != nil {
			b.t.Fatal(err)
		}
	}
	// etcd: leaders first.
	for _, tl := range []*tool{lrEtcd, etcdctlLock} {
		lock := "cost-" + tl.id
		p, err := b.start(tl, lock, lock+"-a", etcdURL[tl.id], true)
		if err != nil {
			b.t.Fatal(err)
		}
		if _, ok := b.hub.started(p.tag, 15*time.Second); !ok {
			b.t.Fatalf("%s: no child within 15 s:\n%s", tl.name, p.tail())
		}
	}
	time.Sleep(2 * time.Second) // past start-up requests
	snap := func() map[string]map[string]float64 {
		out := map[string]map[string]float64{}
		for id, u := range etcdURL {
			recv, _, err := etcdMetrics(u)
			if err != nil {
				b.t.Fatal(err)
			}
			out[id] = recv
		}
		return out
	}
	m1a, w1a := snap(), mono()
	time.Sleep(b.window)
	m1b, w1b := snap(), mono()
	for _, tl := range []*tool{lrEtcd, etcdctlLock} {
		lock := "cost-" + tl.id
		if _, err := b.start(tl, lock, lock+"-b", etcdURL[tl.id], true); err != nil {
			b.t.Fatal(err)
		}
		if err := b.waitCandidatesAt(tl, lock, 2, 15*time.Second, etcdURL[tl.id]); err != nil {
			b.t.Fatal(err)
		}
	}
	time.Sleep(2 * time.Second)
	m2a, w2a := snap(), mono()
	time.Sleep(b.window)
	m2b, w2b := snap(), mono()

	for _, tl := range []*tool{lrEtcd, etcdctlLock} {
		lead := rates{}
		for k, v := range delta(m1a[tl.id], m1b[tl.id]) {
			lead[k] = v / (w1b - w1a).Seconds()
		}
		both := rates{}
		for k, v := range delta(m2a[tl.id], m2b[tl.id]) {
			both[k] = v / (w2b - w2a).Seconds()
		}
		follow := rates{}
		for k, v := range both {
			if d := v - lead[k]; d > 0.005 {
				follow[k] = d
			}
		}
		b.res.cost[tl.id] = &costRes{leader: lead, follower: follow, window: w1b - w1a, oneRun: oneRun[tl.id]}
	}
	// Consul: both windows count.
	for _, tl := range []*tool{lrConsul, consulLock} {
		over := (w1b - w1a) + (w2b - w2a)
		count := func(name string) rates {
			p := proxies[tl.id+"/"+name]
			return countRates(append(p.started(w1a, w1b), p.started(w2a, w2b)...), over)
		}
		c := &costRes{leader: count("leader"), follower: count("follower"), window: over, oneRun: oneRun[tl.id]}
		f := proxies[tl.id+"/follower"]
		for _, q := range append(f.ended(w1a, w1b), f.ended(w2a, w2b)...) {
			if q.class == classBlocking {
				c.followerBlocking = append(c.followerBlocking, q.end-q.start)
			}
		}
		b.res.cost[tl.id] = c
	}
}

// herdChange is one change of leader among the herd.
type herdChange struct {
	handover time.Duration
	woken    int   // followers woken by the change (see herdRes)
	wakes    int   // Consul: blocking queries answered by the change, in all; etcd: watch responses sent
	requests rates // counts (not rates) of non-keep-alive requests in the window
	window   time.Duration
}

// herdRes is the many-followers test of one store.
type herdRes struct {
	followers int
	idle      rates // requests per second from all followers together, idle
	idleFor   time.Duration
	changes   []herdChange
	handover  sample
}

// measureHerd runs leaderrun with b.herdN followers on one lock, on each
// store, and moves leadership several times with SIGTERM.
func (b *bench) measureHerd() {
	for _, tl := range []*tool{lrEtcd, lrConsul} {
		at := time.Now()
		b.res.herd[tl.store] = b.herd(tl)
		b.killAll()
		b.t.Logf("herd on %s took %v", tl.store, time.Since(at).Round(100*time.Millisecond))
	}
}

const herdChanges = 5

func (b *bench) herd(tl *tool) *herdRes {
	res := &herdRes{followers: b.herdN}
	lock := "herd-" + tl.id
	var proxies []*countingProxy
	defer func() {
		for _, p := range proxies {
			p.close()
		}
	}()
	addr := func() string {
		if tl.store == "etcd" {
			return b.etcdURL
		}
		p, err := newCountingProxy(b.consulAddr, sourceIP(len(proxies)))
		if err != nil {
			b.t.Fatal(err)
		}
		proxies = append(proxies, p)
		return p.addr()
	}
	procs := map[string]*proc{}
	proxyOf := map[string]*countingProxy{}
	spawn := func(i int) {
		tag := fmt.Sprintf("%s-herd-%03d", tl.id, i)
		a := addr()
		p, err := b.start(tl, lock, tag, a, true)
		if err != nil {
			b.t.Fatal(err)
		}
		procs[tag] = p
		if len(proxies) > 0 {
			proxyOf[tag] = proxies[len(proxies)-1]
		}
	}
	spawn(0)
	leader := procs[fmt.Sprintf("%s-herd-%03d", tl.id, 0)]
	if _, ok := b.hub.started(leader.tag, 15*time.Second); !ok {
		b.t.Errorf("%s herd: no leader within 15 s:\n%s", tl.name, leader.tail())
		return res
	}
	const batch = 25
	for n := 1; n <= b.herdN; n += batch {
		for i := n; i < min(n+batch, b.herdN+1); i++ {
			spawn(i)
		}
		if err := b.waitCandidates(tl, lock, min(n+batch, b.herdN+1), 90*time.Second); err != nil {
			b.t.Errorf("%s herd: %v", tl.name, err)
			return res
		}
	}
	time.Sleep(2 * time.Second)

	// Idle: what do the followers send while nothing changes?
	idleFor := 10 * time.Second
	if tl.store == "etcd" {
		before, _, _ := etcdMetrics(b.etcdURL)
		time.Sleep(idleFor)
		after, _, _ := etcdMetrics(b.etcdURL)
		res.idle = rates{}
		for k, v := range delta(before, after) {
			res.idle[k] = v / idleFor.Seconds()
		}
	} else {
		from := mono()
		time.Sleep(idleFor)
		to := mono()
		var reqs []request
		for tag, p := range proxyOf {
			if tag != leader.tag {
				reqs = append(reqs, p.started(from, to)...)
			}
		}
		res.idle = countRates(reqs, to-from)
	}
	res.idleFor = idleFor

	for range herdChanges {
		var before, sentBefore map[string]float64
		if tl.store == "etcd" {
			before, sentBefore, _ = etcdMetrics(b.etcdURL)
		}
		t0 := mono()
		leader.signal(syscall.SIGTERM)
		var next string
		ok := b.hub.wait(20*time.Second, func() bool {
			for tag := range procs {
				if k := b.hub.kids[tag]; k != nil && k.start > t0 {
					next = tag
					return true
				}
			}
			return false
		})
		if !ok {
			res.handover.never++
			b.t.Errorf("%s herd: no new leader within 20 s of SIGTERM", tl.name)
			break
		}
		k, _ := b.hub.get(next)
		ch := herdChange{handover: k.start - t0, requests: rates{}}
		res.handover.add(ch.handover)
		// Followers that wake for the change do so at once; give
		// stragglers on a loaded machine 2 s.
		time.Sleep(2 * time.Second)
		t1 := mono()
		ch.window = t1 - t0
		if tl.store == "etcd" {
			after, sentAfter, _ := etcdMetrics(b.etcdURL)
			for m, v := range delta(before, after) {
				if etcdClass(m) != classKeepalive {
					ch.requests[m] = v
				}
			}
			ch.wakes = int(sentAfter["Watch"] - sentBefore["Watch"])
			// Each follower that wakes re-reads the queue once (a
			// Range); the new leader reads its own key once more.
			ch.woken = max(int(ch.requests["Range"])-1, 0)
		} else {
			for tag, p := range proxyOf {
				if tag == leader.tag {
					continue
				}
				if w := p.woken(t0, t1); w > 0 {
					ch.woken++
					ch.wakes += w
				}
				for _, r := range p.started(t0, t1) {
					if r.class != classKeepalive {
						ch.requests[r.key]++
					}
				}
			}
		}
		res.changes = append(res.changes, ch)
		if !leader.waitExit(10 * time.Second) {
			b.t.Errorf("%s herd: old leader still running 10 s after SIGTERM", tl.name)
		}
		delete(procs, leader.tag)
		leader = procs[next]
	}
	return res
}
