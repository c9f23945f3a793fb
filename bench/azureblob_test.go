package bench

import (
	"context"
	"io"
	"log"
	"net"
	"net/http"
	"net/http/httputil"
	"net/url"
	"os"
	"strings"
	"sync"
	"time"

	"github.com/Azure/azure-sdk-for-go/sdk/azcore/to"
	"github.com/Azure/azure-sdk-for-go/sdk/storage/azblob/container"
	azlease "github.com/Azure/azure-sdk-for-go/sdk/storage/azblob/lease"

	"github.com/leaderrun/leaderrun/internal/testenv"
)

// azTimings are the fault suite's (faults/azureblob_test.go): Azure's
// shortest lease, renewals a second apart.
var azTimings = timings{lease: 15 * time.Second, deadline: 6 * time.Second, retry: time.Second, grace: 2 * time.Second}

// azContainer holds every lock of the benchmark.
const azContainer = "bench"

var lrAzure = leaderrunOn("lra", "leaderrun (Azure Blob)", "azureblob",
	func(addr string) []string {
		return []string{"--azure-container", azContainer, "--azure-account-url", addr}
	}, azTimings)

// azureColumn is Azure Blob Storage, on Azurite. There is no `az` lock
// to compare with. A waiter reads the blob every retry period and a lease
// checks itself half a period (at most 700 ms) after its last proof, so a
// loss is seen and a release taken over within a period, not
// milliseconds: the loss and handover goals of the other stores are not
// met, and say so.
var azureColumn = &storeColumn{name: "azureblob", title: "Azure Blob (Azurite)", lr: lrAzure, tm: azTimings, latency: true,
	crashGoal: azTimings.lease + azTimings.retry + 500*time.Millisecond, crashGoalText: "lease + retry period + 0.5 s",
	crashBound: azTimings.lease + 10*time.Second, crashTrials: 2,
	newStore: func() store { return &azureStore{} }}

// azureStore is one Azurite blob service. The account's name and key go
// into the benchmark's environment, which every process it starts
// inherits: leaderrun reads credentials from the environment only.
type azureStore struct {
	az    *testenv.Azurite
	admin *container.Client
}

func (s *azureStore) start(b *bench) {
	s.az = testenv.StartAzurite(b.t)
	os.Setenv("AZURE_STORAGE_ACCOUNT", s.az.Account)
	os.Setenv("AZURE_STORAGE_KEY", s.az.Key)
	var err error
	if s.admin, err = container.NewClientFromConnectionString(s.az.ConnectionString(), azContainer, nil); err != nil {
		b.t.Fatal(err)
	}
	if _, err := s.admin.Create(context.Background(), nil); err != nil {
		b.t.Fatal(err)
	}
}

func (s *azureStore) addr(*tool) string { return s.az.AccountURL() }
func (s *azureStore) prepare(string)    {}

// candidates counts the processes that have campaigned: Azure keeps no
// trace of waiters.
func (s *azureStore) candidates(_ *tool, _, _ string, procs []*proc) (int, error) {
	n := 0
	for _, p := range procs {
		if p.logged(`"msg":"campaigning"`) {
			n++
		}
	}
	return n, nil
}

// drop breaks the holder's lease at once, as an operator would (az
// storage blob lease break --lease-break-period 0).
func (s *azureStore) drop(_ *tool, lock, _ string) (time.Duration, error) {
	lc, err := azlease.NewBlobClient(s.admin.NewBlobClient("leaderrun/"+lock), nil)
	if err != nil {
		return 0, err
	}
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	at := mono()
	_, err = lc.BreakLease(ctx, &azlease.BlobBreakOptions{BreakPeriod: to.Ptr(int32(0))})
	return at, err
}

func (s *azureStore) dropText() string {
	return "the lease on the lock blob (`leaderrun/LOCK` in the container) broken with a break period of 0"
}

func (s *azureStore) meter(*bench, *tool) meter {
	return &azureMeter{target: s.az.Addr(), account: s.az.Account}
}

// azureMeter puts an HTTP proxy that records every request in front of
// Azurite for each process.
type azureMeter struct {
	target, account string
	proxySet[*azureProxy]
}

func (m *azureMeter) addr(_ *tool, tag string) string {
	p, err := newAzureProxy(m.target)
	if err != nil {
		benchT.Fatal(err)
	}
	m.add(tag, p)
	return "http://" + p.ln.Addr().String() + "/" + m.account
}

func (m *azureMeter) mark() mark { return mark{at: mono(), wall: time.Now()} }

func (m *azureMeter) how() string {
	return "an HTTP reverse proxy in front of Azurite for each process, which records every request: a lease renewal is a keep-alive; a read of the lock blob (HEAD) is polling, counted as other; an acquisition after a change counts the process as woken"
}

// azureKey names an Azure Blob request by method, operation and lease
// action, and sorts it into a class.
func azureKey(r *http.Request) reqKey {
	name := r.Method
	if comp := r.URL.Query().Get("comp"); comp != "" {
		name += " ?comp=" + comp
	}
	if action := r.Header.Get("x-ms-lease-action"); action != "" {
		name += " " + action
	}
	class := classOther
	if r.Header.Get("x-ms-lease-action") == "renew" {
		class = classKeepalive
	}
	return reqKey{name: name, class: class}
}

// azureProxy is the proxy of one process.
type azureProxy struct {
	ln  net.Listener
	srv *http.Server

	mu   sync.Mutex
	reqs []request
}

func newAzureProxy(target string) (*azureProxy, error) {
	return newRecordingProxy(target, azureKey, func(k reqKey) bool { return strings.HasSuffix(k.name, " acquire") })
}

// newRecordingProxy is an HTTP reverse proxy to target that records every
// request, named by key; woke says which of them show that a change woke
// the process (S3's meter uses it too).
func newRecordingProxy(target string, key func(*http.Request) reqKey, woke func(reqKey) bool) (*azureProxy, error) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return nil, err
	}
	to := &url.URL{Scheme: "http", Host: target}
	rp := &httputil.ReverseProxy{
		Rewrite:   func(pr *httputil.ProxyRequest) { pr.SetURL(to); pr.Out.Host = pr.In.Host },
		Transport: &http.Transport{MaxIdleConnsPerHost: 16},
		ErrorLog:  log.New(io.Discard, "", 0),
	}
	p := &azureProxy{ln: ln}
	p.srv = &http.Server{Handler: http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		rec := request{start: mono(), key: key(r)}
		rp.ServeHTTP(w, r)
		rec.end = mono()
		rec.woke = woke(rec.key)
		p.mu.Lock()
		p.reqs = append(p.reqs, rec)
		p.mu.Unlock()
	}), ErrorLog: log.New(io.Discard, "", 0)}
	go func() { _ = p.srv.Serve(ln) }()
	return p, nil
}

// started lists the requests that began in [from, to).
func (p *azureProxy) started(from, to time.Duration) []request {
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

// woken counts the acquisitions sent in [from, to): a waiter acts on a
// change only by trying to acquire.
func (p *azureProxy) woken(from, to time.Duration) int {
	n := 0
	for _, r := range p.started(from, to) {
		if r.woke {
			n++
		}
	}
	return n
}

func (p *azureProxy) close() { p.srv.Close() }
