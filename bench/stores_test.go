package bench

import (
	"bytes"
	"context"
	"encoding/base64"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/go-zookeeper/zk"
	"github.com/jackc/pgx/v5"

	"github.com/leaderrun/leaderrun/internal/testenv"
)

// store is one store's servers for a run, and how the benchmark reaches
// into them from outside: where the tools connect, how many candidates of
// a lock the store shows, how to end the holder's lease as an operator
// (or the store itself) would, and how to count what processes send it.
type store interface {
	// start starts the store's servers; they stop when the test ends.
	start(b *bench)
	// addr is what tl is given to reach the store (etcd: a client URL;
	// Consul, ZooKeeper: host:port; PostgreSQL: a connection URL;
	// Kubernetes: a kubeconfig; local: the state directory).
	addr(tl *tool) string
	// prepare is called before the first candidate of lock starts.
	prepare(lock string)
	// candidates counts tl's candidates for lock that the store shows,
	// the leader included; procs are their processes, started with addr.
	candidates(tl *tool, lock, addr string, procs []*proc) (int, error)
	// drop ends the holder's lease of lock from outside and returns
	// mono() just before the request that did it was sent.
	drop(tl *tool, lock, addr string) (time.Duration, error)
	// meter counts what the processes it gives addresses to send the
	// store (see meter); tl is the tool it will count.
	meter(b *bench, tl *tool) meter
	// dropText says what drop does, for the report.
	dropText() string
}

func (b *bench) storeOf(tl *tool) store { return b.stores[tl.store] }

// addr is the tool's store address for the latency runs.
func (b *bench) addr(tl *tool) string {
	if tl.store == "" {
		return ""
	}
	return b.storeOf(tl).addr(tl)
}

func (b *bench) kube() *kubeStore { return b.stores["kubernetes"].(*kubeStore) }

// etcdStore is one single-node etcd.
type etcdStore struct {
	etcd *testenv.Etcd
	url  string
}

func (s *etcdStore) start(b *bench) {
	s.etcd = testenv.StartEtcd(b.t, 1)
	s.url = s.etcd.Endpoints()[0]
}

func (s *etcdStore) addr(*tool) string { return s.url }
func (s *etcdStore) prepare(string)    {}

func (s *etcdStore) candidates(tl *tool, lock, addr string, _ []*proc) (int, error) {
	if addr == "" {
		addr = s.url
	}
	kvs, err := etcdRange(addr, tl.prefix(lock))
	return len(kvs), err
}

// drop revokes the lease of the oldest key under the tool's prefix.
func (s *etcdStore) drop(tl *tool, lock, addr string) (time.Duration, error) {
	if addr == "" {
		addr = s.url
	}
	kvs, err := etcdRange(addr, tl.prefix(lock))
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
	return at, etcdPost(addr, "/v3/lease/revoke", map[string]string{"ID": holder.Lease}, nil)
}

func (s *etcdStore) dropText() string {
	return "the lease of the holder's key (under `leaderrun/LOCK/` or `LOCK/`) revoked through etcd's JSON gateway"
}

// meter: a server of its own for the tool, whose gRPC counters count
// only what the tool's processes send.
func (s *etcdStore) meter(b *bench, _ *tool) meter {
	e := testenv.StartEtcd(b.t, 1)
	return &etcdMeter{url: e.Endpoints()[0]}
}

// consulStore is one Consul dev agent.
type consulStore struct {
	agent *testenv.ConsulAgent
}

func (s *consulStore) start(b *bench)    { s.agent = testenv.StartConsul(b.t, testenv.ConsulOptions{}) }
func (s *consulStore) addr(*tool) string { return s.agent.Addr() }
func (s *consulStore) prepare(string)    {}

// candidates counts tl's candidates by their sessions, asking the agent
// directly (not through a counting proxy). A leaderrun candidate may hold
// two sessions, its lock session and its queue entry's, or only the
// latter (parked, further back in the queue), both bound to its own TTL
// check: it is counted once, by that check. A session bound to no check
// of its own (consul lock's) is one candidate.
func (s *consulStore) candidates(tl *tool, lock, _ string, _ []*proc) (int, error) {
	var sessions []struct {
		ID, Name   string
		NodeChecks []string
	}
	if err := consulGet(s.agent.Addr(), "/v1/session/list", &sessions); err != nil {
		return 0, err
	}
	seen := map[string]bool{}
	for _, ss := range sessions {
		if !tl.session(ss.Name, lock) {
			continue
		}
		who := ss.ID
		for _, c := range ss.NodeChecks {
			if c != "serfHealth" {
				who = c
			}
		}
		seen[who] = true
	}
	return len(seen), nil
}

