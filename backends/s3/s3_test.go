package s3

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"net/http"
	"net/http/httputil"
	"net/url"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/aws/aws-sdk-go-v2/aws"
	"github.com/aws/aws-sdk-go-v2/credentials"
	s3api "github.com/aws/aws-sdk-go-v2/service/s3"

	"github.com/leaderrun/leaderrun/backends"
	"github.com/leaderrun/leaderrun/backends/backendtest"
	"github.com/leaderrun/leaderrun/backends/s3/spec"
	"github.com/leaderrun/leaderrun/internal/testenv"
)

// testPoll is the retry period of most tests' campaigns, and so the poll
// interval of waiters and holders.
const testPoll = 100 * time.Millisecond

// timings are valid timings around a lease of lease, polling every poll.
func timings(lease, poll time.Duration) backends.Timings {
	return backends.Timings{LeaseDuration: lease, RenewDeadline: lease / 2, RetryPeriod: poll, KillGrace: lease / 4}
}

// TestS3 runs every test of the store against one versitygw; each test
// has a bucket of its own.
func TestS3(t *testing.T) {
	e := &env{gw: testenv.StartVersityGW(t)}
	for _, tc := range []struct {
		name string
		run  func(*testing.T, *env)
	}{
		// First: the store is only as good as the server's conditions.
		{"ServerHonoursConditions", testServerConditions},
		{"Conformance", testConformance},
		{"TokensAcrossDeletesByHand", testTokensAcrossDeletes},
		{"StaleHolderFenced", testStaleHolder},
		{"StaleMarkWriteConflicts", testStaleMark},
		{"StalledGrantAfterDeleteByHand", testStalledGrant},
		{"LossSeenWithinASecond", testLossWithinASecond},
		{"WaiterTimesLeaseOnItsOwnClock", testWaiterClock},
		{"TryOnDeadHolder", testTryOnDeadHolder},
		{"RenewAfterLostAnswer", testRenewAfterLostAnswer},
		{"MarkerThenRenew", testMarkerThenRenew},
		{"RequestsPerPeriod", testRequests},
		{"WrongSecretIsFinal", testWrongSecret},
		{"MissingBucketIsFinal", testMissingBucket},
		{"ForeignObjectRefused", testForeignObject},
	} {
		t.Run(tc.name, func(t *testing.T) { tc.run(t, e) })
	}
}

// env is the shared gateway.
type env struct{ gw *testenv.VersityGW }

var bucketSeq atomic.Int64

// bucket creates a bucket of the test's own.
func (e *env) bucket(t *testing.T) string {
	name := fmt.Sprintf("b%d-%d", time.Now().UnixNano()%1e9, bucketSeq.Add(1))
	e.gw.CreateBucket(t, name)
	return name
}

// open opens a store for bucket at endpoint ("": the gateway's).
func (e *env) open(t *testing.T, bucket, endpoint string) *Store {
	t.Helper()
	if endpoint == "" {
		endpoint = e.gw.URL()
	}
	s, err := Open(Config{Settings: spec.Settings{Bucket: bucket, Region: testenv.S3Region, Endpoint: endpoint, Prefix: "leaderrun/"},
		Credentials: e.gw.Credentials()})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { s.Close() })
	return s
}

func campaign(t *testing.T, s *Store, lock, id string, tm backends.Timings) *backends.Lease {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	l, err := backends.Campaign(ctx, s, lock, backends.Candidate{Identity: id, Timings: tm})
	if err != nil {
		t.Fatalf("%s: campaign: %v", id, err)
	}
	return l
}

func release(t *testing.T, l *backends.Lease, term *backends.Term) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	if err := l.Release(ctx, term); err != nil {
		t.Errorf("release token %d: %v", l.Token(), err)
	}
}

// put writes body to key with the conditions given ("": none), as a
// client of the gateway's own.
func (e *env) put(ctx context.Context, bucket, key, body, ifMatch, ifNoneMatch string) (string, error) {
	in := &s3api.PutObjectInput{Bucket: &bucket, Key: &key, Body: strings.NewReader(body)}
	if ifMatch != "" {
		in.IfMatch = &ifMatch
	}
	if ifNoneMatch != "" {
		in.IfNoneMatch = &ifNoneMatch
	}
	out, err := e.gw.Client().PutObject(ctx, in)
	if err != nil {
		return "", err
	}
	return aws.ToString(out.ETag), nil
}

