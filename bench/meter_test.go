package bench

import (
	"context"
	"encoding/binary"
	"fmt"
	"io"
	"log"
	"net"
	"net/http"
	"net/http/httputil"
	"net/url"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/leaderrun/leaderrun/internal/testenv"
)

// meter counts what processes send a store. Each process it counts gets
// its address from addr; where the store lets the benchmark tell them
// apart (perProcess: a counting proxy of its own, a role of its own, a
// source address of its own), requests and woken count only the
// processes named, otherwise the whole server (etcd: a server of its own
// for the tool).
type meter interface {
	addr(tl *tool, tag string) string
	perProcess() bool
	// mark notes the present, for requests and woken.
	mark() mark
	// requests counts the requests of the processes tagged tags that
	// began between two marks, by name and class.
	requests(tags []string, a, b mark) rates
	// woken counts the processes among tags that a change woke between
	// two marks (they were answered a blocking query, sent a watch
	// event, or acted on one), and the wake-ups in all.
	woken(tags []string, a, b mark) (n, wakes int)
	// how says how the meter counts, for the report.
	how() string
	close()
}

// mark is a moment as each meter needs it.
type mark struct {
	at             time.Duration // mono()
	wall           time.Time
	off            int                // PostgreSQL: the server log's length
	etcd, etcdSent map[string]float64 // etcd: its counters
	watchEvents    float64            // Kubernetes: watch events the apiserver sent on leases
}

// Request classes. An idle follower should send only keep-alives of its
// session and blocking queries or watches; anything else is polling.
const (
	classBlocking  = "blocking/watch"
	classKeepalive = "keep-alive"
	classOther     = "other"
)

// reqKey names a kind of request: "PUT /v1/session/renew/ID", "ping",
// "update", with its class.
type reqKey struct{ name, class string }

// rates is requests (or requests per second) by kind.
type rates map[reqKey]float64

func (r rates) byClass() map[string]float64 {
	out := map[string]float64{}
	for k, v := range r {
		out[k.class] += v
	}
	return out
}

func (r rates) total() float64 {
	n := 0.0
	for _, v := range r {
		n += v
	}
	return n
}

// per divides counts by a duration.
func (r rates) per(d time.Duration) rates {
	out := rates{}
	for k, v := range r {
		out[k] = v / d.Seconds()
	}
	return out
}

// add adds o to r.
func (r rates) add(o rates) {
	for k, v := range o {
		r[k] += v
	}
}

// without is r less what is of class c.
func (r rates) without(c string) rates {
	out := rates{}
	for k, v := range r {
		if k.class != c {
			out[k] = v
		}
	}
	return out
}

// request is one request a counting proxy passed.
type request struct {
	start, end time.Duration // mono()
	key        reqKey
	woke       bool // Consul: a blocking query answered because the index moved
}

// sourceIPs hands out loopback source addresses for the proxies:
// 127.0.1.1, 127.0.1.2, ... (Linux routes all of 127/8 to the loopback
// device), never twice in a run. Consul limits each client address to
// 200 connections, and the apiserver's audit log tells clients apart by
// address; in production every host would have its own.
var sourceIPs struct {
	mu sync.Mutex
	n  int
}

func nextSourceIP() net.IP {
	sourceIPs.mu.Lock()
	defer sourceIPs.mu.Unlock()
	i := sourceIPs.n
	sourceIPs.n++
	return net.IPv4(127, byte(1+i/62500), byte(1+i/250%250), byte(1+i%250))
}

// ---- etcd

// etcdMeter reads the gRPC counters of a server that only the measured
// processes use.
type etcdMeter struct{ url string }

func (m *etcdMeter) addr(*tool, string) string { return m.url }
func (m *etcdMeter) perProcess() bool          { return false }
func (m *etcdMeter) close()                    {}

func (m *etcdMeter) how() string {
	return "etcd's gRPC counters (`grpc_server_msg_received_total`; for `LeaseKeepAlive`, `grpc_server_msg_sent_total`, since etcd counts two received messages per one-shot keep-alive stream and one response answers each keep-alive) on a server of the tool's own: the leader alone, then leader and follower, and the follower is the difference"
}

func (m *etcdMeter) mark() mark {
	recv, sent, err := etcdMetrics(m.url)
	if err != nil {
		benchT.Errorf("etcd metrics: %v", err)
	}
	return mark{at: mono(), wall: time.Now(), etcd: recv, etcdSent: sent}
}

