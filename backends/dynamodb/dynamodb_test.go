package dynamodb

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/aws/aws-sdk-go-v2/aws"
	"github.com/aws/aws-sdk-go-v2/credentials"
	"github.com/aws/aws-sdk-go-v2/service/dynamodb"
	"github.com/aws/aws-sdk-go-v2/service/dynamodb/types"

	"github.com/leaderrun/leaderrun/backends"
	"github.com/leaderrun/leaderrun/backends/backendtest"
	"github.com/leaderrun/leaderrun/backends/dynamodb/spec"
	"github.com/leaderrun/leaderrun/internal/testenv"
)

// testPoll is the retry period of the tests' campaigns, and so the poll
// interval of waiters and holders: the conformance suite wants a loss
// seen, and a release handed over, within a second.
const testPoll = 100 * time.Millisecond

// timings are valid timings around a lease of lease, polling every
// testPoll.
func timings(lease time.Duration) backends.Timings {
	return backends.Timings{LeaseDuration: lease, RenewDeadline: lease / 2, RetryPeriod: testPoll, KillGrace: lease / 4}
}

// TestDynamoDB runs every test of the backend against one emulator; tests
// that need a table of their own name one.
func TestDynamoDB(t *testing.T) {
	e := &env{emu: testenv.StartDynamoDB(t)}
	for _, tc := range []struct {
		name string
		run  func(*testing.T, *env)
	}{
		{"Conformance", testConformance},
		{"TokensAcrossDeletesByHand", testTokensAcrossDeletes},
		{"StaleHolderAfterDeletion", testStaleHolder},
		{"WaiterTimesLeaseOnItsOwnClock", testWaiterClock},
		{"TryOnDeadHolder", testTryOnDeadHolder},
		{"RenewAfterLostAnswer", testRenewAfterLostAnswer},
		{"TableCreatedOnFirstUse", testTableCreated},
		{"TableCreationRefused", testTableCreationRefused},
		{"LeastPrivilege", testLeastPrivilege},
		{"RefusedRead", testRefusedRead},
		{"StatusAndHistoryWithoutTable", testNoTable},
	} {
		t.Run(tc.name, func(t *testing.T) { tc.run(t, e) })
	}
}

// env is the shared emulator.
type env struct {
	emu *testenv.DynamoDB
}

var tableSeq atomic.Int64

// table is a table name of the test's own.
func table(t *testing.T) string {
	return fmt.Sprintf("t%d_%d", time.Now().UnixNano()%1e9, tableSeq.Add(1))
}

// config is the configuration of a backend for lock in table, with
// credentials of access key id akid (see internal/testenv/ddbemu).
func (e *env) config(table, akid string) Config {
	return Config{
		Settings:    spec.Settings{Table: table, Region: testenv.DynamoDBRegion, Endpoint: e.emu.URL, Prefix: "leaderrun/"},
		Credentials: e.emu.Credentials(akid),
	}
}

// candidate is a candidate for one lock, through a store of its own.
type candidate struct {
	s    *Store
	lock string
	key  string // the lock item's name
}

func (e *env) backend(t *testing.T, table, lock, akid string) *candidate {
	t.Helper()
	s, err := Open(e.config(table, akid))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { s.Close() })
	return &candidate{s: s, lock: lock, key: "leaderrun/" + lock}
}

type options struct {
	id    string
	lease time.Duration
	try   bool
}

func (c *candidate) Campaign(ctx context.Context, o options) (*backends.Lease, error) {
	return backends.Campaign(ctx, c.s, c.lock, backends.Candidate{Identity: o.id, Try: o.try, Timings: timings(o.lease)})
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

func campaign(t *testing.T, b *candidate, o options) *backends.Lease {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	l, err := b.Campaign(ctx, o)
	if err != nil {
		t.Fatalf("%s: campaign: %v", o.id, err)
	}
	return l
}

func release(t *testing.T, l *backends.Lease) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	if err := l.Release(ctx, nil); err != nil {
		t.Errorf("release token %d: %v", l.Token(), err)
	}
}

func testConformance(t *testing.T, e *env) {
	tbl := table(t)
	backendtest.Run(t, backendtest.Harness{
		Open: func(t *testing.T) backends.Store {
			s, err := Open(e.config(tbl, "admin"))
			if err != nil {
				t.Fatal(err)
			}
			return s
		},
		Timings: timings(10 * time.Second),
		// An operator deletes the lock item.
		Drop: func(t *testing.T, lock string, _ *backends.Lease) { e.emu.DeleteItem(t, tbl, "leaderrun/"+lock) },
	})
}