// precondition reports whether err is a 412 answer.
func precondition(err error) bool {
	st, _ := answered(err)
	return st == http.StatusPreconditionFailed
}

// testServerConditions: the server refuses a stale If-Match with 412, a
// second If-None-Match: * create with 412, an If-Match on a deleted
// object, and lets exactly one of several writers that cross on the same
// condition through. A server that fails this would let two candidates
// hold the lock at once (docs/backends/s3.md).
func testServerConditions(t *testing.T, e *env) {
	b := e.bucket(t)
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	e1, err := e.put(ctx, b, "k", "one", "", "*")
	if err != nil {
		t.Fatalf("create with If-None-Match: *: %v", err)
	}
	if _, err := e.put(ctx, b, "k", "other", "", "*"); !precondition(err) {
		t.Errorf("second create with If-None-Match: *: %v; want 412", err)
	}
	e2, err := e.put(ctx, b, "k", "two", e1, "")
	if err != nil || e2 == e1 {
		t.Fatalf("replace with If-Match on the current ETag: %q, %v; want a new ETag", e2, err)
	}
	if _, err := e.put(ctx, b, "k", "three", e1, ""); !precondition(err) {
		t.Errorf("replace with a stale If-Match: %v; want 412", err)
	}
	e.gw.DeleteObject(t, b, "k")
	if _, err := e.put(ctx, b, "k", "four", e2, ""); !conflict(err) {
		t.Errorf("If-Match on a deleted object: %v; want 412 or 404", err)
	}
	for _, tc := range []struct{ name, ifMatch, ifNoneMatch string }{{"creates", "", "*"}, {"replacements", "?", ""}} {
		key := "race-" + tc.name
		if tc.ifMatch != "" {
			tc.ifMatch, _ = e.put(ctx, b, key, "base", "", "")
		}
		var won atomic.Int32
		var wg sync.WaitGroup
		for i := range 8 {
			wg.Go(func() {
				_, err := e.put(ctx, b, key, fmt.Sprint("writer ", i), tc.ifMatch, tc.ifNoneMatch)
				switch {
				case err == nil:
					won.Add(1)
				case !conflict(err):
					t.Errorf("%s: writer %d: %v", tc.name, i, err)
				}
			})
		}
		wg.Wait()
		if won.Load() != 1 {
			t.Errorf("8 conditional %s that cross: %d went through, want 1", tc.name, won.Load())
		}
	}
}

func testConformance(t *testing.T, e *env) {
	b := e.bucket(t)
	backendtest.Run(t, backendtest.Harness{
		Open:    func(t *testing.T) backends.Store { return e.open(t, b, "") },
		Timings: timings(10*time.Second, testPoll),
		// An operator deletes the lock object.
		Drop: func(t *testing.T, lock string, _ *backends.Lease) { e.gw.DeleteObject(t, b, "leaderrun/"+lock) },
	})
}

// testTokensAcrossDeletesByHand: 300 grants, the lock object deleted by
// hand after each one, and every tenth time the state object instead;
// each grant's token is greater than the one before.
func testTokensAcrossDeletes(t *testing.T, e *env) {
	b := e.bucket(t)
	s := e.open(t, b, "")
	var last uint64
	for i := range 300 {
		l := campaign(t, s, "deleted", "h", timings(10*time.Second, testPoll))
		if l.Token() <= last {
			t.Fatalf("grant %d: token %d, not greater than the previous grant's %d", i, l.Token(), last)
		}
		last = l.Token()
		release(t, l, &backends.Term{Identity: "h", Token: l.Token(), End: backends.EndExited})
		if i%10 == 9 {
			e.gw.DeleteObject(t, b, "leaderrun/deleted"+spec.StateSuffix)
		} else {
			e.gw.DeleteObject(t, b, "leaderrun/deleted")
		}
	}
	t.Logf("300 grants, tokens strictly increasing, last %d", last)
}