// drop destroys the session that holds the key.
func (s *consulStore) drop(tl *tool, lock, _ string) (time.Duration, error) {
	var pairs []struct{ Session string }
	if err := consulGet(s.agent.Addr(), "/v1/kv/"+tl.key(lock), &pairs); err != nil {
		return 0, err
	}
	if len(pairs) == 0 || pairs[0].Session == "" {
		return 0, fmt.Errorf("%s is not held", tl.key(lock))
	}
	at := mono()
	return at, consulPut(s.agent.Addr(), "/v1/session/destroy/"+pairs[0].Session)
}

func (s *consulStore) dropText() string {
	return "the session holding the key (`leaderrun/LOCK` or `LOCK/.lock`) destroyed with `PUT /v1/session/destroy/ID`"
}

func (s *consulStore) meter(*bench, *tool) meter {
	return &consulMeter{agent: s.agent.Addr()}
}

// postgresStore is one PostgreSQL cluster; the tools connect as its
// superuser, each metered process as a role of its own.
type postgresStore struct {
	pg    *testenv.Postgres
	mu    sync.Mutex // admin
	admin *pgx.Conn
}

// Hundreds of leaderrun processes, each with its listening connection
// and a pool of up to two.
const postgresMaxConnections = 1000

func (s *postgresStore) start(b *bench) {
	s.pg = testenv.StartPostgresWith(b.t, testenv.PostgresOptions{MaxConnections: postgresMaxConnections})
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	var err error
	if s.admin, err = pgx.Connect(ctx, s.pg.SuperuserURL()); err != nil {
		b.t.Fatal(err)
	}
	b.t.Cleanup(func() { s.admin.Close(context.Background()) })
}

func (s *postgresStore) addr(*tool) string { return s.pg.SuperuserURL() }
func (s *postgresStore) prepare(string)    {}

// candidates counts the processes that listen for notifications (the
// leader too: a notification is how it learns of a loss). A candidate
// listens before its first attempt.
func (s *postgresStore) candidates(_ *tool, _, _ string, procs []*proc) (int, error) {
	n := 0
	for _, p := range procs {
		if p.logged("postgres: listening for notifications") {
			n++
		}
	}
	return n, nil
}

func (s *postgresStore) exec(sql string, args ...any) (int64, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	tag, err := s.admin.Exec(ctx, sql, args...)
	return tag.RowsAffected(), err
}

// drop deletes the lock's row, as an operator would by hand.
func (s *postgresStore) drop(_ *tool, lock, _ string) (time.Duration, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	at := mono()
	tag, err := s.admin.Exec(ctx, "DELETE FROM leaderrun_leases WHERE name = $1", "leaderrun/"+lock)
	if err == nil && tag.RowsAffected() != 1 {
		err = fmt.Errorf("no row for %s", lock)
	}
	return at, err
}

func (s *postgresStore) dropText() string {
	return "the lock's row deleted (`DELETE FROM leaderrun_leases WHERE name = 'leaderrun/LOCK'`)"
}

func (s *postgresStore) meter(*bench, *tool) meter {
	return &postgresMeter{s: s, roles: map[string]bool{}}
}

// kubeStore is one kube-apiserver and its etcd, in a namespace of the
// benchmark's own: leaderrun runs as the user KubeLimited (get, create,
// update, watch on leases), the client-go elector as KubeOther (get,
// create, update: what client-go's leaderelection needs).
type kubeStore struct {
	k      *testenv.Kube
	ns     string
	kc, cg string // kubeconfigs of leaderrun and client-go

	mu   sync.Mutex
	base map[string]int // lock → watches of leases before its first candidate
}

func (s *kubeStore) start(b *bench) {
	s.k = testenv.StartKube(b.t)
	s.ns = s.k.Namespace(b.t)
	s.k.Grant(b.t, s.ns, testenv.KubeLimited, "get", "create", "update", "watch")
	s.k.Grant(b.t, s.ns, testenv.KubeOther, "get", "create", "update")
	s.kc = s.k.Kubeconfig(b.t, testenv.KubeLimited, s.ns)
	s.cg = s.k.Kubeconfig(b.t, testenv.KubeOther, s.ns)
	s.base = map[string]int{}
}

func (s *kubeStore) user(tl *tool) string {
	if tl.elector {
		return testenv.KubeOther
	}
	return testenv.KubeLimited
}

func (s *kubeStore) addr(tl *tool) string {
	if tl.elector {
		return s.cg
	}
	return s.kc
}

func (s *kubeStore) prepare(lock string) {
	n := s.k.LeaseWatches(benchT)
	s.mu.Lock()
	defer s.mu.Unlock()
	s.base[lock] = n
}