// testTokensAcrossDeletesByHand: 500 grants, the lock item deleted by
// hand after each one, and every tenth time the counter instead; each
// grant's token is greater than the one before.
func testTokensAcrossDeletes(t *testing.T, e *env) {
	tbl := table(t)
	b := e.backend(t, tbl, "deleted", "admin")
	var last uint64
	for i := range 500 {
		l := campaign(t, b, options{id: "h", lease: 10 * time.Second})
		if l.Token() <= last {
			t.Fatalf("grant %d: token %d, not greater than the previous grant's %d", i, l.Token(), last)
		}
		last = l.Token()
		release(t, l)
		if i%10 == 9 {
			e.emu.DeleteItem(t, tbl, b.key+suffixCounter)
		} else {
			e.emu.DeleteItem(t, tbl, b.key)
		}
		if e.emu.Item(t, tbl, b.key) != nil && i%10 != 9 {
			t.Fatalf("grant %d: the lock item survived its deletion", i)
		}
	}
	t.Logf("500 grants, tokens strictly increasing, last %d", last)
}

// testStaleHolder: the lock item of a holder is deleted by hand and the
// lock granted to another; the old holder's renewal, marker and release
// are refused as a loss and write nothing, and the new token is greater.
func testStaleHolder(t *testing.T, e *env) {
	tbl := table(t)
	a, c := e.backend(t, tbl, "stale", "admin"), e.backend(t, tbl, "stale", "admin")
	la := campaign(t, a, options{id: "a", lease: 10 * time.Second})
	e.emu.DeleteItem(t, tbl, a.key)
	lc := campaign(t, c, options{id: "c", lease: 10 * time.Second})
	defer release(t, lc)
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
	term := backends.Term{Identity: "a", Token: la.Token(), Acquired: now, Ended: now, End: backends.EndLost, ExitCode: -1}
	if err := la.Release(ctx, &term); err != nil {
		t.Errorf("the stale holder's release: %v", err)
	}
	st, err := c.Status(ctx)
	if err != nil || !st.Held || st.Identity != "c" || st.Token != lc.Token() {
		t.Errorf("after the stale holder's release: %+v, %v; want held by c", st, err)
	}
	if m, err := c.Completed(ctx, "k"); err != nil || m != nil {
		t.Errorf("the stale holder's marker was written: %+v, %v", m, err)
	}
	terms, err := c.History(ctx)
	if err != nil || len(terms) != 1 || terms[0].Token != la.Token() {
		t.Errorf("history: %+v, %v; want the stale holder's term", terms, err)
	}
}

