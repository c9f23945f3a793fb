package bench

import (
	"bytes"
	"context"
	"encoding/base64"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"net/url"
	"slices"
	"strconv"
	"strings"
	"time"
)

// Timings every tool uses, as close to each other as the tools allow.
//
// etcd: a 5 s lease for both (etcdctl lock --ttl 5); leaderrun renews every
// 500 ms, stops its child 3 s after the last acknowledged renewal and
// SIGKILLs it 1 s later, the fault suite's settings.
//
// Consul: `consul lock` has no flag for its session: it always asks for a
// 15 s TTL and gets Consul's default 15 s lock-delay, and renews every
// TTL/2. leaderrun runs with its defaults, which are the same TTL and
// lock-delay (renewing every 2 s).
var (
	lrEtcdTimings   = []string{"--lease-duration", "5s", "--renew-deadline", "3s", "--retry-period", "500ms", "--kill-grace", "1s"}
	lrConsulTimings = []string{"--lease-duration", "15s", "--renew-deadline", "10s", "--retry-period", "2s", "--kill-grace", "3s", "--consul-lock-delay", "15s"}
	etcdctlTTL      = "5"
	etcdLease       = 5 * time.Second
	consulTTL       = 15 * time.Second
	consulLockDelay = 15 * time.Second
)

// tool is one way of running a command under a lock.
type tool struct {
	id    string // short, used in tags and lock names
	name  string // for tables
	store string // "etcd", "consul"; "" for the baseline
	// argv runs the child under lock, talking to the store at addr (an
	// etcd client URL or a Consul host:port).
	argv func(b *bench, lock, addr string) []string
	env  []string
	// prefix is where the candidates' keys live (etcd); key is the key
	// the holder's session acquires (Consul).
	prefix func(lock string) string
	key    func(lock string) string
	// session reports whether a Consul session name is one of this tool's
	// candidates for lock.
	session func(name, lock string) bool
	// bin is the leaderrun binary of a comparison column (BENCH_COMPARE);
	// empty: the one under test.
	bin string
}

// leaderrunOn is leaderrun on one store: its store flags for the address,
// and its timings.
func leaderrunOn(id, name, store string, storeArgs func(addr string) []string, timings []string) *tool {
	tl := &tool{id: id, name: name, store: store}
	tl.argv = func(b *bench, lock, addr string) []string {
		bin := b.lr
		if tl.bin != "" {
			bin = tl.bin
		}
		return slices.Concat([]string{bin}, storeArgs(addr), []string{"--lock", lock, "--identity", lock, "--log-format", "json"},
			timings, []string{"--", b.child})
	}
	return tl
}

// comparison is tl with another leaderrun binary, for BENCH_COMPARE.
func (tl *tool) comparison(label, bin string) *tool {
	c := *tl
	c.id, c.name, c.bin = tl.id+"-"+label, strings.Replace(tl.name, "leaderrun", "leaderrun@"+label, 1), bin
	argv := tl.argv
	c.argv = func(b *bench, lock, addr string) []string {
		a := argv(b, lock, addr)
		a[0] = bin
		return a
	}
	return &c
}

