package azureblob_test

import (
	"context"
	"errors"
	"fmt"
	"net/http"
	"net/http/httptest"
	"net/http/httputil"
	"net/url"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/Azure/azure-sdk-for-go/sdk/azcore/to"
	"github.com/Azure/azure-sdk-for-go/sdk/storage/azblob/blob"
	"github.com/Azure/azure-sdk-for-go/sdk/storage/azblob/container"
	azlease "github.com/Azure/azure-sdk-for-go/sdk/storage/azblob/lease"
	"github.com/Azure/azure-sdk-for-go/sdk/storage/azblob/sas"

	"github.com/leaderrun/leaderrun/backends"
	"github.com/leaderrun/leaderrun/backends/azureblob"
	"github.com/leaderrun/leaderrun/backends/backendtest"
	"github.com/leaderrun/leaderrun/internal/testenv"
)

const prefix = "leaderrun-test/"

// leaseDuration is Azure's shortest lease.
const leaseDuration = 15 * time.Second

// retry is the retry period of the tests' backends: a waiter reads the
// blob every 400 ms, a lease checks itself after 200 ms without proof,
// so that the suite's 1 s bounds on a handover and on a loss hold with
// room to spare.
const retry = 400 * time.Millisecond

// env is one Azurite shared by the subtests of TestAzureBlob (Node takes
// a second or two to start), and a client of its own that plays the
// operator.
type env struct {
	az        *testenv.Azurite
	container string
	admin     *container.Client
}

// TestAzureBlob runs every test that needs a blob service against the
// same one, each in a container of its own.
func TestAzureBlob(t *testing.T) {
	az := testenv.StartAzurite(t)
	for _, tc := range []struct {
		name string
		run  func(*testing.T, *env)
	}{
		{"Conformance", testConformance},
		{"TokensSurviveLockBlobDeletion", testTokensAcrossLockDeletes},
		{"TokensSurviveStateBlobDeletion", testTokensAcrossStateDeletes},
		{"StaleHolderIsFenced", testStaleHolder},
		{"StaleMarkWriteConflicts", testStaleMark},
		{"LossSeenByCheck", testLossByCheck},
		{"RenewalRefusedIsLoss", testRenewRefused},
		{"ContainerCreated", testContainerCreated},
		{"CredentialKinds", testCredentialKinds},
		{"WrongKeyIsFinal", testWrongKey},
		{"FewAcquisitionsPerHandover", testNoHerd},
		{"IdleWaiterReads", testIdleWaiter},
		{"LeaderChecksBetweenRenewals", testLeaderRequests},
		{"ChecksAtMost700msApart", testCheckGap},
		{"StatusAndRecord", testStatusRecord},
	} {
		t.Run(tc.name, func(t *testing.T) {
			e := &env{az: az, container: containerName(tc.name)}
			var err error
			if e.admin, err = container.NewClientFromConnectionString(az.ConnectionString(), e.container, nil); err != nil {
				t.Fatal(err)
			}
			tc.run(t, e)
		})
	}
}

var containerSeq atomic.Int32

// containerName is a valid container name for a test.
func containerName(test string) string {
	var b strings.Builder
	for _, r := range strings.ToLower(test) {
		if r >= 'a' && r <= 'z' || r >= '0' && r <= '9' {
			b.WriteRune(r)
		}
	}
	s := b.String()
	if len(s) > 40 {
		s = s[:40]
	}
	return fmt.Sprintf("t%d-%s", containerSeq.Add(1), s)
}

func (e *env) config() azureblob.Config {
	return azureblob.Config{
		Container:   e.container,
		Credentials: azureblob.Credentials{ConnectionString: e.az.ConnectionString()},
		Prefix:      prefix,
	}
}

// timings are the tests' timings: Azure's shortest lease, the retry
// period above.
func timings(retry time.Duration) backends.Timings {
	return backends.Timings{LeaseDuration: leaseDuration, RenewDeadline: 10 * time.Second, RetryPeriod: retry, KillGrace: time.Second}
}

// candidate is a candidate for one lock, through a store of its own.
type candidate struct {
	s     *azureblob.Store
	lock  string
	retry time.Duration
}