// testStaleHolder: the lock object of a holder is deleted by hand and the
// lock granted to another; the old holder's renewal, marker and release
// are refused as a loss and write nothing, and the new token is greater.
func testStaleHolder(t *testing.T, e *env) {
	b := e.bucket(t)
	a, c := e.open(t, b, ""), e.open(t, b, "")
	tm := timings(10*time.Second, 2*time.Second)
	la := campaign(t, a, "stale", "a", tm)
	e.gw.DeleteObject(t, b, "leaderrun/stale")
	lc := campaign(t, c, "stale", "c", tm)
	defer release(t, lc, nil)
	if lc.Token() <= la.Token() {
		t.Fatalf("token after the deletion %d, not greater than the stale holder's %d", lc.Token(), la.Token())
	}
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	if err := la.Renew(ctx); !errors.Is(err, backends.ErrLeaseLost) || !strings.Contains(err.Error(), `taken by "c"`) {
		t.Errorf("the stale holder's renewal: %v; want a loss to c", err)
	}
	now := time.Now()
	if err := la.Complete(ctx, backends.Marker{Key: "k", Identity: "a", Token: la.Token(), At: now, Expires: now.Add(time.Hour)}); !errors.Is(err, backends.ErrLeaseLost) {
		t.Errorf("the stale holder's marker: %v; want a loss", err)
	}
	release(t, la, &backends.Term{Identity: "a", Token: la.Token(), Acquired: now, Ended: now, End: backends.EndLost, ExitCode: -1})
	st, err := backends.ReadStatus(ctx, c, "stale")
	if err != nil || !st.Held || st.Identity != "c" || st.Token != lc.Token() {
		t.Errorf("after the stale holder's release: %+v, %v; want held by c", st, err)
	}
	if m, err := backends.ReadMarker(ctx, c, "stale", "k"); err != nil || m != nil {
		t.Errorf("the stale holder's marker was written: %+v, %v", m, err)
	}
	if terms, err := backends.ReadHistory(ctx, c, "stale", 0); err != nil || len(terms) != 1 || terms[0].Token != la.Token() {
		t.Errorf("history: %+v, %v; want the stale holder's term", terms, err)
	}
}

// testStaleMark: a candidate that read the state object, stalled, and
// writes its mark after another grant raised it gets a conflict, and the
// mark keeps the higher value.
func testStaleMark(t *testing.T, e *env) {
	b := e.bucket(t)
	s := e.open(t, b, "")
	release(t, campaign(t, s, "mark", "a", timings(10*time.Second, testPoll)), nil)
	lk := s.Lock("mark").(*lock)
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	var stale state
	etag, err := s.read(ctx, lk.state, &stale)
	if err != nil || etag == "" {
		t.Fatalf("read the state object: %q, %v", etag, err)
	}
	l := campaign(t, s, "mark", "b", timings(10*time.Second, testPoll))
	defer release(t, l, nil)
	stale.Mark++
	if _, err := s.write(ctx, lk.state, stale, etag); !conflict(err) {
		t.Errorf("a stale candidate's mark: %v; want a conflict", err)
	}
	var st state
	if _, err := s.read(ctx, lk.state, &st); err != nil || st.Mark != l.Token() {
		t.Errorf("the mark after the stale write: %d, %v; want %d", st.Mark, err, l.Token())
	}
}

// testStalledGrant: a candidate that drew its token and stalled before it
// wrote its grant, while another was granted a later token and the lock
// object was then deleted by hand, does not take the lock with its lower
// token: its grant is conditional on an object that the later grant
// replaced, and it draws again.
func testStalledGrant(t *testing.T, e *env) {
	b := e.bucket(t)
	var once sync.Once
	stalled, resume := make(chan struct{}), make(chan struct{})
	url := e.proxy(t, func(r *http.Request, body []byte) {
		if r.Method == http.MethodPut && strings.HasSuffix(r.URL.Path, "/leaderrun/stalled") && bytes.Contains(body, []byte(`"holder":"b"`)) {
			once.Do(func() {
				close(stalled)
				<-resume
			})
		}
	})
	sa, sb := e.open(t, b, ""), e.open(t, b, url)
	tm := timings(10*time.Second, testPoll)
	got := make(chan *backends.Lease, 1)
	go func() {
		l, err := backends.Campaign(context.Background(), sb, "stalled", backends.Candidate{Identity: "b", Timings: tm})
		if err != nil {
			t.Errorf("b: %v", err)
		}
		got <- l
	}()
	<-stalled
	la := campaign(t, sa, "stalled", "a", tm)
	e.gw.DeleteObject(t, b, "leaderrun/stalled")
	close(resume)
	lb := <-got
	if lb == nil {
		return
	}
	defer release(t, lb, nil)
	if lb.Token() <= la.Token() {
		t.Errorf("the stalled candidate holds token %d, not greater than %d, granted before it", lb.Token(), la.Token())
	}
	release(t, la, nil)
}