// candidates: every leaderrun candidate watches the Lease, the leader
// too (for its loss); the apiserver counts its watches of leases, all
// Leases together, so this is the count above the one before the lock's
// first candidate (see prepare): one lock at a time.
func (s *kubeStore) candidates(_ *tool, lock, _ string, _ []*proc) (int, error) {
	s.mu.Lock()
	base, ok := s.base[lock]
	s.mu.Unlock()
	if !ok {
		return 0, fmt.Errorf("kubernetes: no baseline of watches for %s", lock)
	}
	return s.k.LeaseWatches(benchT) - base, nil
}

// drop gives the Lease to someone else (holderIdentity "operator"), as
// an operator (or another elector) would: for client-go as for leaderrun.
func (s *kubeStore) drop(_ *tool, lock, _ string) (time.Duration, error) {
	path := "/apis/coordination.k8s.io/v1/namespaces/" + s.ns + "/leases/" + lock
	at := mono()
	code, data := s.k.Request(benchT, testenv.KubeAdmin, http.MethodPatch, path,
		map[string]any{"spec": map[string]any{"holderIdentity": "operator"}})
	if code != http.StatusOK {
		return at, fmt.Errorf("patch %s: %d %s", path, code, data)
	}
	return at, nil
}

func (s *kubeStore) dropText() string {
	return "the Lease's holderIdentity changed to \"operator\" by a merge patch as the cluster admin"
}

func (s *kubeStore) meter(b *bench, tl *tool) meter {
	return &kubeMeter{s: s, b: b, user: s.user(tl)}
}

// zkStore is a standalone ZooKeeper with a tick of 200 ms.
type zkStore struct {
	zk    *testenv.ZooKeeper
	admin *zk.Conn
}

type zkSilent struct{}

func (zkSilent) Printf(string, ...any) {}

func (s *zkStore) start(b *bench) {
	s.zk = testenv.StartZooKeeper(b.t, 1)
	c, _, err := zk.Connect(s.zk.Servers(), 10*time.Second, zk.WithLogger(zkSilent{}), zk.WithLogInfo(false))
	if err != nil {
		b.t.Fatal(err)
	}
	b.t.Cleanup(c.Close)
	s.admin = c
}

func (s *zkStore) addr(*tool) string { return strings.Join(s.zk.Servers(), ",") }
func (s *zkStore) prepare(string)    {}

// zkCandidates are the candidates' znodes under the lock's, oldest first
// (Curator's protected names: _c_<guid>-latch-<sequence>).
func (s *zkStore) zkCandidates(lock string) ([]string, error) {
	children, _, err := s.admin.Children("/leaderrun/" + lock)
	if err == zk.ErrNoNode {
		return nil, nil
	}
	var cs []string
	for _, c := range children {
		if strings.HasPrefix(c, "_c_") && strings.Contains(c, "-latch-") {
			cs = append(cs, c)
		}
	}
	seq := func(name string) string { return name[strings.LastIndex(name, "-latch-"):] }
	slices.SortFunc(cs, func(a, b string) int { return strings.Compare(seq(a), seq(b)) })
	return cs, err
}

func (s *zkStore) candidates(_ *tool, lock, _ string, _ []*proc) (int, error) {
	cs, err := s.zkCandidates(lock)
	return len(cs), err
}

// drop deletes the leader's znode, as an operator would by hand.
func (s *zkStore) drop(_ *tool, lock, _ string) (time.Duration, error) {
	cs, err := s.zkCandidates(lock)
	if err != nil {
		return 0, err
	}
	if len(cs) == 0 {
		return 0, fmt.Errorf("no candidate under /leaderrun/%s", lock)
	}
	at := mono()
	return at, s.admin.Delete("/leaderrun/"+lock+"/"+cs[0], -1)
}

func (s *zkStore) dropText() string {
	return "the leader's znode (the lowest sequence under `/leaderrun/LOCK`) deleted"
}

func (s *zkStore) meter(*bench, *tool) meter {
	return &zkMeter{target: s.zk.Servers()[0]}
}

// localStore is a state directory on this host.
type localStore struct{ dir string }

func (s *localStore) start(b *bench) {
	s.dir = filepath.Join(b.t.TempDir(), "state")
	if err := os.Mkdir(s.dir, 0o700); err != nil {
		b.t.Fatal(err)
	}
}

func (s *localStore) addr(*tool) string { return s.dir }
func (s *localStore) prepare(string)    {}
func (s *localStore) candidates(*tool, string, string, []*proc) (int, error) {
	return 0, fmt.Errorf("local: not measured")
}
func (s *localStore) drop(*tool, string, string) (time.Duration, error) {
	return 0, fmt.Errorf("local: not measured")
}
func (s *localStore) dropText() string          { return "" }
func (s *localStore) meter(*bench, *tool) meter { return nil }

// benchT is the running benchmark's test, for testenv helpers that fail
// it on errors.
var benchT testing.TB

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
