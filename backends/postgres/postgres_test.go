package postgres_test

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/leaderrun/leaderrun/backends"
	"github.com/leaderrun/leaderrun/backends/backendtest"
	"github.com/leaderrun/leaderrun/backends/postgres"
	"github.com/leaderrun/leaderrun/internal/testenv"
)

// pgLease is what the tests need of the backend's lease beyond
// backends.Lease.
type pgLease interface {
	backends.Lease
	Key() string
}

// TestPostgres runs every test of the backend against one real cluster:
// initdb costs about 2 s. Tests that change a whole table use a table of
// their own.
func TestPostgres(t *testing.T) {
	pg := testenv.StartPostgres(t)
	admin, err := pgxpool.New(context.Background(), pg.SuperuserURL())
	if err != nil {
		t.Fatal(err)
	}
	defer admin.Close()
	store := &env{pg: pg, admin: admin}
	for _, tc := range []struct {
		name string
		run  func(*testing.T, *env)
	}{
		{"Conformance", testConformance},
		{"ConformanceThroughPgBouncer", testPgBouncer},
		{"PgBouncerSessionMode", testPgBouncerSession},
		{"TokensAcrossDeletesByHand", testTokensAcrossDeletes},
		{"LossByHand", testLossByHand},
		{"ExpiryByDatabaseClock", testExpiry},
		{"StatusFromDatabaseClock", testStatus},
		{"Refused", testRefused},
		{"NoCreatePrivilege", testNoCreatePrivilege},
		{"LimitedRoleOnExistingTables", testLimitedRole},
		{"TryIsFast", testTryIsFast},
		{"LibpqEnvironment", testLibpqEnvironment},
		{"ClientCertificate", testClientCertificate},
		{"QuotedSchemaQualifiedTable", testQuotedTable},
		{"TableDroppedWhileWaiting", testTableDropped},
		{"StalledLink", testStalledLink},
		{"StatementRate", testStatementRate},
		{"ServerRestart", testServerRestart},
	} {
		t.Run(tc.name, func(t *testing.T) { tc.run(t, store) })
	}
}

// env is the shared cluster, and a superuser pool that plays the operator.
type env struct {
	pg    *testenv.Postgres
	admin *pgxpool.Pool
}

// exec runs sql as the superuser.
func (e *env) exec(t *testing.T, sql string, args ...any) int64 {
	t.Helper()
	tag, err := e.admin.Exec(context.Background(), sql, args...)
	if err != nil {
		t.Fatalf("%s: %v", sql, err)
	}
	return tag.RowsAffected()
}

const prefix = "leaderrun-test/"

// newBackend returns a backend for lock; cfg.URL defaults to the
// superuser's, cfg.Prefix to prefix.
func newBackend(t *testing.T, e *env, lock string, cfg postgres.Config) *postgres.Backend {
	t.Helper()
	cfg.Lock = lock
	if cfg.URL == "" {
		cfg.URL = e.pg.SuperuserURL()
	}
	if cfg.Prefix == "" {
		cfg.Prefix = prefix
	}
	b, err := postgres.New(cfg)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { b.Close() })
	return b
}

func options(id string, lease time.Duration) backends.CampaignOptions {
	return backends.CampaignOptions{Identity: id, LeaseDuration: lease}
}

func campaign(t *testing.T, b *postgres.Backend, id string, lease time.Duration) pgLease {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	l, err := b.Campaign(ctx, options(id, lease))
	if err != nil {
		t.Fatalf("%s: campaign: %v", id, err)
	}
	t.Cleanup(func() { l.Release(context.Background(), nil) })
	return l.(pgLease)
}

// waitLost waits up to 1 s for l to report its loss and returns how long
// that took from since.
func waitLost(t *testing.T, l backends.Lease, since time.Time, what string) time.Duration {
	t.Helper()
	select {
	case <-l.Lost():
		d := time.Since(since)
		t.Logf("%s: loss reported %v later", what, d)
		return d
	case <-time.After(time.Second):
		t.Fatalf("%s: Lost() not closed within 1s", what)
		return 0
	}
}

// logBuffer collects a backend's log lines.
type logBuffer struct {
	mu  sync.Mutex
	buf bytes.Buffer
}

func (b *logBuffer) Write(p []byte) (int, error) {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.buf.Write(p)
}

func (b *logBuffer) String() string {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.buf.String()
}

func (b *logBuffer) logger() *slog.Logger {
	return slog.New(slog.NewTextHandler(b, &slog.HandlerOptions{Level: slog.LevelDebug}))
}

// testConformance: the suite, on a direct connection, where notifications
// work. Drop deletes the row, as an operator would.
func testConformance(t *testing.T, e *env) {
	var logs logBuffer
	backendtest.Run(t, backendtest.Harness{
		New: func(t *testing.T, lock string) backends.Backend {
			return newBackend(t, e, lock, postgres.Config{Log: logs.logger()})
		},
		Drop: func(t *testing.T, l backends.Lease) {
			if n := e.exec(t, "DELETE FROM leaderrun_leases WHERE name = $1", l.(pgLease).Key()); n != 1 {
				t.Fatalf("deleted %d rows, want 1", n)
			}
		},
		LeaseDuration: 5 * time.Second,
	})
	if !strings.Contains(logs.String(), "mode=notify") || strings.Contains(logs.String(), "mode=poll") {
		t.Errorf("a direct connection should use notifications; the log says:\n%s", logs.String())
	}
}