// testLossWithinASecond: at the default retry period of 2 s, a holder
// whose lock object is deleted, or taken by hand, learns of it within a
// second (S3).
func testLossWithinASecond(t *testing.T, e *env) {
	b := e.bucket(t)
	s := e.open(t, b, "")
	for _, how := range []string{"deleted", "taken"} {
		l := campaign(t, s, "loss", "a", timings(15*time.Second, 2*time.Second))
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		if how == "deleted" {
			e.gw.DeleteObject(t, b, "leaderrun/loss")
		} else if _, err := e.put(ctx, b, "leaderrun/loss", `{"holder":"intruder","token":999,"rvn":"x"}`, "", ""); err != nil {
			t.Fatal(err)
		}
		cancel()
		dropped := time.Now()
		select {
		case <-l.Lost():
			t.Logf("%s: loss seen %v after it", how, time.Since(dropped))
		case <-time.After(time.Second):
			t.Errorf("%s: no loss seen within 1 s", how)
		}
		release(t, l, nil)
	}
}

// testWaiterClock: a holder that renews keeps a waiter out however long it
// holds; once it stops, the waiter takes the lock a whole lease after it
// saw the last renewal, on its own clock, and not before.
func testWaiterClock(t *testing.T, e *env) {
	b := e.bucket(t)
	a, w := e.open(t, b, ""), e.open(t, b, "")
	const leaseD = 1500 * time.Millisecond
	tm := timings(leaseD, testPoll)
	la := campaign(t, a, "clock", "a", tm)
	got := make(chan *backends.Lease, 1)
	go func() {
		l, err := backends.Campaign(context.Background(), w, "clock", backends.Candidate{Identity: "w", Timings: tm})
		if err != nil {
			t.Errorf("waiter: %v", err)
		}
		got <- l
	}()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	var lastAck time.Time
	tick := time.NewTicker(300 * time.Millisecond)
	defer tick.Stop()
	for range 10 { // 3 s, two leases
		<-tick.C
		if err := la.Renew(ctx); err != nil {
			t.Fatalf("renew: %v", err)
		}
		lastAck = time.Now()
		select {
		case l := <-got:
			t.Fatalf("the waiter took the lock (token %d) while its holder renewed", l.Token())
		default:
		}
	}
	var lw *backends.Lease
	select {
	case lw = <-got:
	case <-time.After(leaseD + 5*time.Second):
		t.Fatal("the waiter did not take the lock after its holder stopped renewing")
	}
	if lw == nil {
		return
	}
	defer release(t, lw, nil)
	if took := time.Since(lastAck); took < leaseD {
		t.Errorf("the waiter took the lock %v after the last renewal was acknowledged, less than the lease %v", took, leaseD)
	} else {
		t.Logf("taken over %v after the last acknowledged renewal (lease %v, poll %v)", took, leaseD, testPoll)
	}
	select {
	case <-la.Lost():
	case <-time.After(2 * time.Second):
		t.Error("the old holder's lease does not report the takeover")
	}
	release(t, la, nil)
}

// testTryOnDeadHolder: --try gives up at once while the holder's record
// looks alive; once it looks expired, it watches for a lease on its own
// clock and takes the lock if nothing changed.
func testTryOnDeadHolder(t *testing.T, e *env) {
	b := e.bucket(t)
	a, c := e.open(t, b, ""), e.open(t, b, "")
	const leaseD = time.Second
	tm := timings(leaseD, testPoll)
	campaign(t, a, "dead", "a", tm) // a holder that died: no renewals, no release
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	try := backends.Candidate{Identity: "c", Timings: tm, Try: true}
	start := time.Now()
	if _, err := backends.Campaign(ctx, c, "dead", try); !errors.Is(err, backends.ErrLocked) || time.Since(start) > 500*time.Millisecond {
		t.Fatalf("try while the holder looks alive: %v after %v; want ErrLocked at once", err, time.Since(start))
	}
	time.Sleep(leaseD) // the record's own timestamp now says expired
	start = time.Now()
	l, err := backends.Campaign(ctx, c, "dead", try)
	if err != nil {
		t.Fatalf("try on a holder that looks dead: %v", err)
	}
	defer release(t, l, nil)
	if took := time.Since(start); took < leaseD {
		t.Errorf("try took the lock after %v, before a whole lease (%v) on its own clock", took, leaseD)
	}
}