var (
	lrEtcd = func() *tool {
		tl := leaderrunOn("lre", "leaderrun (etcd)", "etcd", func(addr string) []string { return []string{"--etcd-endpoints", addr} }, lrEtcdTimings)
		tl.prefix = func(lock string) string { return "leaderrun/" + lock + "/" }
		return tl
	}()
	etcdctlLock = &tool{id: "ecl", name: "etcdctl lock", store: "etcd",
		argv: func(b *bench, lock, addr string) []string {
			return []string{b.etcdctl, "--endpoints", addr, "lock", "--ttl", etcdctlTTL, lock, b.child}
		},
		prefix: func(lock string) string { return lock + "/" },
	}
	lrConsul = func() *tool {
		tl := leaderrunOn("lrc", "leaderrun (Consul)", "consul", func(addr string) []string { return []string{"--consul-addr", addr} }, lrConsulTimings)
		tl.key = func(lock string) string { return "leaderrun/" + lock }
		tl.session = func(name, lock string) bool { return name == "leaderrun leaderrun/"+lock }
		return tl
	}()
	// consulLock runs the child directly (-shell=false), like the other
	// tools. With its default, -shell, it runs `$SHELL -c COMMAND`, and a
	// shell that does not exec the command (dash here) gets the SIGTERM
	// meant for the command: consulLockShell checks that once.
	consulLock = &tool{id: "cnl", name: "consul lock", store: "consul",
		argv: func(b *bench, lock, addr string) []string {
			return []string{b.consul, "lock", "-shell=false", "-http-addr", "http://" + addr, lock, b.child}
		},
		key:     func(lock string) string { return lock + "/.lock" },
		session: func(name, lock string) bool { return strings.HasSuffix(name, " at '"+lock+"'") },
	}
	consulLockShell = &tool{id: "cns", name: "consul lock (default -shell, SHELL=/bin/sh)", store: "consul",
		argv: func(b *bench, lock, addr string) []string {
			return []string{b.consul, "lock", "-http-addr", "http://" + addr, lock, b.child}
		},
		env:     []string{"SHELL=/bin/sh"},
		key:     func(lock string) string { return lock + "/.lock" },
		session: func(name, lock string) bool { return strings.HasSuffix(name, " at '"+lock+"'") },
	}
	// direct is no wrapper at all: the cost of starting the child itself.
	direct = &tool{id: "dir", name: "child alone (no lock)",
		argv: func(b *bench, lock, addr string) []string { return []string{b.child} },
	}
)

// wrappers are the tools under a lock, store by store: leaderrun, then
// the store's own CLI lock.
var wrappers = func() []*tool {
	var w []*tool
	for _, col := range storeColumns {
		w = append(w, col.lr)
		if col.ref != nil {
			w = append(w, col.ref)
		}
	}
	return w
}()

// storeColumn is one store leaderrun is benchmarked on, beside that
// store's own CLI lock if it has one, with the start-up goals that hold
// it to that CLI. Adding a backend to the start-up, exec-to-exit and
// memory figures (and their goals) is one entry here, its leaderrunOn
// tool above, its server in TestBench and its address in bench.addr; the
// loss, handover, crash, cost and herd phases name their stores
// themselves.
type storeColumn struct {
	lr *tool
	// ref is the store's own CLI lock; nil if it has none.
	ref *tool
	// s2cRatio and exitRatio bound leaderrun's start-to-child and
	// exec-to-exit p50 as a multiple of ref's; 0: no goal.
	s2cRatio, exitRatio float64
}

var storeColumns = []storeColumn{
	{lr: lrEtcd, ref: etcdctlLock, s2cRatio: 0.8, exitRatio: 1.0},
	{lr: lrConsul, ref: consulLock, s2cRatio: 0.3},
}

// Memory goals while leading, for every store column.
const (
	rssGoalKiB  = 12 * 1024 // leaderrun and its watchdog, VmHWM
	anonGoalKiB = 3 * 1024  // leaderrun and its watchdog, anonymous pages
)

// addr is the tool's store address for the latency runs.
func (b *bench) addr(tl *tool) string {
	switch tl.store {
	case "etcd":
		return b.etcdURL
	case "consul":
		return b.consulAddr
	}
	return ""
}

// start runs tl on lock with the child tagged tag.
func (b *bench) start(tl *tool, lock, tag, addr string, hold bool) (*proc, error) {
	return b.spawn(tl.argv(b, lock, addr), tag, hold, tl.env...)
}

// candidates counts tl's candidates for lock in the store at addr (an
// etcd client URL, a Consul host:port): keys under its prefix in etcd,
// sessions named for it in Consul.
func candidates(tl *tool, lock, addr string) (int, error) {
	switch tl.store {
	case "etcd":
		kvs, err := etcdRange(addr, tl.prefix(lock))
		return len(kvs), err
	case "consul":
		var sessions []struct{ Name string }
		if err := consulGet(addr, "/v1/session/list", &sessions); err != nil {
			return 0, err
		}
		n := 0
		for _, s := range sessions {
			if tl.session(s.Name, lock) {
				n++
			}
		}
		return n, nil
	}
	return 0, fmt.Errorf("%s has no store", tl.name)
}

// waitCandidates waits until the store shows n candidates of tl for lock.
func (b *bench) waitCandidates(tl *tool, lock string, n int, timeout time.Duration) error {
	return b.waitCandidatesAt(tl, lock, n, timeout, b.addr(tl))
}