// testPgBouncer: the suite through PgBouncer in transaction mode, where a
// notification reaches nobody: the backend must see that, say so, and
// poll. Loss is then seen by the next renewal, so Drop deletes the row and
// then renews as the runner would at its next retry period.
func testPgBouncer(t *testing.T, e *env) {
	bouncer := testenv.StartPgBouncer(t, e.pg, "transaction", map[string]string{testenv.PostgresSuperuser: e.pg.Password})
	var logs logBuffer
	url := bouncer.URL(testenv.PostgresSuperuser, e.pg.Password)
	backendtest.Run(t, backendtest.Harness{
		New: func(t *testing.T, lock string) backends.Backend {
			return newBackend(t, e, lock, postgres.Config{URL: url, Table: "bouncer_leases",
				PollInterval: 100 * time.Millisecond, Log: logs.logger()})
		},
		Drop: func(t *testing.T, l backends.Lease) {
			if n := e.exec(t, "DELETE FROM bouncer_leases WHERE name = $1", l.(pgLease).Key()); n != 1 {
				t.Fatalf("deleted %d rows, want 1", n)
			}
			ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
			defer cancel()
			if err := l.Renew(ctx); !errors.Is(err, backends.ErrLeaseLost) {
				t.Errorf("renewal after the row was deleted, through PgBouncer: %v, want ErrLeaseLost", err)
			}
		},
		LeaseDuration: 5 * time.Second,
		Handovers:     30,
	})
	// Each backend's listener needs a while to conclude that its probe
	// will not arrive; one that holds a lock long enough says so.
	var modeLog logBuffer
	b := newBackend(t, e, "bouncer-mode", postgres.Config{URL: url, Table: "bouncer_leases", Log: modeLog.logger()})
	campaign(t, b, "a", 5*time.Second)
	backendtest.WaitFor(t, "the backend to log its mode", func() bool { return strings.Contains(modeLog.String(), "mode=") })
	if !strings.Contains(modeLog.String(), "mode=poll") || strings.Contains(logs.String()+modeLog.String(), "mode=notify") {
		t.Errorf("through PgBouncer in transaction mode the backend should poll; the log says:\n%s", modeLog.String()+logs.String())
	}
	t.Logf("log: %s", modeLog.String())
}

// testTokensAcrossDeletesByHand: three contenders hand the lock over 20
// times; every third leader's row is deleted by hand (the whole table, as
// an operator would) before it releases. No two ever hold it at once and
// every token is greater than the one before, deletes notwithstanding.
func testTokensAcrossDeletes(t *testing.T, e *env) {
	const (
		contenders = 3
		handovers  = 20
	)
	lock := "tokens-across-deletes"
	var (
		holders atomic.Int32
		mu      sync.Mutex
		tokens  []uint64
		deletes int
		wg      sync.WaitGroup
		errs    = make(chan error, contenders)
	)
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	for i := range contenders {
		b := newBackend(t, e, lock, postgres.Config{})
		wg.Add(1)
		go func() {
			defer wg.Done()
			id := fmt.Sprintf("contender-%d", i)
			for {
				l, err := b.Campaign(ctx, options(id, 5*time.Second))
				if err != nil {
					errs <- fmt.Errorf("%s: campaign: %w", id, err)
					return
				}
				if n := holders.Add(1); n != 1 {
					errs <- fmt.Errorf("%s: %d holders at once (token %d)", id, n, l.Token())
				}
				mu.Lock()
				tokens = append(tokens, l.Token())
				n := len(tokens)
				mu.Unlock()
				time.Sleep(2 * time.Millisecond) // let the others queue up
				holders.Add(-1)
				if n%3 == 0 {
					if _, err := e.admin.Exec(ctx, "DELETE FROM leaderrun_leases"); err != nil {
						errs <- err
					}
					mu.Lock()
					deletes++
					mu.Unlock()
				}
				rctx, rcancel := context.WithTimeout(context.Background(), 5*time.Second)
				err = l.Release(rctx, nil)
				rcancel()
				if err != nil {
					errs <- fmt.Errorf("%s: release: %w", id, err)
					return
				}
				if n >= handovers {
					return
				}
			}
		}()
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		t.Error(err)
	}
	if len(tokens) < handovers {
		t.Fatalf("only %d grants", len(tokens))
	}
	for i := 1; i < len(tokens); i++ {
		if tokens[i] <= tokens[i-1] {
			t.Fatalf("grant %d has token %d, not greater than the previous grant's %d (all: %v)", i, tokens[i], tokens[i-1], tokens)
		}
	}
	t.Logf("%d grants, %d tables emptied by hand, tokens %v", len(tokens), deletes, tokens)
}