func (m *etcdMeter) requests(_ []string, a, b mark) rates {
	r := rates{}
	for k, v := range delta(a.etcd, b.etcd) {
		r[reqKey{k, etcdClass(k)}] = v
	}
	return r
}

// woken: a waiting candidate watches only the key just ahead of it; when
// that key goes, it re-reads the queue once (a Range), and the new
// leader reads its own key once more: followers woken = Range − 1.
func (m *etcdMeter) woken(_ []string, a, b mark) (int, int) {
	ranges := b.etcd["Range"] - a.etcd["Range"]
	return max(int(ranges)-1, 0), int(b.etcdSent["Watch"] - a.etcdSent["Watch"])
}

// etcdMetrics reads etcd's gRPC server counters: requests received (see
// etcdRequests) and messages sent, by method.
func etcdMetrics(base string) (reqs, sent map[string]float64, err error) {
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	req, _ := http.NewRequestWithContext(ctx, http.MethodGet, base+"/metrics", nil)
	resp, err := httpc.Do(req)
	if err != nil {
		return nil, nil, err
	}
	defer resp.Body.Close()
	body, err := io.ReadAll(resp.Body)
	if err != nil {
		return nil, nil, err
	}
	recv := map[string]float64{}
	sent = map[string]float64{}
	for _, line := range strings.Split(string(body), "\n") {
		var m map[string]float64
		switch {
		case strings.HasPrefix(line, "grpc_server_msg_received_total{"):
			m = recv
		case strings.HasPrefix(line, "grpc_server_msg_sent_total{"):
			m = sent
		default:
			continue
		}
		_, rest, _ := strings.Cut(line, `grpc_method="`)
		method, rest, _ := strings.Cut(rest, `"`)
		_, val, _ := strings.Cut(rest, "} ")
		v, err := strconv.ParseFloat(strings.TrimSpace(val), 64)
		if err == nil {
			m[method] += v
		}
	}
	return etcdRequests(recv, sent), sent, nil
}

// etcdRequests turns etcd's counters into requests by method: messages
// received, except for LeaseKeepAlive, where it is responses sent. etcd
// counts two received messages for every one-shot keep-alive stream
// (clientv3's KeepAliveOnce: checked against grpc_server_started_total),
// and one response answers each keep-alive request.
func etcdRequests(recv, sent map[string]float64) map[string]float64 {
	out := map[string]float64{}
	for k, v := range recv {
		out[k] = v
	}
	out["LeaseKeepAlive"] = sent["LeaseKeepAlive"]
	return out
}

// delta is after − before, by key, leaving out zeros.
func delta(before, after map[string]float64) map[string]float64 {
	d := map[string]float64{}
	for k, v := range after {
		if x := v - before[k]; x != 0 {
			d[k] = x
		}
	}
	return d
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

// ---- Per-process proxies

// meteredProxy is a proxy in front of a store for one process, which
// records the requests it passes and the wake-ups it delivers.
type meteredProxy interface {
	started(from, to time.Duration) []request
	woken(from, to time.Duration) int
	close()
}

// proxySet is a meter's proxies, one per process, by tag.
type proxySet[P meteredProxy] struct {
	mu sync.Mutex
	by map[string]P
}

func (s *proxySet[P]) add(tag string, p P) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.by == nil {
		s.by = map[string]P{}
	}
	s.by[tag] = p
}

func (s *proxySet[P]) proxy(tag string) (P, bool) {
	s.mu.Lock()
	defer s.mu.Unlock()
	p, ok := s.by[tag]
	return p, ok
}

func (s *proxySet[P]) perProcess() bool { return true }

// requests counts tags' requests that started between a and b, by kind.
func (s *proxySet[P]) requests(tags []string, a, b mark) rates {
	r := rates{}
	for _, tag := range tags {
		if p, ok := s.proxy(tag); ok {
			for _, q := range p.started(a.at, b.at) {
				r[q.key]++
			}
		}
	}
	return r
}

// woken is how many of tags were woken between a and b, and how many
// wake-ups they had in all.
func (s *proxySet[P]) woken(tags []string, a, b mark) (n, wakes int) {
	for _, tag := range tags {
		if p, ok := s.proxy(tag); ok {
			if w := p.woken(a.at, b.at); w > 0 {
				n++
				wakes += w
			}
		}
	}
	return n, wakes
}

func (s *proxySet[P]) close() {
	s.mu.Lock()
	defer s.mu.Unlock()
	for _, p := range s.by {
		p.close()
	}
}

// ---- Consul