// waitCandidatesAt is waitCandidates for the store at addr. A server in
// another process offers nothing to wait on but its API, so this polls,
// every 20 ms, outside every timed window.
func (b *bench) waitCandidatesAt(tl *tool, lock string, n int, timeout time.Duration, addr string) error {
	deadline := time.Now().Add(timeout)
	for {
		got, err := candidates(tl, lock, addr)
		if err == nil && got >= n {
			return nil
		}
		if time.Now().After(deadline) {
			return fmt.Errorf("%s: %d of %d candidates for %s in the store after %v (last error: %v)", tl.name, got, n, lock, timeout, err)
		}
		time.Sleep(20 * time.Millisecond)
	}
}

// dropHolder makes the store end the lock holder's lease: etcd revokes
// the lease of the oldest key under the tool's prefix, Consul destroys the
// session that holds the key. It returns mono() just before the request
// that did it was sent.
func (b *bench) dropHolder(tl *tool, lock string) (time.Duration, error) {
	switch tl.store {
	case "etcd":
		kvs, err := etcdRange(b.etcdURL, tl.prefix(lock))
		if err != nil {
			return 0, err
		}
		if len(kvs) == 0 {
			return 0, fmt.Errorf("no key under %s", tl.prefix(lock))
		}
		holder := kvs[0]
		for _, kv := range kvs {
			if kv.CreateRevision < holder.CreateRevision {
				holder = kv
			}
		}
		at := mono()
		return at, etcdPost(b.etcdURL, "/v3/lease/revoke", map[string]string{"ID": holder.Lease}, nil)
	case "consul":
		var pairs []struct{ Session string }
		if err := consulGet(b.consulAddr, "/v1/kv/"+tl.key(lock), &pairs); err != nil {
			return 0, err
		}
		if len(pairs) == 0 || pairs[0].Session == "" {
			return 0, fmt.Errorf("%s is not held", tl.key(lock))
		}
		at := mono()
		return at, consulPut(b.consulAddr, "/v1/session/destroy/"+pairs[0].Session)
	}
	return 0, fmt.Errorf("%s has no store", tl.name)
}

var httpc = &http.Client{Timeout: 10 * time.Second}

// etcdKV is a key as etcd's JSON gateway returns it.
type etcdKV struct {
	Key            []byte
	Lease          string
	CreateRevision int64 `json:"create_revision,string"`
}

// etcdRange lists the keys under prefix through etcd's JSON gateway, so
// that the benchmark needs no etcd client of its own.
func etcdRange(base, prefix string) ([]etcdKV, error) {
	end := []byte(prefix)
	end[len(end)-1]++
	var out struct{ Kvs []etcdKV }
	err := etcdPost(base, "/v3/kv/range", map[string]any{
		"key":       base64.StdEncoding.EncodeToString([]byte(prefix)),
		"range_end": base64.StdEncoding.EncodeToString(end),
		"keys_only": true,
	}, &out)
	return out.Kvs, err
}

func etcdPost(base, path string, body, out any) error {
	data, _ := json.Marshal(body)
	resp, err := httpc.Post(base+path, "application/json", bytes.NewReader(data))
	if err != nil {
		return err
	}
	defer resp.Body.Close()
	raw, _ := io.ReadAll(resp.Body)
	if resp.StatusCode != http.StatusOK {
		return fmt.Errorf("etcd %s: %s: %s", path, resp.Status, raw)
	}
	if out == nil {
		return nil
	}
	return json.Unmarshal(raw, out)
}

func consulGet(addr, path string, out any) error {
	resp, err := httpc.Get("http://" + addr + path)
	if err != nil {
		return err
	}
	defer resp.Body.Close()
	if resp.StatusCode == http.StatusNotFound {
		return nil
	}
	if resp.StatusCode != http.StatusOK {
		return fmt.Errorf("consul %s: %s", path, resp.Status)
	}
	return json.NewDecoder(resp.Body).Decode(out)
}

func consulPut(addr, path string) error {
	req, _ := http.NewRequest(http.MethodPut, "http://"+addr+path, nil)
	resp, err := httpc.Do(req)
	if err != nil {
		return err
	}
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		return fmt.Errorf("consul %s: %s", path, resp.Status)
	}
	return nil
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

// consulIndexOf is the index= parameter of a blocking query, 0 if none.
func consulIndexOf(u *url.URL) uint64 {
	n, _ := strconv.ParseUint(u.Query().Get("index"), 10, 64)
	return n
}