// testLossByHand: whatever an operator does to the leader's row that ends
// its lease is a loss reported within 1 s (notifications: milliseconds),
// and the next renewal agrees.
func testLossByHand(t *testing.T, e *env) {
	const table = "loss_leases"
	for _, tc := range []struct {
		name string
		sql  string // $1 is the row's name
		want string // in Err()
	}{
		{"delete the row", "DELETE FROM loss_leases WHERE name = $1", "deleted"},
		{"delete every row", "DELETE FROM loss_leases WHERE $1 <> ''", "deleted"},
		{"truncate the table", "TRUNCATE loss_leases", "deleted"},
		{"give it to another holder", "UPDATE loss_leases SET holder = 'intruder' WHERE name = $1", `held by "intruder"`},
		{"grant it anew", "UPDATE loss_leases SET holder = 'intruder', token = nextval('loss_leases_token_seq') WHERE name = $1",
			`held by "intruder"`},
		{"free it", "UPDATE loss_leases SET holder = '' WHERE name = $1", "freed"},
		{"expire it", "UPDATE loss_leases SET expires = now() - interval '1 second' WHERE name = $1", "expired"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			b := newBackend(t, e, "loss-"+strings.ReplaceAll(tc.name, " ", "-"), postgres.Config{Table: table})
			l := campaign(t, b, "leader", 10*time.Second)
			if strings.HasPrefix(tc.sql, "TRUNCATE") {
				e.exec(t, tc.sql)
			} else {
				e.exec(t, tc.sql, l.Key())
			}
			d := waitLost(t, l, time.Now(), tc.name)
			if d > 100*time.Millisecond {
				t.Logf("loss took %v, over the 100 ms aim (a busy machine?)", d)
			}
			if err := l.Err(); !errors.Is(err, backends.ErrLeaseLost) || !strings.Contains(err.Error(), tc.want) {
				t.Errorf("Err() = %v, want ErrLeaseLost saying %q", err, tc.want)
			}
			ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
			defer cancel()
			if err := l.Renew(ctx); !errors.Is(err, backends.ErrLeaseLost) {
				t.Errorf("Renew after the loss = %v, want ErrLeaseLost", err)
			}
		})
	}
}

// testExpiry: a leader that stops renewing loses the lock to a waiting
// follower when its lease expires by the database's clock, and not
// before; moving expires in the table is what counts, not the hosts'
// clocks.
func testExpiry(t *testing.T, e *env) {
	const lease = 1500 * time.Millisecond
	lock := "expiry"
	leader := campaign(t, newBackend(t, e, lock, postgres.Config{}), "leader", lease)
	renewed := time.Now()
	if err := leader.Renew(context.Background()); err != nil {
		t.Fatal(err)
	}
	got := make(chan backends.Lease, 1)
	go func() {
		l, err := newBackend(t, e, lock, postgres.Config{}).Campaign(context.Background(), options("follower", lease))
		if err != nil {
			t.Errorf("follower: %v", err)
		}
		got <- l
	}()
	var follower backends.Lease
	select {
	case follower = <-got:
	case <-time.After(10 * time.Second):
		t.Fatal("follower did not take over within 10s")
	}
	if follower == nil {
		return
	}
	defer follower.Release(context.Background(), nil)
	took := time.Since(renewed)
	t.Logf("follower took over %v after the leader's last renewal was sent (lease %v)", took, lease)
	if took < lease-50*time.Millisecond || took > lease+500*time.Millisecond {
		t.Errorf("takeover %v after the last renewal, want about the lease, %v", took, lease)
	}
	if follower.Token() <= leader.Token() {
		t.Errorf("follower's token %d not greater than the leader's %d", follower.Token(), leader.Token())
	}
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	if err := leader.Renew(ctx); !errors.Is(err, backends.ErrLeaseLost) {
		t.Errorf("the expired leader's renewal = %v, want ErrLeaseLost", err)
	}

	// The database's expires column is the truth: an expiry an hour away,
	// set by hand, keeps a waiter out for as long as it stands (a renewal
	// would overwrite it); moved into the past, the waiter takes over at
	// once, woken by the notification.
	lock2 := "expiry-by-hand"
	holder := campaign(t, newBackend(t, e, lock2, postgres.Config{}), "holder", lease)
	e.exec(t, "UPDATE leaderrun_leases SET expires = now() + interval '1 hour' WHERE name = $1", holder.Key())
	got = make(chan backends.Lease, 1)
	wctx, wcancel := context.WithCancel(context.Background())
	defer wcancel()
	go func() {
		l, _ := newBackend(t, e, lock2, postgres.Config{}).Campaign(wctx, options("waiter", lease))
		got <- l
	}()
	select {
	case l := <-got:
		t.Fatalf("waiter took over an hour before the row's expiry (lease %v)", l)
	case <-time.After(2 * lease):
	}
	e.exec(t, "UPDATE leaderrun_leases SET expires = now() - interval '1 second' WHERE name = $1", holder.Key())
	moved := time.Now()
	select {
	case l := <-got:
		if l == nil {
			t.Fatal("waiter failed")
		}
		t.Logf("waiter took over %v after expires was moved into the past", time.Since(moved))
		l.Release(context.Background(), nil)
	case <-time.After(time.Second):
		t.Fatal("waiter did not take over within 1s of the row's expiry being moved into the past")
	}
}