func (c *candidate) Campaign(ctx context.Context, id string, try bool) (*backends.Lease, error) {
	return backends.Campaign(ctx, c.s, c.lock, backends.Candidate{Identity: id, Try: try, Timings: timings(c.retry)})
}

func (c *candidate) Status(ctx context.Context) (backends.Status, error) {
	return backends.ReadStatus(ctx, c.s, c.lock)
}

func (c *candidate) History(ctx context.Context) ([]backends.Term, error) {
	return backends.ReadHistory(ctx, c.s, c.lock, 0)
}

func (c *candidate) Completed(ctx context.Context, key string) (*backends.Marker, error) {
	return backends.ReadMarker(ctx, c.s, c.lock, key)
}

func (e *env) open(t *testing.T, edit ...func(*azureblob.Config)) *azureblob.Store {
	t.Helper()
	cfg := e.config()
	for _, f := range edit {
		f(&cfg)
	}
	s, err := azureblob.Open(cfg)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { s.Close() })
	return s
}

func (e *env) backend(t *testing.T, lock string, edit ...func(*azureblob.Config)) *candidate {
	return &candidate{s: e.open(t, edit...), lock: lock, retry: retry}
}

func campaign(t *testing.T, b *candidate, id string) *backends.Lease {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	l, err := b.Campaign(ctx, id, false)
	if err != nil {
		t.Fatalf("%s: campaign: %v", id, err)
	}
	t.Cleanup(func() { l.Release(context.Background(), nil) })
	return l
}

// blobOf is the lock blob of lock, as the operator's client sees it.
func (e *env) blobOf(lock string) *blob.Client { return e.admin.NewBlobClient(prefix + lock) }

// breakLease breaks the lease on a lock blob at once, as an operator
// would (az storage blob lease break --lease-break-period 0).
func (e *env) breakLease(t *testing.T, b *blob.Client) {
	t.Helper()
	lc, err := azlease.NewBlobClient(b, nil)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := lc.BreakLease(context.Background(), &azlease.BlobBreakOptions{BreakPeriod: to.Ptr(int32(0))}); err != nil {
		t.Fatalf("break the lease of %s: %v", b.URL(), err)
	}
}

func (e *env) deleteBlob(t *testing.T, b *blob.Client) {
	t.Helper()
	if _, err := b.Delete(context.Background(), nil); err != nil {
		t.Fatalf("delete %s: %v", b.URL(), err)
	}
}

func testConformance(t *testing.T, e *env) {
	backendtest.Run(t, backendtest.Harness{
		Open:    func(t *testing.T) backends.Store { return e.open(t) },
		Drop:    func(t *testing.T, lock string, _ *backends.Lease) { e.breakLease(t, e.blobOf(lock)) },
		Timings: timings(retry),
	})
}

// testTokensAcrossLockDeletes: 500 grants, and between each two the
// operator breaks the lease and deletes the lock blob: every token is
// greater than the one before (the state blob keeps the mark).
func testTokensAcrossLockDeletes(t *testing.T, e *env) {
	grants := 500
	if testing.Short() {
		grants = 50
	}
	b := e.backend(t, "deleted")
	var last uint64
	began := time.Now()
	for i := range grants {
		l := campaign(t, b, fmt.Sprintf("g%d", i))
		if l.Token() <= last {
			t.Fatalf("grant %d: token %d after %d", i, l.Token(), last)
		}
		last = l.Token()
		lb := e.blobOf(b.lock)
		e.breakLease(t, lb)
		e.deleteBlob(t, lb)
		if err := l.Release(context.Background(), nil); err != nil {
			t.Fatalf("release after the blob was deleted: %v", err)
		}
	}
	t.Logf("%d grants, the lock blob broken and deleted after each, in %v: tokens 1..%d, strictly increasing",
		grants, time.Since(began).Round(time.Millisecond), last)
}