// testWaiterClock: a holder that renews keeps a waiter out however long
// it holds; once it stops, the waiter takes the lock a whole lease after
// it saw the last renewal, on its own clock, and not before.
func testWaiterClock(t *testing.T, e *env) {
	tbl := table(t)
	a, w := e.backend(t, tbl, "clock", "admin"), e.backend(t, tbl, "clock", "admin")
	const leaseD = 1500 * time.Millisecond
	la := campaign(t, a, options{id: "a", lease: leaseD})
	got := make(chan *backends.Lease, 1)
	go func() {
		l, err := w.Campaign(context.Background(), options{id: "w", lease: leaseD})
		if err != nil {
			t.Errorf("waiter: %v", err)
		}
		got <- l
	}()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	var lastAck time.Time
	for range 10 { // 3 s, two leases: renewed every 300 ms
		time.Sleep(300 * time.Millisecond)
		if err := la.Renew(ctx); err != nil {
			t.Fatalf("renew: %v", err)
		}
		lastAck = time.Now()
		select {
		case l := <-got:
			t.Fatalf("the waiter took the lock (token %v) while its holder renewed", l)
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
	defer release(t, lw)
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
	release(t, la)
}

// testTryOnDeadHolder: --try gives up at once while the holder's record
// looks alive; once it looks expired, it watches for a lease on its own
// clock and takes the lock if nothing changed.
func testTryOnDeadHolder(t *testing.T, e *env) {
	tbl := table(t)
	a, b := e.backend(t, tbl, "dead", "admin"), e.backend(t, tbl, "dead", "admin")
	const leaseD = time.Second
	campaign(t, a, options{id: "a", lease: leaseD}) // a holder that died: no renewals, no release
	try := options{id: "b", lease: leaseD, try: true}
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	start := time.Now()
	if _, err := b.Campaign(ctx, try); !errors.Is(err, backends.ErrLocked) || time.Since(start) > 500*time.Millisecond {
		t.Fatalf("try while the holder looks alive: %v after %v; want ErrLocked at once", err, time.Since(start))
	}
	time.Sleep(leaseD) // the record's own timestamp now says expired
	start = time.Now()
	l, err := b.Campaign(ctx, try)
	if err != nil {
		t.Fatalf("try on a holder that looks dead: %v", err)
	}
	defer release(t, l)
	if took := time.Since(start); took < leaseD {
		t.Errorf("try took the lock after %v, before a whole lease (%v) on its own clock", took, leaseD)
	}
}

// testRenewAfterLostAnswer: a renewal whose answer was lost but which
// went through (simulated: another rvn in the item, the grant's owner and
// token unchanged) is still the grant's: the holder sees no loss, and its
// next renewal succeeds.
func testRenewAfterLostAnswer(t *testing.T, e *env) {
	tbl := table(t)
	b := e.backend(t, tbl, "lost-answer", "admin")
	l := campaign(t, b, options{id: "a", lease: 10 * time.Second})
	defer release(t, l)
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	_, err := e.emu.Client().UpdateItem(ctx, &dynamodb.UpdateItemInput{
		TableName: aws.String(tbl), Key: key(b.key), UpdateExpression: aws.String("SET #r = :r"),
		ExpressionAttributeNames: map[string]string{"#r": attrRVN}, ExpressionAttributeValues: map[string]types.AttributeValue{":r": str(newRVN())},
	})
	if err != nil {
		t.Fatal(err)
	}
	if err := l.Renew(ctx); err != nil {
		t.Fatalf("renewal after a lost answer: %v", err)
	}
	if err := l.Err(); err != nil {
		t.Fatalf("the holder took its own write for a loss: %v", err)
	}
	if st, err := b.Status(ctx); err != nil || !st.Held || st.Token != l.Token() {
		t.Errorf("status: %+v, %v; want still held with token %d", st, err, l.Token())
	}
}

// testTableCreated: the first campaign creates a missing table.
func testTableCreated(t *testing.T, e *env) {
	tbl := table(t)
	b := e.backend(t, tbl, "created", "admin")
	l := campaign(t, b, options{id: "a", lease: 10 * time.Second})
	release(t, l)
	if e.emu.Item(t, tbl, b.key) == nil {
		t.Error("no lock item in the table created on first use")
	}
}

// testTableCreationRefused: credentials that may not create the missing
// table get an error that names the action, at once.
func testTableCreationRefused(t *testing.T, e *env) {
	b := e.backend(t, table(t), "refused", "deny.CreateTable")
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	_, err := b.Campaign(ctx, options{id: "a", lease: 10 * time.Second})
	if !errors.Is(err, backends.ErrUnavailable) || !strings.Contains(err.Error(), "dynamodb:CreateTable") {
		t.Fatalf("campaign with a missing table that may not be created: %v; want ErrUnavailable naming dynamodb:CreateTable", err)
	}
	t.Logf("as the user sees it: %v", err)
}

// testLeastPrivilege: GetItem, UpdateItem and ConditionCheckItem on an
// existing table are all that campaigning, renewing, markers, release,
// history and status need (the emulator refuses every other action).
func testLeastPrivilege(t *testing.T, e *env) {
	tbl := table(t)
	l := campaign(t, e.backend(t, tbl, "least", "admin"), options{id: "creator", lease: 10 * time.Second})
	release(t, l)
	const akid = "allow.GetItem.UpdateItem.ConditionCheckItem"
	a, b := e.backend(t, tbl, "least", akid), e.backend(t, tbl, "least", akid)
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	la := campaign(t, a, options{id: "a", lease: 10 * time.Second})
	if err := la.Renew(ctx); err != nil {
		t.Fatalf("renew: %v", err)
	}
	now := time.Now()
	if err := la.Complete(ctx, backends.Marker{Key: "k", Identity: "a", Token: la.Token(), At: now, Expires: now.Add(time.Hour)}); err != nil {
		t.Fatalf("complete: %v", err)
	}
	if m, err := la.Completed(ctx, "k", false); err != nil || m == nil {
		t.Fatalf("completed: %+v, %v", m, err)
	}
	if st, err := b.Status(ctx); err != nil || !st.Held {
		t.Fatalf("status: %+v, %v", st, err)
	}
	term := backends.Term{Identity: "a", Token: la.Token(), Acquired: now, Ended: now, End: backends.EndExited}
	if err := la.Release(ctx, &term); err != nil {
		t.Fatalf("release: %v", err)
	}
	if terms, err := b.History(ctx); err != nil || len(terms) != 1 {
		t.Fatalf("history: %+v, %v", terms, err)
	}
	release(t, campaign(t, b, options{id: "b", lease: 10 * time.Second}))
}

// testRefusedRead: credentials that may not read the item are refused at
// once, with DynamoDB's message naming the action.
func testRefusedRead(t *testing.T, e *env) {
	tbl := table(t)
	release(t, campaign(t, e.backend(t, tbl, "noread", "admin"), options{id: "creator", lease: 10 * time.Second}))
	b := e.backend(t, tbl, "noread", "deny.GetItem")
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	_, err := b.Campaign(ctx, options{id: "a", lease: 10 * time.Second})
	if !errors.Is(err, backends.ErrUnavailable) || !strings.Contains(err.Error(), "dynamodb:GetItem") {
		t.Fatalf("campaign without GetItem: %v; want ErrUnavailable naming dynamodb:GetItem", err)
	}
}

// testNoTable: a table that does not exist holds no lock and has no
// history; status and history do not create it.
func testNoTable(t *testing.T, e *env) {
	tbl := table(t)
	b := e.backend(t, tbl, "none", "admin")
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	if st, err := b.Status(ctx); err != nil || st.Held {
		t.Errorf("status without a table: %+v, %v", st, err)
	}
	if terms, err := b.History(ctx); err != nil || len(terms) != 0 {
		t.Errorf("history without a table: %+v, %v", terms, err)
	}
	_, err := e.emu.Client().DescribeTable(ctx, &dynamodb.DescribeTableInput{TableName: aws.String(tbl)})
	if !isNotFound(err) {
		t.Errorf("status or history created the table: %v", err)
	}
}

// TestAnswerBounded: an endpoint that answers more than maxAnswerBytes,
// with or without a Content-Length, gets an error, not our memory.
func TestAnswerBounded(t *testing.T) {
	for _, tc := range []struct {
		name   string
		length bool
	}{{"with Content-Length", true}, {"chunked", false}} {
		t.Run(tc.name, func(t *testing.T) {
			srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
				body := `{"Item":{"name":{"S":"` + strings.Repeat("x", 4<<20) + `"}}}`
				if tc.length {
					w.Header().Set("Content-Length", fmt.Sprint(len(body)))
				}
				w.Header().Set("Content-Type", "application/x-amz-json-1.0")
				_, _ = io.WriteString(w, body)
			}))
			defer srv.Close()
			s, err := Open(Config{Settings: spec.Settings{Region: testenv.DynamoDBRegion, Endpoint: srv.URL},
				Credentials: credentials.NewStaticCredentialsProvider("a", "b", "")})
			if err != nil {
				t.Fatal(err)
			}
			defer s.Close()
			ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
			defer cancel()
			_, err = backends.ReadStatus(ctx, s, "big")
			if !errors.Is(err, errAnswerTooLarge) {
				t.Fatalf("status from a server that answers 4 MiB: %v; want errAnswerTooLarge", err)
			}
		})
	}
}

// TestValidate: names that DynamoDB or the items' layout refuse.
func TestValidate(t *testing.T) {
	for _, tc := range []struct {
		name       string
		cfg        spec.Settings
		wantErrSub string
	}{
		{"prefix with #", spec.Settings{Prefix: "x#y"}, "prefix"},
		{"short table", spec.Settings{Table: "ab"}, "table name"},
		{"table with a slash", spec.Settings{Table: "a/b"}, "table name"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			tc.cfg.Region = testenv.DynamoDBRegion
			_, err := Open(Config{Settings: tc.cfg})
			if err == nil || !strings.Contains(err.Error(), tc.wantErrSub) {
				t.Errorf("Open(%+v): %v; want an error about %s", tc.cfg, err, tc.wantErrSub)
			}
		})
	}
}