// testStatus: Status reads the holder, token, TTL and time left from the
// database, and says nothing of the password.
func testStatus(t *testing.T, e *env) {
	b := newBackend(t, e, "status", postgres.Config{})
	l := campaign(t, b, "holder-1", 7*time.Second)
	st, err := b.Status(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	if !st.Held || st.Identity != "holder-1" || st.Token != l.Token() || st.TTL != 7*time.Second ||
		st.Remaining <= 6*time.Second || st.Remaining > 7*time.Second || st.Waiting != -1 || st.Key != l.Key() {
		t.Errorf("status = %+v, want held by holder-1, token %d, TTL 7s, 6-7s left, waiting -1", st, l.Token())
	}
	js, _ := json.Marshal(st)
	if strings.Contains(string(js), e.pg.Password) || strings.Contains(fmt.Sprintf("%+v", st), e.pg.Password) {
		t.Errorf("status shows the password: %s", js)
	}
	e.exec(t, "UPDATE leaderrun_leases SET expires = now() + interval '1 hour' WHERE name = $1", l.Key())
	if st, err = b.Status(context.Background()); err != nil || st.Remaining < 59*time.Minute {
		t.Errorf("after moving expires an hour ahead in the table, status = %+v, %v", st, err)
	}
	e.exec(t, "UPDATE leaderrun_leases SET expires = now() - interval '1 second' WHERE name = $1", l.Key())
	if st, err = b.Status(context.Background()); err != nil || st.Held {
		t.Errorf("after expiring the row in the table, status = %+v, %v; want not held", st, err)
	}
}

// testRefused: a server that refuses us or cannot be reached is
// ErrUnavailable at once, in every mode, naming host and port and never
// the password.
func testRefused(t *testing.T, e *env) {
	const secret = "s3cret-Pa55word"
	closedPort := testenv.FreePort(t, "127.0.0.1")
	// A proxy whose link is stalled: connections are accepted, never
	// answered; only the connect timeout ends the attempt.
	stalled := testenv.NewProxy(t, e.pg.Addr())
	stalled.Stall()
	for _, tc := range []struct {
		name string
		url  string
		addr string
	}{
		{"wrong password", e.pg.URL(testenv.PostgresSuperuser, secret), e.pg.Addr()},
		{"no such role", e.pg.URL("nobody", secret), e.pg.Addr()},
		{"nothing listening", fmt.Sprintf("postgres://postgres:%s@127.0.0.1:%d/postgres?sslmode=disable", secret, closedPort),
			fmt.Sprintf("127.0.0.1:%d", closedPort)},
		{"no answer", fmt.Sprintf("postgres://postgres:%s@%s/postgres?sslmode=disable", secret, stalled.Addr()), stalled.Addr()},
	} {
		for _, mode := range []string{"try", "wait"} {
			t.Run(tc.name+"/"+mode, func(t *testing.T) {
				b := newBackend(t, e, "refused", postgres.Config{URL: tc.url, ConnectTimeout: 500 * time.Millisecond})
				ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
				defer cancel()
				start := time.Now()
				opts := options("a", 5*time.Second)
				opts.Try = mode == "try"
				l, err := b.Campaign(ctx, opts)
				took := time.Since(start)
				if l != nil {
					l.Release(ctx, nil)
				}
				if !errors.Is(err, backends.ErrUnavailable) {
					t.Fatalf("campaign = %v, want ErrUnavailable", err)
				}
				if !strings.Contains(err.Error(), tc.addr) || strings.Contains(err.Error(), secret) {
					t.Errorf("error %q should name %s and not show the password", err, tc.addr)
				}
				if took > 3*time.Second {
					t.Errorf("campaign took %v to give up, want about the connect timeout at most", took)
				}
				t.Logf("%v after %v", err, took)
				_, err = b.Status(ctx)
				if !errors.Is(err, backends.ErrUnavailable) || !strings.Contains(err.Error(), tc.addr) ||
					strings.Contains(err.Error(), secret) {
					t.Errorf("status = %v, want ErrUnavailable naming %s, without the password", err, tc.addr)
				}
				_, err = b.History(ctx, 0)
				if !errors.Is(err, backends.ErrUnavailable) || !strings.Contains(err.Error(), tc.addr) ||
					strings.Contains(err.Error(), secret) {
					t.Errorf("history = %v, want ErrUnavailable naming %s, without the password", err, tc.addr)
				}
			})
		}
	}
}

// testNoCreatePrivilege: a role that may not create tables, on a table
// that does not exist, is refused with an error naming the table and the
// privilege it lacks.
func testNoCreatePrivilege(t *testing.T, e *env) {
	e.pg.CreateRole(t, "no_create", "no-create-pw", testenv.RoleOptions{})
	b := newBackend(t, e, "no-create", postgres.Config{URL: e.pg.URL("no_create", "no-create-pw"), Table: "missing_leases"})
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	_, err := b.Campaign(ctx, options("a", 5*time.Second))
	if !errors.Is(err, backends.ErrUnavailable) {
		t.Fatalf("campaign = %v, want ErrUnavailable", err)
	}
	for _, want := range []string{"missing_leases", "CREATE", `schema "public"`, `"no_create"`, e.pg.Addr()} {
		if !strings.Contains(err.Error(), want) {
			t.Errorf("error %q does not say %s", err, want)
		}
	}
	if strings.Contains(err.Error(), "no-create-pw") {
		t.Errorf("error shows the password: %v", err)
	}
}

// testLimitedRole: the privileges the package doc lists are enough for a
// role that did not create the tables, and since their owner installed the
// triggers, that role is notified of a loss too.
func testLimitedRole(t *testing.T, e *env) {
	const table = "shared_leases"
	owner := newBackend(t, e, "limited", postgres.Config{Table: table})
	campaign(t, owner, "owner", 5*time.Second).Release(context.Background(), nil)
	e.pg.CreateRole(t, "app", "app-pw", testenv.RoleOptions{})
	e.exec(t, `GRANT SELECT, INSERT, UPDATE, DELETE ON shared_leases, shared_leases_markers, shared_leases_history TO app;
		GRANT USAGE ON SEQUENCE shared_leases_token_seq TO app`)
	var logs logBuffer
	b := newBackend(t, e, "limited", postgres.Config{URL: e.pg.URL("app", "app-pw"), Table: table, Log: logs.logger()})
	l := campaign(t, b, "app", 5*time.Second)
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	if err := l.Renew(ctx); err != nil {
		t.Fatalf("renew as the limited role: %v", err)
	}
	now := time.Now()
	if err := l.Complete(ctx, backends.Marker{Key: "k", Identity: "app", Token: l.Token(), At: now, Expires: now.Add(time.Hour)}); err != nil {
		t.Fatalf("complete as the limited role: %v", err)
	}
	backendtest.WaitFor(t, "the listener", func() bool { return strings.Contains(logs.String(), "mode=notify") })
	e.exec(t, "DELETE FROM shared_leases WHERE name = $1", l.Key())
	waitLost(t, l, time.Now(), "row of a limited role deleted")
	if err := l.Release(ctx, &backends.Term{Identity: "app", Token: l.Token(), Acquired: now, Ended: time.Now(), End: backends.EndLost}); err != nil {
		t.Errorf("release with a term as the limited role: %v", err)
	}
	if terms, err := b.History(ctx, 0); err != nil || len(terms) != 1 || terms[0].Token != l.Token() {
		t.Errorf("history as the limited role: %+v, %v", terms, err)
	}
}

// testTryIsFast: --try on a held lock answers within 100 ms on loopback,
// connection included (the median of five tries, each on a backend of its
// own: one try can meet a busy machine), and writes nothing.
func testTryIsFast(t *testing.T, e *env) {
	lock := "try-fast"
	l := campaign(t, newBackend(t, e, lock, postgres.Config{}), "holder", 5*time.Second)
	before := rowText(t, e, l.Key())
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	opts := options("try", 5*time.Second)
	opts.Try = true
	var took []time.Duration
	for range 5 {
		b := newBackend(t, e, lock, postgres.Config{})
		start := time.Now()
		_, err := b.Campaign(ctx, opts)
		took = append(took, time.Since(start))
		if !errors.Is(err, backends.ErrLocked) || !strings.Contains(err.Error(), `"holder"`) {
			t.Fatalf("try on a held lock = %v, want ErrLocked naming the holder", err)
		}
	}
	t.Logf("tries on a held lock, new connection included: %v", took)
	slices.Sort(took)
	if med := took[len(took)/2]; med > 100*time.Millisecond {
		t.Errorf("try took %v (median of %d), want under 100ms", med, len(took))
	}
	if after := rowText(t, e, l.Key()); after != before {
		t.Errorf("try changed the row:\n%s\n%s", before, after)
	}
}

func rowText(t *testing.T, e *env, key string) string {
	t.Helper()
	var s string
	if err := e.admin.QueryRow(context.Background(), "SELECT l::text FROM leaderrun_leases l WHERE name = $1", key).Scan(&s); err != nil {
		t.Fatal(err)
	}
	return s
}

// testTableDropped: an operator drops the tables while a candidate waits;
// they are created again and the sequence, which is not the table's, keeps
// the tokens increasing.
func testTableDropped(t *testing.T, e *env) {
	const table = "dropped_leases"
	lock := "dropped"
	l := campaign(t, newBackend(t, e, lock, postgres.Config{Table: table}), "first", 5*time.Second)
	got := make(chan backends.Lease, 1)
	go func() {
		l2, err := newBackend(t, e, lock, postgres.Config{Table: table, PollInterval: 100 * time.Millisecond}).
			Campaign(context.Background(), options("second", 5*time.Second))
		if err != nil {
			t.Errorf("waiter: %v", err)
		}
		got <- l2
	}()
	// Whether the waiter's first attempt comes before the drop or after,
	// it must end up with the lock and a greater token.
	e.exec(t, "DROP TABLE dropped_leases, dropped_leases_markers, dropped_leases_history")
	waitLost(t, l, time.Now(), "table dropped")
	select {
	case l2 := <-got:
		if l2 == nil {
			return
		}
		defer l2.Release(context.Background(), nil)
		if l2.Token() <= l.Token() {
			t.Errorf("token after the table was dropped %d, not greater than %d", l2.Token(), l.Token())
		}
	case <-time.After(10 * time.Second):
		t.Fatal("waiter did not get the lock within 10s of the table being dropped")
	}
}

// testServerRestart: a fast restart of PostgreSQL costs a leader at most
// one failed renewal, and afterwards the listener is back: a deleted row
// is again a loss within 1 s. This test restarts the shared cluster, so it
// runs last.
func testServerRestart(t *testing.T, e *env) {
	lock := "restart"
	var logs logBuffer
	b := newBackend(t, e, lock, postgres.Config{Log: logs.logger()})
	l := campaign(t, b, "leader", 10*time.Second)
	backendtest.WaitFor(t, "the listener", func() bool { return strings.Contains(logs.String(), "mode=notify") })
	e.pg.Restart(t)
	e.admin.Reset()
	failures := 0
	backendtest.WaitFor(t, "a renewal after the restart", func() bool {
		ctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
		defer cancel()
		err := l.Renew(ctx)
		if err != nil {
			failures++
			if errors.Is(err, backends.ErrLeaseLost) {
				t.Fatalf("renewal after a restart: %v", err)
			}
		}
		return err == nil
	})
	if failures > 1 {
		t.Errorf("%d renewals failed after the restart, want at most 1", failures)
	}
	t.Logf("%d renewal(s) failed after the restart", failures)
	// The listener reconnects with backoff; a check it makes once it
	// listens again is what reports a deletion made meanwhile.
	e.exec(t, "DELETE FROM leaderrun_leases WHERE name = $1", l.Key())
	deleted := time.Now()
	select {
	case <-l.Lost():
		t.Logf("loss reported %v after the delete", time.Since(deleted))
	case <-time.After(3 * time.Second):
		t.Fatalf("Lost() not closed within 3s of a delete after a restart; log:\n%s", logs.String())
	}
}

// testLibpqEnvironment: with no URL, the connection comes from libpq's
// variables, and a password missing there from the password file, as psql
// reads them.
func testLibpqEnvironment(t *testing.T, e *env) {
	for _, tc := range []struct {
		name     string
		env      map[string]string
		passfile bool
	}{
		{"PGPASSWORD", map[string]string{"PGPASSWORD": e.pg.Password}, false},
		{"PGPASSFILE", nil, true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Setenv("PGHOST", e.pg.Host())
			t.Setenv("PGPORT", fmt.Sprint(e.pg.Port()))
			t.Setenv("PGUSER", testenv.PostgresSuperuser)
			t.Setenv("PGDATABASE", "postgres")
			t.Setenv("PGSSLMODE", "disable")
			t.Setenv("PGPASSWORD", "")
			t.Setenv("PGPASSFILE", filepath.Join(t.TempDir(), "none"))
			for k, v := range tc.env {
				t.Setenv(k, v)
			}
			if tc.passfile {
				f := filepath.Join(t.TempDir(), "pgpass")
				line := fmt.Sprintf("%s:%d:postgres:%s:%s\n", e.pg.Host(), e.pg.Port(), testenv.PostgresSuperuser, e.pg.Password)
				if err := os.WriteFile(f, []byte(line), 0o600); err != nil {
					t.Fatal(err)
				}
				t.Setenv("PGPASSFILE", f)
			}
			b, err := postgres.New(postgres.Config{Lock: "libpq-" + tc.name})
			if err != nil {
				t.Fatal(err)
			}
			defer b.Close()
			l := campaign(t, b, "env", 5*time.Second)
			if err := l.Release(context.Background(), nil); err != nil {
				t.Error(err)
			}
		})
	}
}