// testTokensAcrossStateDeletes: the state blob deleted between grants;
// the lock blob's metadata keeps the mark.
func testTokensAcrossStateDeletes(t *testing.T, e *env) {
	b := e.backend(t, "statedel")
	var last uint64
	for i := range 50 {
		l := campaign(t, b, fmt.Sprintf("g%d", i))
		if l.Token() <= last {
			t.Fatalf("grant %d: token %d after %d", i, l.Token(), last)
		}
		last = l.Token()
		e.deleteBlob(t, e.admin.NewBlobClient(prefix+b.lock+"~state"))
		if err := l.Release(context.Background(), nil); err != nil {
			t.Fatal(err)
		}
	}
}

// testStaleHolder: a holder whose lease was broken, and taken by another,
// can renew nothing, write no marker, and does not move the next token
// back; its term still goes into the history.
func testStaleHolder(t *testing.T, e *env) {
	a, b := e.backend(t, "stale"), e.backend(t, "stale")
	la := campaign(t, a, "a")
	e.breakLease(t, e.blobOf("stale"))
	lb := campaign(t, b, "b")
	if lb.Token() <= la.Token() {
		t.Fatalf("b's token %d not greater than a's %d", lb.Token(), la.Token())
	}
	ctx := context.Background()
	if err := la.Renew(ctx); !errors.Is(err, backends.ErrLeaseLost) {
		t.Errorf("stale renew: %v, want ErrLeaseLost", err)
	}
	now := time.Now()
	if err := la.Complete(ctx, backends.Marker{Key: "k", Identity: "a", Token: la.Token(), At: now, Expires: now.Add(time.Hour)}); !errors.Is(err, backends.ErrLeaseLost) {
		t.Errorf("stale complete: %v, want ErrLeaseLost", err)
	}
	if m, err := b.Completed(ctx, "k"); err != nil || m != nil {
		t.Errorf("the stale holder's marker: %+v, %v", m, err)
	}
	term := backends.Term{Identity: "a", Token: la.Token(), Acquired: now, Ended: now, End: backends.EndLost, ExitCode: 143, Reason: "broken"}
	if err := la.Release(ctx, &term); err != nil {
		t.Errorf("stale release: %v", err)
	}
	if err := lb.Renew(ctx); err != nil {
		t.Errorf("the new holder's renewal after the stale release: %v", err)
	}
	st, err := b.Status(ctx)
	if err != nil || !st.Held || st.Identity != "b" || st.Token != lb.Token() {
		t.Errorf("status after the stale release: %+v, %v", st, err)
	}
	terms, err := b.History(ctx)
	if err != nil || len(terms) != 1 || terms[0].Token != la.Token() || terms[0].End != backends.EndLost {
		t.Errorf("history: %+v, %v", terms, err)
	}
	if err := lb.Release(ctx, nil); err != nil {
		t.Fatal(err)
	}
	lc := campaign(t, a, "c")
	if lc.Token() <= lb.Token() {
		t.Errorf("next token %d not greater than %d", lc.Token(), lb.Token())
	}
}

// testStaleMark: a writer that read the state blob and was delayed while
// another raised the mark cannot write its older, lower mark: the
// service refuses the write conditional on the ETag it read. Here the
// operator plays both writers.
func testStaleMark(t *testing.T, e *env) {
	b := e.backend(t, "stalemark")
	l := campaign(t, b, "a")
	state := e.admin.NewBlobClient(prefix + b.lock + "~state")
	ctx := context.Background()
	p, err := state.GetProperties(ctx, nil)
	if err != nil {
		t.Fatal(err)
	}
	if err := l.Release(ctx, nil); err != nil {
		t.Fatal(err)
	}
	l2 := campaign(t, b, "b") // raises the mark
	_, err = state.SetMetadata(ctx, map[string]*string{"leaderrun_token": to.Ptr("1")},
		&blob.SetMetadataOptions{AccessConditions: &blob.AccessConditions{ModifiedAccessConditions: &blob.ModifiedAccessConditions{IfMatch: p.ETag}}})
	if err == nil || !strings.Contains(err.Error(), "ConditionNotMet") {
		t.Fatalf("a write of the mark conditional on an old ETag: %v, want ConditionNotMet", err)
	}
	l2.Release(ctx, nil)
	if l3 := campaign(t, b, "c"); l3.Token() <= l2.Token() {
		t.Errorf("token %d after %d", l3.Token(), l2.Token())
	}
}