// testRenewAfterLostAnswer: a renewal whose answer was lost but which went
// through (simulated: the lock object rewritten with the grant's owner and
// token and a new rvn) is still the grant's: the holder sees no loss, and
// its next renewal succeeds.
func testRenewAfterLostAnswer(t *testing.T, e *env) {
	b := e.bucket(t)
	s := e.open(t, b, "")
	l := campaign(t, s, "lost-answer", "a", timings(10*time.Second, 2*time.Second))
	defer release(t, l, nil)
	lk := s.Lock("lost-answer").(*lock)
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	var obj lease
	etag, err := s.read(ctx, lk.key, &obj)
	if err != nil {
		t.Fatal(err)
	}
	obj.RVN = newRVN()
	if _, err := s.write(ctx, lk.key, obj, etag); err != nil {
		t.Fatal(err)
	}
	if err := l.Renew(ctx); err != nil {
		t.Fatalf("renewal after a lost answer: %v", err)
	}
	if err := l.Renew(ctx); err != nil {
		t.Fatalf("the renewal after that: %v", err)
	}
	if err := l.Err(); err != nil {
		t.Fatalf("the holder took its own write for a loss: %v", err)
	}
}

// testMarkerThenRenew: a marker written under the grant, then renewals:
// the renewals keep the marker, and the next leader reads it.
func testMarkerThenRenew(t *testing.T, e *env) {
	b := e.bucket(t)
	s := e.open(t, b, "")
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	l := campaign(t, s, "marker", "a", timings(10*time.Second, 2*time.Second))
	now := time.Now()
	if err := l.Complete(ctx, backends.Marker{Key: "k", Identity: "a", Token: l.Token(), At: now, Expires: now.Add(time.Hour)}); err != nil {
		t.Fatalf("complete: %v", err)
	}
	for range 2 {
		if err := l.Renew(ctx); err != nil {
			t.Fatalf("renew after the marker: %v", err)
		}
	}
	release(t, l, nil)
	l = campaign(t, s, "marker", "b", timings(10*time.Second, 2*time.Second))
	defer release(t, l, nil)
	if m, err := l.Completed(ctx, "k", false); err != nil || m == nil || m.Token != l.Token()-1 {
		t.Errorf("the marker, read by the next leader: %+v, %v", m, err)
	}
}

// proxy is a reverse proxy in front of the gateway that shows every
// request, with its body, to hook before it forwards it; it returns the
// proxy's endpoint.
func (e *env) proxy(t *testing.T, hook func(r *http.Request, body []byte)) string {
	target, _ := url.Parse(e.gw.URL())
	rp := httputil.NewSingleHostReverseProxy(target)
	srv := &http.Server{Handler: http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		body, err := io.ReadAll(r.Body)
		if err != nil {
			http.Error(w, err.Error(), http.StatusBadGateway)
			return
		}
		r.Body = io.NopCloser(bytes.NewReader(body))
		hook(r, body)
		rp.ServeHTTP(w, r)
	})}
	ln := listen(t)
	go func() { _ = srv.Serve(ln) }()
	t.Cleanup(func() { srv.Close() })
	return "http://" + ln.Addr().String()
}

// counter counts the requests a proxy forwards, by method.
type counter struct {
	mu sync.Mutex
	n  map[string]int
}

func (e *env) counted(t *testing.T) (*counter, string) {
	c := &counter{n: map[string]int{}}
	return c, e.proxy(t, func(r *http.Request, _ []byte) {
		c.mu.Lock()
		c.n[r.Method]++
		c.mu.Unlock()
	})
}

func (c *counter) take() map[string]int {
	c.mu.Lock()
	defer c.mu.Unlock()
	n := c.n
	c.n = map[string]int{}
	return n
}