// TestNewRefusesBadConfig: a configuration that cannot work is an error
// from New, before anything is sent, and shows no password.
func TestNewRefusesBadConfig(t *testing.T) {
	for _, tc := range []struct {
		name string
		cfg  postgres.Config
		want string
	}{
		{"bad lock name", postgres.Config{URL: "postgres://u@h/db", Lock: "a/b"}, "invalid lock name"},
		{"table name too long", postgres.Config{URL: "postgres://u@h/db", Lock: "a", Table: strings.Repeat("t", 51)}, "invalid table name"},
		{"empty schema", postgres.Config{URL: "postgres://u@h/db", Lock: "a", Table: ".t"}, "invalid table name"},
		{"two dots", postgres.Config{URL: "postgres://u@h/db", Lock: "a", Table: "a.b.c"}, "invalid table name"},
		{"bad URL", postgres.Config{URL: "postgres://u:hunter2@h:notaport/db", Lock: "a"}, "connection string"},
		{"bad exec mode", postgres.Config{URL: "postgres://u:hunter2@h/db?default_query_exec_mode=fast", Lock: "a"}, "connection string"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			b, err := postgres.New(tc.cfg)
			if err == nil {
				b.Close()
				t.Fatal("New accepted it")
			}
			if !strings.Contains(err.Error(), tc.want) || strings.Contains(err.Error(), "hunter2") {
				t.Errorf("New: %v; want an error saying %q, without the password", err, tc.want)
			}
		})
	}
}