// testLossByCheck: with no renewals at all, a lease sees its loss within
// half a retry period (and a round trip) of the operator breaking it, at
// once or with a break period (the lease is then "breaking": nobody can
// take it yet, but it is lost).
func testLossByCheck(t *testing.T, e *env) {
	for _, period := range []int32{0, 10} {
		t.Run(fmt.Sprintf("BreakPeriod%ds", period), func(t *testing.T) {
			b := e.backend(t, fmt.Sprintf("check%d", period))
			l := campaign(t, b, "a")
			lc, _ := azlease.NewBlobClient(e.blobOf(b.lock), nil)
			sent := time.Now()
			if _, err := lc.BreakLease(context.Background(), &azlease.BlobBreakOptions{BreakPeriod: to.Ptr(period)}); err != nil {
				t.Fatal(err)
			}
			select {
			case <-l.Lost():
			case <-time.After(5 * time.Second):
				t.Fatal("loss not seen within 5s")
			}
			took := time.Since(sent)
			t.Logf("loss seen %v after the break was sent: %v", took.Round(time.Millisecond), l.Err())
			if took > retry/2+500*time.Millisecond {
				t.Errorf("loss seen after %v, want within half a retry period (%v) and a round trip", took, retry/2)
			}
			if !errors.Is(l.Err(), backends.ErrLeaseLost) {
				t.Errorf("Err() = %v", l.Err())
			}
		})
	}
}

// testRenewRefused: a renewal that the service refuses is a loss, with
// the service's code in the reason.
func testRenewRefused(t *testing.T, e *env) {
	b := e.backend(t, "renew")
	b.retry = 3 * time.Second // checks 700 ms apart: the renewal comes first
	l := campaign(t, b, "a")
	e.breakLease(t, e.blobOf(b.lock))
	err := l.Renew(context.Background())
	if !errors.Is(err, backends.ErrLeaseLost) || !strings.Contains(err.Error(), "LeaseIsBrokenAndCannotBeRenewed") {
		t.Fatalf("renew after a break: %v", err)
	}
	select {
	case <-l.Lost():
	default:
		t.Error("Lost() not closed by the refused renewal")
	}
}

// testContainerCreated: a missing container is created by the first
// campaign (the connection string's account key may create it).
func testContainerCreated(t *testing.T, e *env) {
	b := e.backend(t, "first")
	if _, err := e.admin.GetProperties(context.Background(), nil); err == nil {
		t.Fatal("the container exists before the first campaign")
	}
	st, err := b.Status(context.Background())
	if err != nil || st.Held {
		t.Fatalf("status in a missing container: %+v, %v", st, err)
	}
	campaign(t, b, "a")
	if _, err := e.admin.GetProperties(context.Background(), nil); err != nil {
		t.Fatalf("the container after the first campaign: %v", err)
	}
}