// consulMeter puts an HTTP proxy that counts every request in front of
// the agent for each process.
type consulMeter struct {
	agent string
	proxySet[*countingProxy]
}

func (m *consulMeter) addr(_ *tool, tag string) string {
	p, err := newCountingProxy(m.agent, nextSourceIP())
	if err != nil {
		benchT.Fatal(err)
	}
	m.add(tag, p)
	return p.addr()
}

func (m *consulMeter) mark() mark { return mark{at: mono(), wall: time.Now()} }

func (m *consulMeter) how() string {
	return "an HTTP reverse proxy in front of the agent for each process, which records every request; `?index` marks a blocking query"
}

// blocking is how long tag's blocking queries that ended between a and
// b lasted.
func (m *consulMeter) blocking(tag string, a, b mark) []time.Duration {
	var out []time.Duration
	if p, ok := m.proxy(tag); ok {
		for _, q := range p.ended(a.at, b.at) {
			if q.key.class == classBlocking {
				out = append(out, q.end-q.start)
			}
		}
	}
	return out
}

// classify names a Consul request by method and path, with key names and
// session ids replaced, and sorts it into a class.
func classify(method string, u *url.URL) reqKey {
	path := u.Path
	for _, pfx := range []string{"/v1/kv/", "/v1/session/renew/", "/v1/session/destroy/", "/v1/session/info/", "/v1/agent/check/pass/", "/v1/agent/check/deregister/"} {
		if strings.HasPrefix(path, pfx) {
			if pfx == "/v1/kv/" {
				path = pfx + "KEY"
			} else {
				path = pfx + "ID"
			}
		}
	}
	q := u.Query()
	for _, flag := range []string{"acquire", "release", "recurse", "keys", "cas"} {
		if q.Has(flag) {
			path += "?" + flag
		}
	}
	blocking := method == http.MethodGet && consulIndexOf(u) > 0
	if blocking {
		path += "?index"
	}
	k := reqKey{name: method + " " + path, class: classOther}
	switch {
	case blocking:
		k.class = classBlocking
	case method == http.MethodPut && (strings.HasPrefix(u.Path, "/v1/session/renew/") || strings.HasPrefix(u.Path, "/v1/agent/check/pass/")):
		// A session's renewal, and the pass of the TTL check it is bound to.
		k.class = classKeepalive
	}
	return k
}

// consulIndexOf is the index= parameter of a blocking query, 0 if none.
func consulIndexOf(u *url.URL) uint64 {
	n, _ := strconv.ParseUint(u.Query().Get("index"), 10, 64)
	return n
}