// testStatementRate measures the statements that a leader and an idle
// follower send at leaderrun's default timings (15 s lease, renewal and
// poll every 2 s), directly (notifications) and through PgBouncer in
// transaction mode (polling), from the server's own log. It takes 40 s, so
// it runs only when LEADERRUN_MEASURE_STATEMENTS=1.
func testStatementRate(t *testing.T, e *env) {
	if os.Getenv("LEADERRUN_MEASURE_STATEMENTS") != "1" {
		t.Skip("set LEADERRUN_MEASURE_STATEMENTS=1 to measure (40 s)")
	}
	const (
		table  = "rate_leases"
		lease  = 15 * time.Second
		period = 2 * time.Second
		window = 30 * time.Second
	)
	owner := newBackend(t, e, "rate-setup", postgres.Config{Table: table})
	campaign(t, owner, "owner", lease).Release(context.Background(), nil)
	roles := []string{"leader_direct", "follower_direct", "leader_bouncer", "follower_bouncer"}
	users := map[string]string{}
	for _, r := range roles {
		e.pg.CreateRole(t, r, r+"-pw", testenv.RoleOptions{})
		e.exec(t, fmt.Sprintf(`ALTER ROLE %[1]s SET log_statement = 'all';
			GRANT SELECT, INSERT, UPDATE, DELETE ON rate_leases, rate_leases_markers, rate_leases_history TO %[1]s;
			GRANT USAGE ON SEQUENCE rate_leases_token_seq TO %[1]s`, r))
		users[r] = r + "-pw"
	}
	bouncer := testenv.StartPgBouncer(t, e.pg, "transaction", users)
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	var wg sync.WaitGroup
	defer wg.Wait()
	for _, path := range []struct {
		lock string
		url  func(role, pw string) string
		kind string
	}{{"rate-direct", e.pg.URL, "direct"}, {"rate-bouncer", bouncer.URL, "bouncer"}} {
		leader := newBackend(t, e, path.lock, postgres.Config{URL: path.url("leader_"+path.kind, "leader_"+path.kind+"-pw"),
			Table: table, PollInterval: period})
		l := campaign(t, leader, "leader", lease)
		follower := newBackend(t, e, path.lock, postgres.Config{URL: path.url("follower_"+path.kind, "follower_"+path.kind+"-pw"),
			Table: table, PollInterval: period})
		wg.Add(2)
		go func() { // the runner's renewals
			defer wg.Done()
			tick := time.NewTicker(period)
			defer tick.Stop()
			for {
				select {
				case <-ctx.Done():
					return
				case <-tick.C:
					rctx, rcancel := context.WithTimeout(ctx, period)
					if err := l.Renew(rctx); err != nil && ctx.Err() == nil {
						t.Errorf("%s renewal: %v", path.kind, err)
					}
					rcancel()
				}
			}
		}()
		go func() {
			defer wg.Done()
			if l, err := follower.Campaign(ctx, options("follower", lease)); err == nil {
				t.Errorf("%s follower got the lock", path.kind)
				l.Release(context.Background(), nil)
			}
		}()
	}
	// Past the listeners' set-up and the followers' first attempts.
	time.Sleep(3 * time.Second)
	from := len(e.pg.ServerLog())
	time.Sleep(window)
	logged := e.pg.ServerLog()[from:]
	cancel()
	for _, tc := range []struct {
		role string
		max  float64 // statements per second
	}{
		{"leader_direct", 0.6}, {"follower_direct", 0.2}, {"leader_bouncer", 0.6}, {"follower_bouncer", 0.6},
	} {
		n := 0
		for _, line := range strings.Split(logged, "\n") {
			if strings.Contains(line, "] "+tc.role+"@") && (strings.Contains(line, "LOG:  statement:") || strings.Contains(line, "LOG:  execute")) {
				n++
			}
		}
		rate := float64(n) / window.Seconds()
		t.Logf("%s: %d statements in %v, %.3f per second", tc.role, n, window, rate)
		if rate > tc.max {
			t.Errorf("%s sends %.3f statements per second, want at most %.2f", tc.role, rate, tc.max)
		}
	}
}