// testCredentialKinds: the account key, a SAS for the container, and the
// connection string all reach the same lock; none of them shows in an
// error.
func testCredentialKinds(t *testing.T, e *env) {
	if _, err := e.admin.Create(context.Background(), nil); err != nil {
		t.Fatal(err)
	}
	key, err := container.NewSharedKeyCredential(e.az.Account, e.az.Key)
	if err != nil {
		t.Fatal(err)
	}
	q, err := sas.BlobSignatureValues{
		Protocol: sas.ProtocolHTTPSandHTTP, ExpiryTime: time.Now().Add(time.Hour), ContainerName: e.container,
		Permissions: to.Ptr(sas.ContainerPermissions{Read: true, Write: true}).String(),
	}.SignWithSharedKey(key)
	if err != nil {
		t.Fatal(err)
	}
	kinds := []struct {
		name string
		edit func(*azureblob.Config)
	}{
		{"connection string", func(*azureblob.Config) {}},
		{"account and key", func(c *azureblob.Config) {
			c.Credentials = azureblob.Credentials{Account: e.az.Account, Key: e.az.Key}
			c.AccountURL = e.az.AccountURL()
		}},
		{"account and key, account from the URL", func(c *azureblob.Config) {
			c.Credentials = azureblob.Credentials{Key: e.az.Key}
			c.AccountURL = e.az.AccountURL()
		}},
		{"SAS", func(c *azureblob.Config) {
			c.Credentials = azureblob.Credentials{SAS: "?" + q.Encode()}
			c.AccountURL = e.az.AccountURL()
		}},
	}
	var last uint64
	for _, k := range kinds {
		b := e.backend(t, "kinds", k.edit)
		l := campaign(t, b, k.name)
		if l.Token() <= last {
			t.Errorf("%s: token %d after %d", k.name, l.Token(), last)
		}
		last = l.Token()
		now := time.Now()
		if err := l.Release(context.Background(), &backends.Term{Identity: k.name, Token: l.Token(), Acquired: now, Ended: now, End: backends.EndExited}); err != nil {
			t.Errorf("%s: release: %v", k.name, err)
		}
	}
	// A SAS without the right to write: refused, and final; the error
	// shows neither the signature nor the key.
	ro, _ := sas.BlobSignatureValues{
		Protocol: sas.ProtocolHTTPSandHTTP, ExpiryTime: time.Now().Add(time.Hour), ContainerName: e.container,
		Permissions: to.Ptr(sas.ContainerPermissions{Read: true}).String(),
	}.SignWithSharedKey(key)
	b := e.backend(t, "kinds", func(c *azureblob.Config) {
		c.Credentials = azureblob.Credentials{SAS: ro.Encode()}
		c.AccountURL = e.az.AccountURL()
	})
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	_, err = b.Campaign(ctx, "reader", false)
	if !errors.Is(err, backends.ErrUnavailable) {
		t.Fatalf("campaign with a read-only SAS: %v, want ErrUnavailable", err)
	}
	t.Logf("read-only SAS: %v", err)
	for _, secret := range []string{ro.Signature(), url.QueryEscape(ro.Signature()), e.az.Key} {
		if strings.Contains(err.Error(), secret) {
			t.Errorf("the error shows a secret: %v", err)
		}
	}
}

// testWrongKey: a key the service does not accept is a final refusal,
// at once, in every mode.
func testWrongKey(t *testing.T, e *env) {
	wrong := "d3Jvbmcga2V5IHdyb25nIGtleSB3cm9uZyBrZXkgd3Jvbmcga2V5IHdyb25nIGtleQ=="
	b := e.backend(t, "wrong", func(c *azureblob.Config) {
		c.Credentials = azureblob.Credentials{Account: e.az.Account, Key: wrong}
		c.AccountURL = e.az.AccountURL()
	})
	for _, try := range []bool{true, false} {
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		start := time.Now()
		_, err := b.Campaign(ctx, "w", try)
		cancel()
		if !errors.Is(err, backends.ErrUnavailable) || !strings.Contains(err.Error(), "403") {
			t.Errorf("try=%v: %v, want ErrUnavailable with the 403", try, err)
		}
		if d := time.Since(start); d > 5*time.Second {
			t.Errorf("try=%v: refused after %v, want at once", try, d)
		}
		if strings.Contains(fmt.Sprint(err), wrong) {
			t.Errorf("the error shows the key: %v", err)
		}
	}
}

// countingProxy is an HTTP reverse proxy in front of Azurite for one
// backend, which counts its lease acquisitions and its reads.
type countingProxy struct {
	srv      *httptest.Server
	mu       sync.Mutex
	acquires []time.Time
	reads    []time.Time
}

func newCountingProxy(t *testing.T, target string) *countingProxy {
	u, _ := url.Parse("http://" + target)
	p := &countingProxy{}
	rp := httputil.NewSingleHostReverseProxy(u)
	p.srv = httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		p.mu.Lock()
		switch {
		case r.Method == http.MethodPut && r.URL.Query().Get("comp") == "lease" && r.Header.Get("x-ms-lease-action") == "acquire":
			p.acquires = append(p.acquires, time.Now())
		case r.Method == http.MethodHead:
			p.reads = append(p.reads, time.Now())
		}
		p.mu.Unlock()
		rp.ServeHTTP(w, r)
	}))
	t.Cleanup(p.srv.Close)
	return p
}