// countingProxy is an HTTP reverse proxy in front of the Consul agent for
// one process, which records every request it passes. It connects to the
// agent from a source address of its own.
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
		rec := request{start: mono(), key: classify(r.Method, r.URL)}
		index := consulIndexOf(r.URL)
		rp.ServeHTTP(w, r)
		rec.end = mono()
		if rec.key.class == classBlocking {
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

// ---- PostgreSQL

// postgresMeter gives each process a role of its own, whose every
// statement the server logs (ALTER ROLE ... SET log_statement = 'all'),
// and counts the log's lines by role.
type postgresMeter struct {
	s     *postgresStore
	mu    sync.Mutex
	roles map[string]bool
}

const postgresRolePassword = "bench-pw"

func (m *postgresMeter) addr(_ *tool, tag string) string {
	id := `"` + tag + `"`
	if _, err := m.s.exec(fmt.Sprintf(`CREATE ROLE %s LOGIN SUPERUSER PASSWORD '%s'; ALTER ROLE %s SET log_statement = 'all'`,
		id, postgresRolePassword, id)); err != nil {
		benchT.Fatalf("create role %s: %v", tag, err)
	}
	m.mu.Lock()
	m.roles[tag] = true
	m.mu.Unlock()
	return m.s.pg.URL(tag, postgresRolePassword)
}

func (m *postgresMeter) perProcess() bool { return true }

func (m *postgresMeter) how() string {
	return "the server's log: each process logs in as a role of its own with `log_statement = 'all'`, and its statements are counted by role"
}

func (m *postgresMeter) mark() mark {
	return mark{at: mono(), wall: time.Now(), off: len(m.s.pg.ServerLog())}
}

// postgresLine is a statement line of the server log, as testenv's
// log_line_prefix (`%m [%p] %q%u@%d `) writes it.
var postgresLine = regexp.MustCompile(`^\S+ \S+ \S+ \[\d+\] (\S+)@\S+ LOG:  (?:statement|execute [^:]*): (.*)$`)

func (m *postgresMeter) lines(a, b mark) []string {
	log := m.s.pg.ServerLog()
	return strings.Split(log[min(a.off, len(log)):min(b.off, len(log))], "\n")
}

func (m *postgresMeter) requests(tags []string, a, b mark) rates {
	r := rates{}
	for _, line := range m.lines(a, b) {
		if mm := postgresLine.FindStringSubmatch(line); mm != nil && slices.Contains(tags, mm[1]) {
			r[postgresStatement(mm[2])]++
		}
	}
	return r
}

// woken: every listening candidate gets the notification of a change;
// the ones that act on it send a statement.
func (m *postgresMeter) woken(tags []string, a, b mark) (n, wakes int) {
	acted := map[string]int{}
	for _, line := range m.lines(a, b) {
		if mm := postgresLine.FindStringSubmatch(line); mm != nil && slices.Contains(tags, mm[1]) {
			if k := postgresStatement(mm[2]); k.class == classOther {
				acted[mm[1]]++
			}
		}
	}
	for _, c := range acted {
		n++
		wakes += c
	}
	return n, wakes
}

func (m *postgresMeter) close() {}

// postgresStatement names a statement of backends/postgres by its first
// line: the renewal is the leader's keep-alive, LISTEN and the
// listening connection's ping are its watch.
func postgresStatement(sql string) reqKey {
	sql = strings.TrimSpace(sql)
	for _, s := range []struct{ prefix, name, class string }{
		{"WITH cur AS", "acquire", classOther},
		{"WITH r AS", "renew", classKeepalive},
		{"WITH rel AS", "release", classOther},
		{"WITH l AS", "complete", classOther},
		{"SELECT holder, token, expires", "verify", classOther},
		{"SELECT holder, token, (extract", "status", classOther},
		{"SELECT pg_notify", "probe notification", classOther},
		{"INSERT INTO", "create row", classOther},
		{"UPDATE", "free row", classOther},
		{"LISTEN", "LISTEN", classBlocking},
		{"UNLISTEN", "UNLISTEN", classOther},
		{"-- ping", "ping", classBlocking},
		{";", "ping", classBlocking},
	} {
		if strings.HasPrefix(sql, s.prefix) {
			return reqKey{s.name, s.class}
		}
	}
	if len(sql) > 24 {
		sql = sql[:24] + "…"
	}
	return reqKey{sql, classOther}
}

// ---- Kubernetes

// kubeMeter gives each process a TCP proxy of its own in front of the
// apiserver (TLS passes through it), which connects from a source
// address of its own, and counts the requests on leases in the
// apiserver's audit log by that address.
type kubeMeter struct {
	s       *kubeStore
	b       *bench
	user    string
	proxies proxySet[*tcpProxy]
}

func (m *kubeMeter) addr(_ *tool, tag string) string {
	p, err := newTCPProxy(m.s.k.Addr(), nextSourceIP(), nil)
	if err != nil {
		benchT.Fatal(err)
	}
	m.proxies.add(tag, p)
	return m.s.k.KubeconfigVia(benchT, "https://"+p.addr(), m.user, m.s.ns)
}

func (m *kubeMeter) perProcess() bool { return true }

func (m *kubeMeter) how() string {
	return "the apiserver's audit log (every request on leases, logged once answered), each process connecting through a proxy of its own from a source address of its own; watch events sent, from the apiserver's `apiserver_watch_events_total` of leases"
}

func (m *kubeMeter) mark() mark {
	return mark{at: mono(), wall: time.Now(), watchEvents: kubeWatchEvents(m.s.k)}
}

// kubeWatchEvents is the number of watch events the apiserver has sent
// on leases, all watchers together.
func kubeWatchEvents(k *testenv.Kube) float64 {
	data := k.Admin(benchT, http.MethodGet, "/metrics", nil)
	n := 0.0
	for _, line := range strings.Split(string(data), "\n") {
		if strings.HasPrefix(line, "apiserver_watch_events_total{") && strings.Contains(line, `kind="Lease"`) {
			f := strings.Fields(line)
			if v, err := strconv.ParseFloat(f[len(f)-1], 64); err == nil {
				n += v
			}
		}
	}
	return n
}

func (m *kubeMeter) ipsOf(tags []string) map[string]string {
	ips := map[string]string{}
	for _, tag := range tags {
		if p, ok := m.proxies.proxy(tag); ok {
			ips[p.source.String()] = tag
		}
	}
	return ips
}

// between lists the audit log's requests from tags between a and b,
// with the tag each came from.
func (m *kubeMeter) between(tags []string, a, b mark) (reqs []testenv.KubeRequest, from []string) {
	ips := m.ipsOf(tags)
	for _, r := range m.s.k.LeaseRequests(benchT) {
		if r.At.Before(a.wall) || !r.At.Before(b.wall) || len(r.SourceIPs) == 0 {
			continue
		}
		if tag, ok := ips[r.SourceIPs[len(r.SourceIPs)-1]]; ok {
			reqs = append(reqs, r)
			from = append(from, tag)
		}
	}
	return reqs, from
}

func kubeKey(r testenv.KubeRequest) reqKey {
	k := reqKey{name: r.Verb, class: classOther}
	if r.Code == http.StatusConflict {
		k.name += " (409 Conflict)"
	}
	switch r.Verb {
	case "watch":
		k.class = classBlocking
	case "update":
		// The holder's renewal; a follower has nothing to renew (see
		// storeColumn.sessions).
		k.class = classKeepalive
	}
	return k
}

func (m *kubeMeter) requests(tags []string, a, b mark) rates {
	r := rates{}
	reqs, _ := m.between(tags, a, b)
	for _, q := range reqs {
		r[kubeKey(q)]++
	}
	return r
}

// woken: every watcher of the Lease receives every change of it (wakes:
// watch events sent on leases, all watchers); the followers that acted
// on one sent a request other than a watch.
func (m *kubeMeter) woken(tags []string, a, b mark) (n, wakes int) {
	reqs, from := m.between(tags, a, b)
	acted := map[string]bool{}
	for i, q := range reqs {
		if q.Verb != "watch" {
			acted[from[i]] = true
		}
	}
	return len(acted), int(b.watchEvents - a.watchEvents)
}

func (m *kubeMeter) close() { m.proxies.close() }

// ---- ZooKeeper

// zkMeter gives each process a TCP proxy of its own in front of the
// server, which reads ZooKeeper's framing: requests by operation (and
// whether they set a watch) from the client, watch events (xid −1) from
// the server.
type zkMeter struct {
	target string
	proxySet[*tcpProxy]
}

func (m *zkMeter) addr(_ *tool, tag string) string {
	p, err := newTCPProxy(m.target, nextSourceIP(), newZKInspector)
	if err != nil {
		benchT.Fatal(err)
	}
	m.add(tag, p)
	return p.addr()
}

func (m *zkMeter) mark() mark { return mark{at: mono(), wall: time.Now()} }

func (m *zkMeter) how() string {
	return "a TCP proxy in front of the server for each process, which reads ZooKeeper's framing: requests by operation from the client, watch events from the server"
}

// zkOps names ZooKeeper's operation codes.
var zkOps = map[int32]string{
	1: "create", 2: "delete", 3: "exists", 4: "getData", 5: "setData", 6: "getACL", 7: "setACL",
	8: "getChildren", 9: "sync", 11: "ping", 12: "getChildren2", 13: "check", 14: "multi", 15: "create2",
	17: "checkWatches", 18: "removeWatches", 19: "createContainer", 21: "createTTL", 22: "multiRead",
	100: "auth", 101: "setWatches", 105: "setWatches2", 106: "addWatch", -11: "closeSession",
}

// zkInspector reads one connection's frames: a 4-byte length, then the
// frame; the first frame each way is the session's connect request or
// response, without a header.
type zkInspector struct {
	up, down zkFramer
}

func newZKInspector() inspector { return &zkInspector{} }

type zkFramer struct {
	buf  []byte
	seen bool // the connect frame went by
}

// frames appends data and returns the complete frames (without their
// length), the connect frame left out.
func (f *zkFramer) frames(data []byte) [][]byte {
	f.buf = append(f.buf, data...)
	var out [][]byte
	for len(f.buf) >= 4 {
		n := int(binary.BigEndian.Uint32(f.buf))
		if n < 0 || n > 1<<24 {
			f.buf = nil // not ZooKeeper's framing: stop reading
			return out
		}
		if len(f.buf) < 4+n {
			break
		}
		frame := f.buf[4 : 4+n]
		f.buf = f.buf[4+n:]
		if !f.seen {
			f.seen = true
			continue
		}
		out = append(out, frame)
	}
	if len(f.buf) == 0 {
		f.buf = nil
	}
	return out
}

func (z *zkInspector) client(data []byte, at time.Duration, p *tcpProxy) {
	for _, fr := range z.up.frames(data) {
		if len(fr) < 8 {
			continue
		}
		op := int32(binary.BigEndian.Uint32(fr[4:8]))
		name, ok := zkOps[op]
		if !ok {
			name = fmt.Sprintf("op %d", op)
		}
		k := reqKey{name: name, class: classOther}
		switch op {
		case 11:
			k.class = classKeepalive
		case 101, 105, 106:
			k.class = classBlocking
		case 3, 4, 8, 12:
			// path (4-byte length, bytes), then the watch flag.
			if len(fr) >= 12 {
				if n := int(binary.BigEndian.Uint32(fr[8:12])); n >= 0 && len(fr) > 12+n && fr[12+n] != 0 {
					k.name += " (watch)"
					k.class = classBlocking
				}
			}
		}
		p.record(request{start: at, end: at, key: k})
	}
}

func (z *zkInspector) server(data []byte, at time.Duration, p *tcpProxy) {
	for _, fr := range z.down.frames(data) {
		if len(fr) >= 4 && int32(binary.BigEndian.Uint32(fr[:4])) == -1 {
			p.event(at)
		}
	}
}

// ---- TCP proxy

// inspector reads the bytes of one proxied connection, each way.
type inspector interface {
	client(data []byte, at time.Duration, p *tcpProxy)
	server(data []byte, at time.Duration, p *tcpProxy)
}

// tcpProxy forwards connections from a loopback port to target,
// connecting from source, and lets an inspector (optional) read them.
type tcpProxy struct {
	ln      net.Listener
	target  string
	source  net.IP
	inspect func() inspector

	mu     sync.Mutex
	conns  map[net.Conn]struct{}
	reqs   []request
	events []time.Duration
	wg     sync.WaitGroup
}

func newTCPProxy(target string, source net.IP, inspect func() inspector) (*tcpProxy, error) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return nil, err
	}
	p := &tcpProxy{ln: ln, target: target, source: source, inspect: inspect, conns: map[net.Conn]struct{}{}}
	p.wg.Add(1)
	go p.accept()
	return p, nil
}