// testQuotedTable: a schema-qualified table whose name needs quoting
// (upper case, a dash, a quote) works end to end, notifications included.
func testQuotedTable(t *testing.T, e *env) {
	e.exec(t, `CREATE SCHEMA "Ops"`)
	const table = `Ops.Odd-"Leases"`
	var logs logBuffer
	b := newBackend(t, e, "quoted", postgres.Config{Table: table, Log: logs.logger()})
	l := campaign(t, b, "a", 5*time.Second)
	if n := e.exec(t, `SELECT FROM "Ops"."Odd-""Leases""" WHERE name = $1 AND holder = 'a'`, l.Key()); n != 1 {
		t.Fatalf("the row is not in the quoted table (%d rows)", n)
	}
	backendtest.WaitFor(t, "the listener", func() bool { return strings.Contains(logs.String(), "mode=notify") })
	e.exec(t, `DELETE FROM "Ops"."Odd-""Leases""" WHERE name = $1`, l.Key())
	waitLost(t, l, time.Now(), "row deleted from the quoted table")
	if st, err := b.Status(context.Background()); err != nil || st.Held {
		t.Errorf("status after the delete: %+v, %v", st, err)
	}
}

// testPgBouncerSession: a pooler in session mode keeps the listening
// connection's session, so notifications work through it.
func testPgBouncerSession(t *testing.T, e *env) {
	bouncer := testenv.StartPgBouncer(t, e.pg, "session", map[string]string{testenv.PostgresSuperuser: e.pg.Password})
	var logs logBuffer
	b := newBackend(t, e, "bouncer-session", postgres.Config{URL: bouncer.URL(testenv.PostgresSuperuser, e.pg.Password),
		Log: logs.logger()})
	l := campaign(t, b, "a", 5*time.Second)
	backendtest.WaitFor(t, "the backend to log its mode", func() bool { return strings.Contains(logs.String(), "mode=") })
	if !strings.Contains(logs.String(), "mode=notify") {
		t.Fatalf("through PgBouncer in session mode the backend should listen; the log says:\n%s", logs.String())
	}
	e.exec(t, "DELETE FROM leaderrun_leases WHERE name = $1", l.Key())
	waitLost(t, l, time.Now(), "row deleted, through a session-mode pooler")
}