func (p *countingProxy) addr() string { return strings.TrimPrefix(p.srv.URL, "http://") }

func countSince(ts []time.Time, from time.Time) int {
	n := 0
	for _, at := range ts {
		if !at.Before(from) {
			n++
		}
	}
	return n
}

// testNoHerd: ten waiters, five handovers. A waiter tries to acquire only
// after a read shows the lease free, and waiters read at spread moments,
// so a release is raced by few of them: the acquisitions per handover
// stay well under the number of waiters.
func testNoHerd(t *testing.T, e *env) {
	const waiters, handovers = 10, 5
	holder := campaign(t, e.backend(t, "herd"), "first")
	var proxies []*countingProxy
	got := make(chan *backends.Lease, waiters)
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	var wg sync.WaitGroup
	for i := range waiters {
		p := newCountingProxy(t, e.az.Addr())
		proxies = append(proxies, p)
		b := e.backend(t, "herd", func(c *azureblob.Config) {
			c.Credentials = azureblob.Credentials{ConnectionString: e.az.ConnectionStringVia(p.addr())}
		})
		wg.Go(func() {
			l, err := b.Campaign(ctx, fmt.Sprintf("w%d", i), false)
			if err == nil {
				got <- l
			}
		})
	}
	defer wg.Wait()
	defer cancel()
	// Every waiter has read the blob once before the first release.
	backendtest.WaitFor(t, "every waiter's first read", func() bool {
		for _, p := range proxies {
			p.mu.Lock()
			n := len(p.reads)
			p.mu.Unlock()
			if n == 0 {
				return false
			}
		}
		return true
	})
	var perHandover []int
	for range handovers {
		from := time.Now()
		if err := holder.Release(context.Background(), nil); err != nil {
			t.Fatal(err)
		}
		select {
		case holder = <-got:
		case <-time.After(10 * time.Second):
			t.Fatal("no waiter took the lock within 10s of a release")
		}
		// Let late readers see it held, then count.
		time.Sleep(retry + 100*time.Millisecond)
		n := 0
		for _, p := range proxies {
			p.mu.Lock()
			n += countSince(p.acquires, from)
			p.mu.Unlock()
		}
		perHandover = append(perHandover, n)
	}
	holder.Release(context.Background(), nil)
	total := 0
	for _, n := range perHandover {
		total += n
	}
	t.Logf("acquisitions per handover with %d waiters: %v", waiters, perHandover)
	if avg := float64(total) / handovers; avg > waiters/3 {
		t.Errorf("%.1f acquisitions per handover on average with %d waiters, want at most %d: a herd", avg, waiters, waiters/3)
	}
}

// testIdleWaiter: a waiter sends one read per retry period and nothing
// else while the lock is held.
func testIdleWaiter(t *testing.T, e *env) {
	holder := campaign(t, e.backend(t, "idle"), "holder")
	p := newCountingProxy(t, e.az.Addr())
	b := e.backend(t, "idle", func(c *azureblob.Config) {
		c.Credentials = azureblob.Credentials{ConnectionString: e.az.ConnectionStringVia(p.addr())}
	})
	ctx, cancel := context.WithTimeout(context.Background(), 4*time.Second)
	defer cancel()
	from := time.Now()
	_, err := b.Campaign(ctx, "waiter", false)
	if !errors.Is(err, context.DeadlineExceeded) {
		t.Fatalf("waiter: %v", err)
	}
	p.mu.Lock()
	reads, acquires := countSince(p.reads, from), countSince(p.acquires, from)
	p.mu.Unlock()
	want := int(4 * time.Second / retry)
	t.Logf("in 4s: %d reads, %d acquisitions (retry period %v)", reads, acquires, retry)
	if acquires != 0 || reads < want-1 || reads > want+2 {
		t.Errorf("in 4s an idle waiter sent %d reads and %d acquisitions, want about %d reads and no acquisition", reads, acquires, want)
	}
	holder.Release(context.Background(), nil)
}