func (p *tcpProxy) addr() string { return p.ln.Addr().String() }

func (p *tcpProxy) accept() {
	defer p.wg.Done()
	d := &net.Dialer{LocalAddr: &net.TCPAddr{IP: p.source}, Timeout: 10 * time.Second}
	for {
		in, err := p.ln.Accept()
		if err != nil {
			return
		}
		out, err := d.Dial("tcp", p.target)
		if err != nil {
			in.Close()
			continue
		}
		var ins inspector
		if p.inspect != nil {
			ins = p.inspect()
		}
		p.mu.Lock()
		p.conns[in], p.conns[out] = struct{}{}, struct{}{}
		p.mu.Unlock()
		p.wg.Add(2)
		go p.pipe(in, out, ins, true)
		go p.pipe(out, in, ins, false)
	}
}

func (p *tcpProxy) pipe(src, dst net.Conn, ins inspector, up bool) {
	defer p.wg.Done()
	defer func() {
		src.Close()
		dst.Close()
		p.mu.Lock()
		delete(p.conns, src)
		delete(p.conns, dst)
		p.mu.Unlock()
	}()
	buf := make([]byte, 32<<10)
	for {
		n, err := src.Read(buf)
		if n > 0 {
			if ins != nil {
				if up {
					ins.client(buf[:n], mono(), p)
				} else {
					ins.server(buf[:n], mono(), p)
				}
			}
			if _, werr := dst.Write(buf[:n]); werr != nil {
				return
			}
		}
		if err != nil {
			return
		}
	}
}

func (p *tcpProxy) record(r request) {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.reqs = append(p.reqs, r)
}

func (p *tcpProxy) event(at time.Duration) {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.events = append(p.events, at)
}

func (p *tcpProxy) started(from, to time.Duration) []request {
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

// woken is how many watch events the proxy passed to its client between
// from and to.
func (p *tcpProxy) woken(from, to time.Duration) int {
	p.mu.Lock()
	defer p.mu.Unlock()
	n := 0
	for _, at := range p.events {
		if at >= from && at < to {
			n++
		}
	}
	return n
}

func (p *tcpProxy) close() {
	p.ln.Close()
	p.mu.Lock()
	for c := range p.conns {
		c.Close()
	}
	p.mu.Unlock()
	p.wg.Wait()
}