// testRequests: what a lock costs in requests, at the default retry
// period (2 s) for 10 s: a holder PUTs once per period and reads every
// 500 ms; an idle waiter GETs once per period and writes nothing.
func testRequests(t *testing.T, e *env) {
	if testing.Short() {
		t.Skip("20 s")
	}
	b := e.bucket(t)
	hc, hURL := e.counted(t)
	wc, wURL := e.counted(t)
	holder, waiter := e.open(t, b, hURL), e.open(t, b, wURL)
	tm := backends.Timings{LeaseDuration: 15 * time.Second, RenewDeadline: 10 * time.Second, RetryPeriod: 2 * time.Second, KillGrace: 3 * time.Second}
	l := campaign(t, holder, "cost", "holder", tm)
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	go func() {
		_, _ = backends.Campaign(ctx, waiter, "cost", backends.Candidate{Identity: "waiter", Timings: tm})
	}()
	hc.take()
	const periods = 5
	tick := time.NewTicker(tm.RetryPeriod)
	for range periods {
		<-tick.C
		if err := l.Renew(context.Background()); err != nil {
			t.Fatalf("renew: %v", err)
		}
	}
	tick.Stop()
	h, w := hc.take(), wc.take()
	cancel()
	release(t, l, nil)
	t.Logf("in %d retry periods of %v: holder %v, idle waiter %v", periods, tm.RetryPeriod, h, w)
	if h["PUT"] != periods || h["GET"] < 2*periods || h["GET"] > 4*periods+1 {
		t.Errorf("holder: %v; want %d PUTs, and a GET every 500 ms", h, periods)
	}
	if w["PUT"] != 0 || w["GET"] < periods-1 || w["GET"] > periods+2 {
		t.Errorf("idle waiter: %v; want no PUT and one GET per period", w)
	}
}

// testWrongSecret: credentials the server refuses end a campaign that
// would wait for ever, at once: a refusal is final.
func testWrongSecret(t *testing.T, e *env) {
	b := e.bucket(t)
	s, err := Open(Config{Settings: spec.Settings{Bucket: b, Region: testenv.S3Region, Endpoint: e.gw.URL()},
		Credentials: credentials.NewStaticCredentialsProvider(e.gw.AccessKey, "not-"+e.gw.SecretKey, "")})
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	start := time.Now()
	_, err = backends.Campaign(ctx, s, "refused", backends.Candidate{Identity: "a", Timings: timings(10*time.Second, testPoll)})
	if !errors.Is(err, backends.ErrRefused) || time.Since(start) > 5*time.Second {
		t.Fatalf("campaign with a wrong secret: %v after %v; want ErrRefused at once", err, time.Since(start))
	}
	if strings.Contains(err.Error(), e.gw.SecretKey) {
		t.Errorf("the error shows the secret: %v", err)
	}
	t.Logf("as the user sees it: %v", err)
}

// testMissingBucket: a bucket that does not exist is a refusal, for a
// campaign and for status alike; leaderrun never creates one.
func testMissingBucket(t *testing.T, e *env) {
	s := e.open(t, "no-such-bucket", "")
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	if _, err := backends.Campaign(ctx, s, "x", backends.Candidate{Identity: "a", Timings: timings(10*time.Second, testPoll)}); !errors.Is(err, backends.ErrRefused) || !strings.Contains(err.Error(), "NoSuchBucket") {
		t.Errorf("campaign in a missing bucket: %v; want a refusal naming NoSuchBucket", err)
	}
	if _, err := backends.ReadStatus(ctx, s, "x"); !errors.Is(err, backends.ErrRefused) {
		t.Errorf("status in a missing bucket: %v; want a refusal", err)
	}
}

// testForeignObject: an object at the lock's key that is not leaderrun's
// is refused, naming it, rather than taken or overwritten.
func testForeignObject(t *testing.T, e *env) {
	b := e.bucket(t)
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	if _, err := e.put(ctx, b, "leaderrun/foreign", "<html>", "", ""); err != nil {
		t.Fatal(err)
	}
	s := e.open(t, b, "")
	_, err := backends.Campaign(ctx, s, "foreign", backends.Candidate{Identity: "a", Timings: timings(10*time.Second, testPoll)})
	if !errors.Is(err, backends.ErrCorruptState) || !errors.Is(err, backends.ErrRefused) || !strings.Contains(err.Error(), "leaderrun/foreign") {
		t.Errorf("campaign on a foreign object: %v; want a refusal naming it", err)
	}
}