// testLeaderRequests: a leader renewed every retry period, as the runner
// renews it, checks its lease once between two renewals, never beside
// one: one renewal and one read per period.
func testLeaderRequests(t *testing.T, e *env) {
	p := newCountingProxy(t, e.az.Addr())
	b := e.backend(t, "leader", func(c *azureblob.Config) {
		c.Credentials = azureblob.Credentials{ConnectionString: e.az.ConnectionStringVia(p.addr())}
	})
	l := campaign(t, b, "leader")
	const periods = 10
	from := time.Now()
	tick := time.NewTicker(retry)
	defer tick.Stop()
	for range periods {
		<-tick.C
		if err := l.Renew(context.Background()); err != nil {
			t.Fatal(err)
		}
	}
	p.mu.Lock()
	reads := countSince(p.reads, from)
	p.mu.Unlock()
	t.Logf("%d renewals, %d reads in %d retry periods", periods, reads, periods)
	if reads < periods-2 || reads > periods+1 {
		t.Errorf("%d reads in %d retry periods with a renewal each, want one per period", reads, periods)
	}
}

// testCheckGap: with leaderrun's default retry period of 2 s and no
// renewals, a lease checks itself 700 ms after the answer to its last
// check (not a second), so that a loss is seen within S3's 1 s, round
// trips included.
func testCheckGap(t *testing.T, e *env) {
	p := newCountingProxy(t, e.az.Addr())
	b := e.backend(t, "gap", func(c *azureblob.Config) {
		c.Credentials = azureblob.Credentials{ConnectionString: e.az.ConnectionStringVia(p.addr())}
	})
	b.retry = 2 * time.Second
	campaign(t, b, "a")
	p.mu.Lock()
	before := len(p.reads) // the campaign's own reads
	p.mu.Unlock()
	backendtest.WaitFor(t, "six checks", func() bool {
		p.mu.Lock()
		defer p.mu.Unlock()
		return len(p.reads) >= before+6
	})
	p.mu.Lock()
	reads := slices.Clone(p.reads[before:])
	p.mu.Unlock()
	var gaps []time.Duration
	for i := 1; i < len(reads); i++ {
		gaps = append(gaps, reads[i].Sub(reads[i-1]))
	}
	slices.Sort(gaps)
	median := gaps[len(gaps)/2]
	t.Logf("retry period 2s, no renewals: checks %v apart (sorted)", gaps)
	if median < 700*time.Millisecond || median > 900*time.Millisecond {
		t.Errorf("checks %v apart at the median, want 700ms and a round trip", median)
	}
}

// testStatusRecord: what an operator's tools show of a grant: the lock
// blob's metadata names holder, token and lease duration; its lease is
// leased, fixed.
func testStatusRecord(t *testing.T, e *env) {
	b := e.backend(t, "record")
	l := campaign(t, b, "host-1:42 ünïcode")
	p, err := e.blobOf(b.lock).GetProperties(context.Background(), nil)
	if err != nil {
		t.Fatal(err)
	}
	if *p.LeaseState != "leased" || *p.LeaseDuration != "fixed" {
		t.Errorf("lease state %s, duration %s", *p.LeaseState, *p.LeaseDuration)
	}
	got := map[string]string{}
	for k, v := range p.Metadata {
		got[strings.ToLower(k)] = *v
	}
	want := map[string]string{"leaderrun_holder": url.QueryEscape("host-1:42 ünïcode"), "leaderrun_token": fmt.Sprint(l.Token()), "leaderrun_ttl": "15"}
	for k, v := range want {
		if got[k] != v {
			t.Errorf("metadata %s = %q, want %q (all: %v)", k, got[k], v, got)
		}
	}
	st, err := b.Status(context.Background())
	if err != nil || st.Identity != "host-1:42 ünïcode" || st.TTL != leaseDuration || st.Key != e.container+"/"+prefix+"record" {
		t.Errorf("status %+v, %v", st, err)
	}
}