// testStalledLink: with the link to the server stalled (nothing closes,
// nothing arrives), a renewal ends with its context and is not a loss, a
// waiter's cancellation returns within the withdrawal's own bound, and
// once the link flows again the same lease renews.
func testStalledLink(t *testing.T, e *env) {
	proxy := testenv.NewProxy(t, e.pg.Addr())
	url := fmt.Sprintf("postgres://%s:%s@%s/postgres?sslmode=disable", testenv.PostgresSuperuser, e.pg.Password, proxy.Addr())
	lock := "stalled"
	leader := newBackend(t, e, lock, postgres.Config{URL: url, ConnectTimeout: time.Second})
	l := campaign(t, leader, "leader", 10*time.Second)
	follower := newBackend(t, e, lock, postgres.Config{URL: url, ConnectTimeout: time.Second, PollInterval: 100 * time.Millisecond})
	fctx, fcancel := context.WithCancel(context.Background())
	defer fcancel()
	returned := make(chan error, 1)
	go func() {
		_, err := follower.Campaign(fctx, options("follower", 10*time.Second))
		returned <- err
	}()
	proxy.Stall()
	ctx, cancel := context.WithTimeout(context.Background(), 500*time.Millisecond)
	start := time.Now()
	err := l.Renew(ctx)
	cancel()
	if err == nil || errors.Is(err, backends.ErrLeaseLost) || time.Since(start) > 2*time.Second {
		t.Errorf("renewal over a stalled link: %v after %v; want a plain error after about 500ms", err, time.Since(start))
	}
	fcancel()
	cancelled := time.Now()
	select {
	case err := <-returned:
		if !errors.Is(err, context.Canceled) {
			t.Errorf("cancelled waiter returned %v, want context.Canceled", err)
		}
		t.Logf("cancelled waiter returned %v after the cancel", time.Since(cancelled))
	case <-time.After(5 * time.Second):
		t.Fatal("cancelled waiter still waiting 5s later, over a stalled link")
	}
	proxy.Resume()
	backendtest.WaitFor(t, "a renewal once the link flows", func() bool {
		ctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
		defer cancel()
		err := l.Renew(ctx)
		if errors.Is(err, backends.ErrLeaseLost) {
			t.Fatalf("renewal after the link came back: %v", err)
		}
		return err == nil
	})
}

// TestHostileServer: a server that answers without end (rows, one huge
// row, parameters at start-up) gets an error naming the bound it broke,
// ErrUnavailable, within seconds; the backend's memory is measured as
// the binary's in e2e/postgres_hostile_test.go.
func TestHostileServer(t *testing.T) {
	for _, tc := range []struct {
		name   string
		answer testenv.HostileAnswer
		want   string
	}{
		{"EndlessRows", testenv.EndlessRows, "more rows than the statement can return"},
		{"HugeRow", testenv.HugeRow, "invalid body length"},
		{"EndlessParameters", testenv.EndlessParameters, "more than 4 MiB in one answer"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			fake := testenv.StartHostilePostgres(t, tc.answer)
			b, err := postgres.New(postgres.Config{URL: fake.URL(), Lock: "hostile"})
			if err != nil {
				t.Fatal(err)
			}
			defer b.Close()
			ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
			defer cancel()
			start := time.Now()
			_, err = b.Campaign(ctx, options("a", 5*time.Second))
			t.Logf("campaign: %v after %v", err, time.Since(start))
			if !errors.Is(err, backends.ErrUnavailable) || !strings.Contains(err.Error(), tc.want) {
				t.Errorf("campaign = %v, want ErrUnavailable saying %q", err, tc.want)
			}
			if took := time.Since(start); took > 10*time.Second {
				t.Errorf("campaign took %v", took)
			}
			if _, err := b.History(ctx, 0); !errors.Is(err, backends.ErrUnavailable) || !strings.Contains(err.Error(), tc.want) {
				t.Errorf("history = %v, want ErrUnavailable saying %q", err, tc.want)
			}
		})
	}
}

// testClientCertificate: sslcert and sslkey log a role in with a client
// certificate (the server's pg_hba.conf asks one of CertAuthRole), an
// encrypted key with sslpassword; a wrong or missing passphrase is an
// error from New, and no certificate is refused by the server.
func testClientCertificate(t *testing.T, e *env) {
	t.Setenv("HOME", t.TempDir()) // no ~/.postgresql
	e.pg.CreateRole(t, testenv.CertAuthRole, "not-used", testenv.RoleOptions{Create: true})
	base := fmt.Sprintf("host=%s port=%d dbname=postgres user=%s sslmode=verify-full sslrootcert=%s",
		e.pg.Host(), e.pg.Port(), testenv.CertAuthRole, e.pg.CAFile())
	cert, key := e.pg.ClientCert(t, testenv.CertAuthRole, "")
	rsaCert, rsaKey := e.pg.ClientCert(t, testenv.CertAuthRole, "key-passphrase")
	for _, tc := range []struct {
		name, conn, want string
		newFails         bool
	}{
		{"EC key", fmt.Sprintf("%s sslcert=%s sslkey=%s", base, cert, key), "", false},
		{"encrypted RSA key", fmt.Sprintf("%s sslcert=%s sslkey=%s sslpassword=key-passphrase", base, rsaCert, rsaKey), "", false},
		{"wrong passphrase", fmt.Sprintf("%s sslcert=%s sslkey=%s sslpassword=wrong", base, rsaCert, rsaKey), "decrypt", true},
		{"no passphrase", fmt.Sprintf("%s sslcert=%s sslkey=%s", base, rsaCert, rsaKey), "sslpassword", true},
		{"no certificate", base, "certificate", false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			b, err := postgres.New(postgres.Config{URL: tc.conn, Lock: "cert", Prefix: prefix, Table: "cert_leases"})
			if tc.newFails {
				if err == nil || !strings.Contains(err.Error(), tc.want) || strings.Contains(err.Error(), "key-passphrase") {
					t.Errorf("New = %v, want an error about the %s, without the passphrase", err, tc.want)
				}
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			defer b.Close()
			ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
			defer cancel()
			l, err := b.Campaign(ctx, options("cert", 5*time.Second))
			if tc.want != "" {
				if !errors.Is(err, backends.ErrUnavailable) || !strings.Contains(err.Error(), tc.want) {
					t.Errorf("campaign = %v, want ErrUnavailable about the %s", err, tc.want)
				}
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			l.Release(ctx, nil)
		})
	}
}
