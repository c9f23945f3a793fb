package postgres_test

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"maps"
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

// TestPostgres runs every test of the store against one real cluster:
// initdb costs about 2 s. Tests that change a whole table use a table of
// their own.
func TestPostgres(t *testing.T) {
	pg := testenv.StartPostgres(t)
	admin, err := pgxpool.New(context.Background(), pg.SuperuserURL())
	if err != nil {
		t.Fatal(err)
	}
	defer admin.Close()
	e := &env{pg: pg, admin: admin}
	for _, tc := range []struct {
		name string
		run  func(*testing.T, *env)
	}{
		{"Conformance", testConformance},
		{"ConformanceThroughPgBouncer", testPgBouncer},
		{"PgBouncerSessionMode", testPgBouncerSession},
		{"WakeOnlyNextInLine", testWakeOnlyNextInLine},
		{"QueueSkipsWaitersThatLeft", testQueueSkipsWaitersThatLeft},
		{"OlderReleaseRows", testOlderReleaseRows},
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
		t.Run(tc.name, func(t *testing.T) { tc.run(t, e) })
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

// count runs sql, which returns one number, as the superuser.
func (e *env) count(t *testing.T, sql string, args ...any) int64 {
	t.Helper()
	var n int64
	if err := e.admin.QueryRow(context.Background(), sql, args...).Scan(&n); err != nil {
		t.Fatalf("%s: %v", sql, err)
	}
	return n
}

const prefix = "leaderrun-test/"

// open opens a store; cfg.URL defaults to the superuser's, cfg.Prefix to
// prefix. The test closes it.
func open(t *testing.T, e *env, cfg postgres.Config) *postgres.Store {
	t.Helper()
	if cfg.URL == "" {
		cfg.URL = e.pg.SuperuserURL()
	}
	if cfg.Prefix == "" {
		cfg.Prefix = prefix
	}
	s, err := postgres.Open(cfg)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { s.Close() })
	return s
}

// timings are consistent timings for a lease of lease.
func timings(lease time.Duration) backends.Timings {
	return backends.Timings{LeaseDuration: lease, RenewDeadline: lease / 2, RetryPeriod: lease / 10, KillGrace: lease / 4}
}

func candidate(id string, lease time.Duration) backends.Candidate {
	return backends.Candidate{Identity: id, Timings: timings(lease)}
}

// campaign wins lock in s as id within 30 s, or fails the test; the test
// releases the lease.
func campaign(t *testing.T, s backends.Store, lock, id string, lease time.Duration) *backends.Lease {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	l, err := backends.Campaign(ctx, s, lock, candidate(id, lease))
	if err != nil {
		t.Fatalf("%s: campaign: %v", id, err)
	}
	t.Cleanup(func() { l.Release(context.Background(), nil) })
	return l
}

// waitLost waits up to 1 s for l to report its loss, and returns how long
// that took from since.
func waitLost(t *testing.T, l *backends.Lease, since time.Time, what string) time.Duration {
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

// logBuffer collects a store's log lines.
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
		Open: func(t *testing.T) backends.Store { return open(t, e, postgres.Config{Log: logs.logger()}) },
		Drop: func(t *testing.T, lock string, l *backends.Lease) {
			if n := e.exec(t, "DELETE FROM leaderrun_leases WHERE name = $1", prefix+backends.SlotLock(lock, l.Slot())); n != 1 {
				t.Fatalf("deleted %d rows, want 1", n)
			}
		},
	})
	if !strings.Contains(logs.String(), "mode=notify") || strings.Contains(logs.String(), "mode=poll") {
		t.Errorf("a direct connection should use notifications; the log says:\n%s", logs.String())
	}
}

// testPgBouncer: the suite through PgBouncer in transaction mode, where a
// notification reaches nobody: the store must see that, say so, and poll.
// Loss is then seen by the next renewal, so Drop deletes the row and then
// renews as the runner would at its next retry period.
func testPgBouncer(t *testing.T, e *env) {
	bouncer := testenv.StartPgBouncer(t, e.pg, "transaction", map[string]string{testenv.PostgresSuperuser: e.pg.Password})
	var logs logBuffer
	url := bouncer.URL(testenv.PostgresSuperuser, e.pg.Password)
	backendtest.Run(t, backendtest.Harness{
		Open: func(t *testing.T) backends.Store {
			return open(t, e, postgres.Config{URL: url, Table: "bouncer_leases", Log: logs.logger()})
		},
		Drop: func(t *testing.T, lock string, l *backends.Lease) {
			if n := e.exec(t, "DELETE FROM bouncer_leases WHERE name = $1", prefix+backends.SlotLock(lock, l.Slot())); n != 1 {
				t.Fatalf("deleted %d rows, want 1", n)
			}
			ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
			defer cancel()
			if err := l.Renew(ctx); !errors.Is(err, backends.ErrLeaseLost) {
				t.Errorf("renewal after the row was deleted, through PgBouncer: %v, want ErrLeaseLost", err)
			}
		},
		Handovers: 30,
	})
	// A follower needs a while to conclude that its probe will not
	// arrive; a holder's, whose lease lasts, says so.
	var modeLog logBuffer
	s := open(t, e, postgres.Config{URL: url, Table: "bouncer_leases", Log: modeLog.logger()})
	campaign(t, s, "bouncer-mode", "a", 5*time.Second)
	backendtest.WaitFor(t, "the store to log its mode", func() bool { return strings.Contains(modeLog.String(), "mode=") })
	if all := logs.String() + modeLog.String(); !strings.Contains(all, "mode=poll") || strings.Contains(all, "mode=notify") {
		t.Errorf("through PgBouncer in transaction mode the store should poll; the log says:\n%s", all)
	}
	// Nothing was left holding a session advisory lock on PgBouncer's
	// server connections, which would keep every waiter of the lock out.
	if n := e.count(t, "SELECT count(*) FROM pg_locks WHERE locktype = 'advisory'"); n != 0 {
		t.Errorf("%d advisory locks held after the suite through PgBouncer", n)
	}
}

// testPgBouncerSession: a pooler in session mode keeps the follower's
// session, so notifications work through it.
func testPgBouncerSession(t *testing.T, e *env) {
	bouncer := testenv.StartPgBouncer(t, e.pg, "session", map[string]string{testenv.PostgresSuperuser: e.pg.Password})
	var logs logBuffer
	s := open(t, e, postgres.Config{URL: bouncer.URL(testenv.PostgresSuperuser, e.pg.Password), Log: logs.logger()})
	l := campaign(t, s, "bouncer-session", "a", 5*time.Second)
	backendtest.WaitFor(t, "the store to log its mode", func() bool { return strings.Contains(logs.String(), "mode=") })
	if !strings.Contains(logs.String(), "mode=notify") {
		t.Fatalf("through PgBouncer in session mode the store should listen; the log says:\n%s", logs.String())
	}
	e.exec(t, "DELETE FROM leaderrun_leases WHERE name = $1", prefix+"bouncer-session")
	waitLost(t, l, time.Now(), "row deleted, through a session-mode pooler")
}

// queueSessions are the sessions of the application named like app (a
// LIKE pattern) that hold (granted) or wait for an advisory lock: the
// queues of waiters.
func queueSessions(t *testing.T, e *env, app string) (granted []string, waiting int) {
	t.Helper()
	rows, err := e.admin.Query(context.Background(), `SELECT a.application_name, l.granted FROM pg_locks l
		JOIN pg_stat_activity a USING (pid) WHERE l.locktype = 'advisory' AND a.application_name LIKE $1`, app)
	if err != nil {
		t.Fatal(err)
	}
	defer rows.Close()
	for rows.Next() {
		var name string
		var ok bool
		if err := rows.Scan(&name, &ok); err != nil {
			t.Fatal(err)
		}
		if ok {
			granted = append(granted, name)
		} else {
			waiting++
		}
	}
	return granted, waiting
}

// testWakeOnlyNextInLine: 30 waiters, each with a store and a role of its
// own whose statements the server logs. At each release, only the first
// in line reads the row (and takes it), and the next in line, which
// becomes first, reads it once: at most two waiters send anything but
// the queue's own statements, where a broadcast makes every one of them
// read it.
func testWakeOnlyNextInLine(t *testing.T, e *env) {
	const (
		waiters = 30
		rounds  = 6
		table   = "wake_leases"
		lease   = 30 * time.Second // no expiry while the test runs
		lock    = "wake"
	)
	campaign(t, open(t, e, postgres.Config{Table: table}), "wake-setup", "owner", lease).Release(context.Background(), nil)
	holder := campaign(t, open(t, e, postgres.Config{Table: table}), lock, "holder", lease)
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	type grant struct {
		role  string
		lease *backends.Lease
	}
	won := make(chan grant, waiters)
	var wg sync.WaitGroup
	defer wg.Wait()
	defer cancel()
	for i := range waiters {
		role := fmt.Sprintf("wake%02d", i)
		e.pg.CreateRole(t, role, "pw", testenv.RoleOptions{})
		e.exec(t, fmt.Sprintf(`ALTER ROLE %[1]s SET log_statement = 'all';
			GRANT SELECT, INSERT, UPDATE ON wake_leases TO %[1]s; GRANT SELECT, INSERT, UPDATE, DELETE ON wake_leases_markers TO %[1]s;
			GRANT USAGE ON SEQUENCE wake_leases_token_seq TO %[1]s`, role))
		s := open(t, e, postgres.Config{URL: e.pg.URL(role, "pw") + "&application_name=" + role, Table: table})
		wg.Go(func() {
			l, err := backends.Campaign(ctx, s, lock, candidate(role, lease))
			if err == nil {
				won <- grant{role, l}
			} else if ctx.Err() == nil {
				t.Errorf("%s: %v", role, err)
			}
		})
	}
	// Every waiter has queued, one first and the others behind it.
	backendtest.WaitFor(t, "the waiters to queue", func() bool {
		granted, waiting := queueSessions(t, e, "wake%")
		return len(granted) == 1 && waiting == waiters-1
	})
	current := holder
	var woken []int
	for round := range rounds {
		from := len(e.pg.ServerLog())
		if err := current.Release(context.Background(), nil); err != nil {
			t.Fatal(err)
		}
		var winner string
		select {
		case g := <-won:
			winner, current = g.role, g.lease
		case <-time.After(10 * time.Second):
			t.Fatalf("round %d: no waiter took the lock within 10 s of its release", round)
		}
		// The next in line has become first and read the row.
		var next string
		backendtest.WaitFor(t, "the next in line", func() bool {
			granted, _ := queueSessions(t, e, "wake%")
			if len(granted) != 1 || granted[0] == winner {
				return false
			}
			next = granted[0]
			_, read := readers(e.pg.ServerLog()[from:])[next]
			return read
		})
		got := readers(e.pg.ServerLog()[from:])
		t.Logf("round %d: waiters that read after the release: %v (taken by %s, next in line %s)", round, slices.Sorted(maps.Keys(got)), winner, next)
		woken = append(woken, len(got))
	}
	current.Release(context.Background(), nil)
	slices.Sort(woken)
	if med := woken[len(woken)/2]; med > 2 {
		t.Errorf("median waiters that read the row per release: %d, want at most 2 (all: %v)", med, woken)
	}
}

// readers are the waiters' roles (wakeNN) that sent a statement in log,
// other than their queue's own (LISTEN, UNLISTEN, SET, the advisory lock,
// pg_notify, and pings).
func readers(log string) map[string]struct{} {
	got := map[string]struct{}{}
	for _, line := range strings.Split(log, "\n") {
		i := strings.Index(line, "] wake")
		j := strings.Index(line, " LOG:  ")
		if i < 0 || j < i || !strings.Contains(line, "statement: ") && !strings.Contains(line, "execute ") {
			continue
		}
		role, _, _ := strings.Cut(line[i+2:j], "@")
		sql := line[j:]
		if !strings.Contains(sql, "LISTEN") && !strings.Contains(sql, "SET ") && !strings.Contains(sql, "advisory_lock") &&
			!strings.Contains(sql, "pg_notify") && !strings.Contains(sql, "-- ping") {
			got[role] = struct{}{}
		}
	}
	return got
}

// testQueueSkipsWaitersThatLeft: the queue survives waiters that go: one
// whose session the server ended (a dead host) queues again at the back,
// one that withdrew is skipped, and the lock goes to those still in line,
// in their order.
func testQueueSkipsWaitersThatLeft(t *testing.T, e *env) {
	const lease = 30 * time.Second
	lock := "queue-left"
	holder := campaign(t, open(t, e, postgres.Config{}), lock, "holder", lease)
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	type result struct {
		id string
		l  *backends.Lease
	}
	won := make(chan result, 4)
	cancels := map[string]context.CancelFunc{}
	var wg sync.WaitGroup
	defer wg.Wait()
	defer cancel()
	for i, id := range []string{"qa", "qb", "qc", "qd"} {
		s := open(t, e, postgres.Config{URL: e.pg.SuperuserURL() + "&application_name=" + id})
		cctx, ccancel := context.WithCancel(ctx)
		cancels[id] = ccancel
		wg.Go(func() {
			if l, err := backends.Campaign(cctx, s, lock, candidate(id, lease)); err == nil {
				won <- result{id, l}
			}
		})
		backendtest.WaitFor(t, id+" to queue", func() bool {
			granted, waiting := queueSessions(t, e, "q_")
			return len(granted) == 1 && waiting == i
		})
	}
	// qa's session ends under it: qb is first; qa queues again, last.
	e.exec(t, `SELECT pg_terminate_backend(a.pid) FROM pg_locks l JOIN pg_stat_activity a USING (pid)
		WHERE l.locktype = 'advisory' AND a.application_name = 'qa'`)
	backendtest.WaitFor(t, "qa to queue again", func() bool {
		granted, waiting := queueSessions(t, e, "q_")
		return slices.Equal(granted, []string{"qb"}) && waiting == 3
	})
	// qc withdraws while behind.
	cancels["qc"]()
	backendtest.WaitFor(t, "qc to leave", func() bool {
		_, waiting := queueSessions(t, e, "q_")
		return waiting == 2
	})
	current := holder
	var order []string
	for range 3 {
		if err := current.Release(context.Background(), nil); err != nil {
			t.Fatal(err)
		}
		select {
		case r := <-won:
			order, current = append(order, r.id), r.l
		case <-time.After(10 * time.Second):
			t.Fatalf("no waiter took the lock within 10 s of its release (so far %v)", order)
		}
	}
	current.Release(context.Background(), nil)
	if want := []string{"qb", "qd", "qa"}; !slices.Equal(order, want) {
		t.Errorf("the lock went to %v, want %v", order, want)
	}
}

// testOlderReleaseRows: a row that a release before the documents
// granted (its own owner, its own token) keeps this one out until it
// expires by the database's clock, and the next token is greater; its
// completion markers are rows of the markers table that this release
// does not read, and leaves alone.
func testOlderReleaseRows(t *testing.T, e *env) {
	s := open(t, e, postgres.Config{})
	campaign(t, s, "older-setup", "owner", 5*time.Second).Release(context.Background(), nil)
	key := prefix + "older"
	e.exec(t, `INSERT INTO leaderrun_leases (name, holder, owner, token, ttl, acquired, renewed, expires)
		VALUES ($1, 'old-release', 'f00d', nextval('leaderrun_leases_token_seq'), '1 hour', now(), now(), now() + interval '1 hour')`, key)
	e.exec(t, `INSERT INTO leaderrun_leases_markers VALUES ($1, '12345', 'old-release', 1, now(), now() + interval '1 hour')`, key)
	old := uint64(e.count(t, "SELECT token FROM leaderrun_leases WHERE name = $1", key))
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	try := candidate("new", 5*time.Second)
	try.Try = true
	if l, err := backends.Campaign(ctx, s, "older", try); !errors.Is(err, backends.ErrLocked) {
		if l != nil {
			l.Release(ctx, nil)
		}
		t.Fatalf("try on a row an older release holds: %v, want ErrLocked", err)
	}
	st, err := backends.ReadStatus(ctx, s, "older")
	if err != nil || !st.Held || st.Identity != "old-release" || st.Token != old || st.Remaining < 59*time.Minute {
		t.Errorf("status of the older release's row: %+v, %v", st, err)
	}
	if m, err := backends.ReadMarker(ctx, s, "older", "12345"); err != nil || m != nil {
		t.Errorf("the older release's marker read as %+v, %v; want none", m, err)
	}
	e.exec(t, "UPDATE leaderrun_leases SET expires = now() WHERE name = $1", key)
	l := campaign(t, s, "older", "new", 5*time.Second)
	if l.Token() <= old {
		t.Errorf("token %d after an older release's %d", l.Token(), old)
	}
	if err := l.Complete(ctx, backends.Marker{Key: "k", Identity: "new", Token: l.Token(), At: time.Now(),
		Expires: time.Now().Add(time.Hour)}); err != nil {
		t.Fatal(err)
	}
	if n := e.count(t, "SELECT count(*) FROM leaderrun_leases_markers WHERE name = $1 AND key = '12345'", key); n != 1 {
		t.Errorf("the older release's marker is gone")
	}
}

// testTokensAcrossDeletes: three contenders hand the lock over 20 times;
// every third leader's row is deleted by hand (the whole table, as an
// operator would) before it releases. No two ever hold it at once and
// every token is greater than the one before, deletes notwithstanding.
func testTokensAcrossDeletes(t *testing.T, e *env) {
	const (
		contenders = 3
		handovers  = 20
	)
	var (
		holders atomic.Int32
		mu      sync.Mutex
		tokens  []uint64
		deletes int
		wg      sync.WaitGroup
	)
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	for i := range contenders {
		s := open(t, e, postgres.Config{})
		wg.Go(func() {
			id := fmt.Sprintf("contender-%d", i)
			for {
				l, err := backends.Campaign(ctx, s, "tokens-across-deletes", candidate(id, 5*time.Second))
				if err != nil {
					t.Errorf("%s: campaign: %v", id, err)
					return
				}
				if n := holders.Add(1); n != 1 {
					t.Errorf("%s: %d holders at once (token %d)", id, n, l.Token())
				}
				mu.Lock()
				tokens = append(tokens, l.Token())
				n := len(tokens)
				mu.Unlock()
				time.Sleep(2 * time.Millisecond) // let the others queue up
				holders.Add(-1)
				if n%3 == 0 {
					if _, err := e.admin.Exec(ctx, "DELETE FROM leaderrun_leases"); err != nil {
						t.Error(err)
					}
					mu.Lock()
					deletes++
					mu.Unlock()
				}
				rctx, rcancel := context.WithTimeout(context.Background(), 5*time.Second)
				err = l.Release(rctx, nil)
				rcancel()
				if err != nil {
					t.Errorf("%s: release: %v", id, err)
					return
				}
				if n >= handovers {
					return
				}
			}
		})
	}
	wg.Wait()
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
// its lease is a loss reported within 1 s (by notification: milliseconds),
// and the next renewal agrees.
func testLossByHand(t *testing.T, e *env) {
	s := open(t, e, postgres.Config{Table: "loss_leases"})
	for _, tc := range []struct {
		name string
		sql  string // $1 is the row's name
		want string // in Err()
	}{
		{"delete the row", "DELETE FROM loss_leases WHERE name = $1", "deleted"},
		{"delete every row", "DELETE FROM loss_leases WHERE $1 <> ''", "deleted"},
		{"truncate the table", "TRUNCATE loss_leases", "deleted"},
		{"give it to another holder", "UPDATE loss_leases SET holder = 'intruder' WHERE name = $1", `"intruder"`},
		{"grant it anew", "UPDATE loss_leases SET holder = 'intruder', token = nextval('loss_leases_token_seq') WHERE name = $1",
			`"intruder"`},
		{"free it", "UPDATE loss_leases SET holder = '' WHERE name = $1", `released by someone else`},
		{"expire it", "UPDATE loss_leases SET expires = now() - interval '1 second' WHERE name = $1", "ran out"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			lock := "loss-" + strings.ReplaceAll(tc.name, " ", "-")
			l := campaign(t, s, lock, "leader", 10*time.Second)
			if strings.HasPrefix(tc.sql, "TRUNCATE") {
				e.exec(t, tc.sql)
			} else {
				e.exec(t, tc.sql, prefix+lock)
			}
			if d := waitLost(t, l, time.Now(), tc.name); d > 100*time.Millisecond {
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
	leader := campaign(t, open(t, e, postgres.Config{}), "expiry", "leader", lease)
	renewed := time.Now()
	if err := leader.Renew(context.Background()); err != nil {
		t.Fatal(err)
	}
	follower := campaign(t, open(t, e, postgres.Config{}), "expiry", "follower", lease)
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
	// set by hand, keeps a waiter out for as long as it stands; moved
	// into the past, the waiter takes over at once, woken by the
	// notification.
	campaign(t, open(t, e, postgres.Config{}), "expiry-by-hand", "holder", lease)
	e.exec(t, "UPDATE leaderrun_leases SET expires = now() + interval '1 hour' WHERE name = $1", prefix+"expiry-by-hand")
	got := make(chan *backends.Lease, 1)
	wctx, wcancel := context.WithCancel(context.Background())
	defer wcancel()
	waiter := open(t, e, postgres.Config{})
	go func() {
		l, _ := backends.Campaign(wctx, waiter, "expiry-by-hand", candidate("waiter", lease))
		got <- l
	}()
	select {
	case l := <-got:
		t.Fatalf("waiter took over an hour before the row's expiry (lease %v)", l)
	case <-time.After(2 * lease):
	}
	e.exec(t, "UPDATE leaderrun_leases SET expires = now() - interval '1 second' WHERE name = $1", prefix+"expiry-by-hand")
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

// testStatus: status reads the holder, token, TTL and time left from the
// database, and says nothing of the password.
func testStatus(t *testing.T, e *env) {
	s := open(t, e, postgres.Config{})
	l := campaign(t, s, "status", "holder-1", 7*time.Second)
	ctx := context.Background()
	st, err := backends.ReadStatus(ctx, s, "status")
	if err != nil {
		t.Fatal(err)
	}
	if !st.Held || st.Identity != "holder-1" || st.Token != l.Token() || st.TTL != 7*time.Second ||
		st.Remaining <= 6*time.Second || st.Remaining > 7*time.Second || st.Key != prefix+"status" {
		t.Errorf("status = %+v, want held by holder-1, token %d, TTL 7s, 6-7s left", st, l.Token())
	}
	js, _ := json.Marshal(st)
	if strings.Contains(string(js), e.pg.Password) {
		t.Errorf("status shows the password: %s", js)
	}
	e.exec(t, "UPDATE leaderrun_leases SET expires = now() + interval '1 hour' WHERE name = $1", prefix+"status")
	if st, err = backends.ReadStatus(ctx, s, "status"); err != nil || st.Remaining < 59*time.Minute {
		t.Errorf("after moving expires an hour ahead in the table, status = %+v, %v", st, err)
	}
	e.exec(t, "UPDATE leaderrun_leases SET expires = now() - interval '1 second' WHERE name = $1", prefix+"status")
	if st, err = backends.ReadStatus(ctx, s, "status"); err != nil || st.Held {
		t.Errorf("after expiring the row in the table, status = %+v, %v; want not held", st, err)
	}
}

// testRefused: a server that refuses us is ErrRefused at once, in every
// mode; one that cannot be reached is ErrUnavailable at once with --try,
// and when the wait ends otherwise. Every message names host and port,
// never the password.
func testRefused(t *testing.T, e *env) {
	const secret = "s3cret-Pa55word"
	closedPort := testenv.FreePort(t, "127.0.0.1")
	// A proxy whose link is stalled: connections are accepted, never
	// answered; only the connect timeout ends the attempt.
	stalled := testenv.NewProxy(t, e.pg.Addr())
	stalled.Stall()
	for _, tc := range []struct {
		name    string
		url     string
		addr    string
		refused bool
	}{
		{"wrong password", e.pg.URL(testenv.PostgresSuperuser, secret), e.pg.Addr(), true},
		{"no such role", e.pg.URL("nobody", secret), e.pg.Addr(), true},
		{"nothing listening", fmt.Sprintf("postgres://postgres:%s@127.0.0.1:%d/postgres?sslmode=disable", secret, closedPort),
			fmt.Sprintf("127.0.0.1:%d", closedPort), false},
		{"no answer", fmt.Sprintf("postgres://postgres:%s@%s/postgres?sslmode=disable", secret, stalled.Addr()), stalled.Addr(), false},
	} {
		for _, mode := range []string{"try", "wait"} {
			t.Run(tc.name+"/"+mode, func(t *testing.T) {
				s := open(t, e, postgres.Config{URL: tc.url, ConnectTimeout: 500 * time.Millisecond})
				ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
				defer cancel()
				c := candidate("a", 5*time.Second)
				c.Try, c.Wait = mode == "try", 1500*time.Millisecond
				start := time.Now()
				l, err := backends.Campaign(ctx, s, "refused", c)
				took := time.Since(start)
				if l != nil {
					l.Release(ctx, nil)
				}
				t.Logf("%v after %v", err, took)
				if !errors.Is(err, backends.ErrUnavailable) || errors.Is(err, backends.ErrRefused) != tc.refused {
					t.Fatalf("campaign = %v, want ErrUnavailable, refused %v", err, tc.refused)
				}
				if !strings.Contains(err.Error(), tc.addr) || strings.Contains(err.Error(), secret) {
					t.Errorf("error %q should name %s and not show the password", err, tc.addr)
				}
				if max := 3 * time.Second; took > max {
					t.Errorf("campaign took %v to give up, want under %v", took, max)
				}
				_, err = backends.ReadStatus(ctx, s, "refused")
				if !errors.Is(err, backends.ErrUnavailable) || !strings.Contains(err.Error(), tc.addr) ||
					strings.Contains(err.Error(), secret) {
					t.Errorf("status = %v, want ErrUnavailable naming %s, without the password", err, tc.addr)
				}
				_, err = backends.ReadHistory(ctx, s, "refused", 0)
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
	s := open(t, e, postgres.Config{URL: e.pg.URL("no_create", "no-create-pw"), Table: "missing_leases"})
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	_, err := backends.Campaign(ctx, s, "no-create", candidate("a", 5*time.Second))
	if !errors.Is(err, backends.ErrRefused) {
		t.Fatalf("campaign = %v, want ErrRefused", err)
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

// testLimitedRole: the privileges docs/backends/postgres.md lists are
// enough for a role that did not create the tables, and since their owner
// installed the triggers, that role is notified of a loss too.
func testLimitedRole(t *testing.T, e *env) {
	const table = "shared_leases"
	campaign(t, open(t, e, postgres.Config{Table: table}), "limited", "owner", 5*time.Second).Release(context.Background(), nil)
	e.pg.CreateRole(t, "app", "app-pw", testenv.RoleOptions{})
	e.exec(t, `GRANT SELECT, INSERT, UPDATE ON shared_leases TO app;
		GRANT SELECT, INSERT, UPDATE, DELETE ON shared_leases_markers TO app;
		GRANT SELECT, INSERT, DELETE ON shared_leases_history TO app;
		GRANT USAGE ON SEQUENCE shared_leases_token_seq TO app`)
	var logs logBuffer
	s := open(t, e, postgres.Config{URL: e.pg.URL("app", "app-pw"), Table: table, Log: logs.logger()})
	l := campaign(t, s, "limited", "app", 5*time.Second)
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	if err := l.Renew(ctx); err != nil {
		t.Fatalf("renew as the limited role: %v", err)
	}
	now := time.Now()
	if err := l.Complete(ctx, backends.Marker{Key: "k", Identity: "app", Token: l.Token(), At: now, Expires: now.Add(time.Hour)}); err != nil {
		t.Fatalf("complete as the limited role: %v", err)
	}
	backendtest.WaitFor(t, "the follower", func() bool { return strings.Contains(logs.String(), "mode=notify") })
	e.exec(t, "DELETE FROM shared_leases WHERE name = $1", prefix+"limited")
	waitLost(t, l, time.Now(), "row of a limited role deleted")
	if err := l.Release(ctx, &backends.Term{Identity: "app", Token: l.Token(), Acquired: now, Ended: time.Now(), End: backends.EndLost}); err != nil {
		t.Errorf("release with a term as the limited role: %v", err)
	}
	if terms, err := backends.ReadHistory(ctx, s, "limited", 0); err != nil || len(terms) != 1 || terms[0].Token != l.Token() {
		t.Errorf("history as the limited role: %+v, %v", terms, err)
	}
	if m, err := backends.ReadMarker(ctx, s, "limited", "k"); err != nil || m == nil || m.Token != l.Token() {
		t.Errorf("marker as the limited role: %+v, %v", m, err)
	}
	if strings.Contains(logs.String(), "level=WARN") {
		t.Errorf("the limited role's store warned:\n%s", logs.String())
	}

	// Without the triggers, which only the table's owner may create, the
	// role's store polls, and says so.
	e.exec(t, `DROP TRIGGER leaderrun_notify_update ON shared_leases; DROP TRIGGER leaderrun_notify_delete ON shared_leases;
		DROP TRIGGER leaderrun_notify_truncate ON shared_leases`)
	var pollLogs logBuffer
	s = open(t, e, postgres.Config{URL: e.pg.URL("app", "app-pw"), Table: table, Log: pollLogs.logger()})
	campaign(t, s, "limited", "app", 5*time.Second).Release(ctx, nil)
	if !strings.Contains(pollLogs.String(), "mode=poll") || !strings.Contains(pollLogs.String(), "triggers are not installed") {
		t.Errorf("without the triggers the store should poll; the log says:\n%s", pollLogs.String())
	}
	if n := e.count(t, "SELECT count(*) FROM pg_trigger WHERE tgrelid = 'shared_leases'::regclass AND NOT tgisinternal"); n != 0 {
		t.Errorf("the role that does not own the table installed %d triggers", n)
	}
}

// testTryIsFast: --try on a held lock answers within 100 ms on loopback,
// connection included (the fastest of five tries, each with a store of
// its own: on CI's loaded machine the median has been 132 ms), every try
// within 500 ms (one that waited a retry period, 2 s, or a lease would
// not be), and writes nothing.
func testTryIsFast(t *testing.T, e *env) {
	campaign(t, open(t, e, postgres.Config{}), "try-fast", "holder", 5*time.Second)
	before := rowText(t, e, prefix+"try-fast")
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	c := candidate("try", 5*time.Second)
	c.Try = true
	var took []time.Duration
	for range 5 {
		s := open(t, e, postgres.Config{})
		start := time.Now()
		_, err := backends.Campaign(ctx, s, "try-fast", c)
		took = append(took, time.Since(start))
		if !errors.Is(err, backends.ErrLocked) {
			t.Fatalf("try on a held lock = %v, want ErrLocked", err)
		}
	}
	t.Logf("tries on a held lock, new connection included: %v", took)
	slices.Sort(took)
	if best := took[0]; best > 100*time.Millisecond {
		t.Errorf("try took %v (the fastest of %d), want under 100ms", best, len(took))
	}
	if worst := took[len(took)-1]; worst > 500*time.Millisecond {
		t.Errorf("a try took %v, want every one under 500ms", worst)
	}
	if after := rowText(t, e, prefix+"try-fast"); after != before {
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
			s, err := postgres.Open(postgres.Config{})
			if err != nil {
				t.Fatal(err)
			}
			defer s.Close()
			l := campaign(t, s, "libpq-"+tc.name, "env", 5*time.Second)
			if err := l.Release(context.Background(), nil); err != nil {
				t.Error(err)
			}
		})
	}
}

// TestOpenRefusesBadConfig: a configuration that cannot work is an error
// from Open, before anything is sent, and shows no password.
func TestOpenRefusesBadConfig(t *testing.T) {
	for _, tc := range []struct {
		name string
		cfg  postgres.Config
		want string
	}{
		{"table name too long", postgres.Config{URL: "postgres://u@h/db", Table: strings.Repeat("t", 51)}, "invalid table name"},
		{"empty schema", postgres.Config{URL: "postgres://u@h/db", Table: ".t"}, "invalid table name"},
		{"two dots", postgres.Config{URL: "postgres://u@h/db", Table: "a.b.c"}, "invalid table name"},
		{"bad URL", postgres.Config{URL: "postgres://u:hunter2@h:notaport/db"}, "connection string"},
		{"bad exec mode", postgres.Config{URL: "postgres://u:hunter2@h/db?default_query_exec_mode=fast"}, "connection string"},
		{"pool option", postgres.Config{URL: "postgres://u:hunter2@h/db?pool_min_conns=3"}, "pool_min_conns"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			s, err := postgres.Open(tc.cfg)
			if err == nil {
				s.Close()
				t.Fatal("Open accepted it")
			}
			if !strings.Contains(err.Error(), tc.want) || strings.Contains(err.Error(), "hunter2") {
				t.Errorf("Open: %v; want an error saying %q, without the password", err, tc.want)
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
		period = 2 * time.Second
		window = 30 * time.Second
	)
	campaign(t, open(t, e, postgres.Config{Table: table}), "rate-setup", "owner", 15*time.Second).Release(context.Background(), nil)
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
		leader := open(t, e, postgres.Config{URL: path.url("leader_"+path.kind, "leader_"+path.kind+"-pw"), Table: table})
		l := campaign(t, leader, path.lock, "leader", 15*time.Second)
		follower := open(t, e, postgres.Config{URL: path.url("follower_"+path.kind, "follower_"+path.kind+"-pw"), Table: table})
		wg.Go(func() { // the runner's renewals
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
		})
		wg.Go(func() {
			c := backends.Candidate{Identity: "follower", Timings: backends.DefaultTimings}
			if l, err := backends.Campaign(ctx, follower, path.lock, c); err == nil {
				t.Errorf("%s follower got the lock", path.kind)
				l.Release(context.Background(), nil)
			}
		})
	}
	// Past the followers' set-up and first attempts.
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
	var logs logBuffer
	s := open(t, e, postgres.Config{Table: `Ops.Odd-"Leases"`, Log: logs.logger()})
	l := campaign(t, s, "quoted", "a", 5*time.Second)
	if n := e.exec(t, `SELECT FROM "Ops"."Odd-""Leases""" WHERE name = $1 AND holder = 'a'`, prefix+"quoted"); n != 1 {
		t.Fatalf("the row is not in the quoted table (%d rows)", n)
	}
	backendtest.WaitFor(t, "the follower", func() bool { return strings.Contains(logs.String(), "mode=notify") })
	e.exec(t, `DELETE FROM "Ops"."Odd-""Leases""" WHERE name = $1`, prefix+"quoted")
	waitLost(t, l, time.Now(), "row deleted from the quoted table")
	if st, err := backends.ReadStatus(context.Background(), s, "quoted"); err != nil || st.Held {
		t.Errorf("status after the delete: %+v, %v", st, err)
	}
}

// testTableDropped: an operator drops the tables while a candidate waits;
// they are created again and the sequence, which is not the table's, keeps
// the tokens increasing.
func testTableDropped(t *testing.T, e *env) {
	const table = "dropped_leases"
	l := campaign(t, open(t, e, postgres.Config{Table: table}), "dropped", "first", 5*time.Second)
	got := make(chan *backends.Lease, 1)
	waiter := open(t, e, postgres.Config{Table: table})
	go func() {
		l2, err := backends.Campaign(context.Background(), waiter, "dropped", candidate("second", time.Second))
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

// testStalledLink: with the link to the server stalled (nothing closes,
// nothing arrives), a renewal ends with its context and is not a loss, a
// waiter's cancellation returns within the withdrawal's own bound, and
// once the link flows again the same lease renews.
func testStalledLink(t *testing.T, e *env) {
	proxy := testenv.NewProxy(t, e.pg.Addr())
	url := fmt.Sprintf("postgres://%s:%s@%s/postgres?sslmode=disable", testenv.PostgresSuperuser, e.pg.Password, proxy.Addr())
	l := campaign(t, open(t, e, postgres.Config{URL: url, ConnectTimeout: time.Second}), "stalled", "leader", 10*time.Second)
	follower := open(t, e, postgres.Config{URL: url, ConnectTimeout: time.Second})
	fctx, fcancel := context.WithCancel(context.Background())
	defer fcancel()
	returned := make(chan error, 1)
	go func() {
		_, err := backends.Campaign(fctx, follower, "stalled", candidate("follower", 10*time.Second))
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

// testServerRestart: a fast restart of PostgreSQL costs a leader at most
// one failed renewal, and afterwards the follower listens again: a
// deleted row is again a loss within a retry period or so. This test
// restarts the shared cluster, so it runs last.
func testServerRestart(t *testing.T, e *env) {
	var logs logBuffer
	s := open(t, e, postgres.Config{Log: logs.logger()})
	l := campaign(t, s, "restart", "leader", 10*time.Second)
	backendtest.WaitFor(t, "the follower", func() bool { return strings.Contains(logs.String(), "mode=notify") })
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
	// The follower connects again every retry period; the read it makes
	// once it listens again is what reports a deletion made meanwhile.
	backendtest.WaitFor(t, "the follower to listen again", func() bool { return strings.Contains(logs.String(), "listening again") })
	e.exec(t, "DELETE FROM leaderrun_leases WHERE name = $1", prefix+"restart")
	waitLost(t, l, time.Now(), "row deleted after a restart")
}

// TestHostileServer: a server that answers without end (rows of other
// columns, one huge row, parameters at start-up) gets an error naming
// what it broke, a refusal, within seconds; the store's memory is
// measured as the binary's in e2e/postgres_hostile_test.go, and the bound
// on rows in TestRowsBounded.
func TestHostileServer(t *testing.T) {
	for _, tc := range []struct {
		name   string
		answer testenv.HostileAnswer
		want   string
	}{
		{"EndlessRows", testenv.EndlessRows, "not what the statement returns: 10 columns"},
		{"HugeRow", testenv.HugeRow, "invalid body length"},
		{"EndlessParameters", testenv.EndlessParameters, "more than 4 MiB in one answer"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			fake := testenv.StartHostilePostgres(t, tc.answer)
			s, err := postgres.Open(postgres.Config{URL: fake.URL()})
			if err != nil {
				t.Fatal(err)
			}
			defer s.Close()
			ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
			defer cancel()
			start := time.Now()
			_, err = backends.Campaign(ctx, s, "hostile", candidate("a", 5*time.Second))
			t.Logf("campaign: %v after %v", err, time.Since(start))
			if !errors.Is(err, backends.ErrRefused) || !strings.Contains(err.Error(), tc.want) {
				t.Errorf("campaign = %v, want ErrRefused saying %q", err, tc.want)
			}
			if took := time.Since(start); took > 10*time.Second {
				t.Errorf("campaign took %v", took)
			}
			if _, err := backends.ReadHistory(ctx, s, "hostile", 0); !errors.Is(err, backends.ErrUnavailable) || !strings.Contains(err.Error(), tc.want) {
				t.Errorf("history = %v, want ErrUnavailable saying %q", err, tc.want)
			}
		})
	}
}

// testClientCertificate: sslcert and sslkey log a role in with a client
// certificate (the server's pg_hba.conf asks one of CertAuthRole), an
// encrypted key with sslpassword; a wrong or missing passphrase is an
// error from Open, and no certificate is refused by the server.
func testClientCertificate(t *testing.T, e *env) {
	t.Setenv("HOME", t.TempDir()) // no ~/.postgresql
	e.pg.CreateRole(t, testenv.CertAuthRole, "not-used", testenv.RoleOptions{Create: true})
	base := fmt.Sprintf("host=%s port=%d dbname=postgres user=%s sslmode=verify-full sslrootcert=%s",
		e.pg.Host(), e.pg.Port(), testenv.CertAuthRole, e.pg.CAFile())
	cert, key := e.pg.ClientCert(t, testenv.CertAuthRole, "")
	rsaCert, rsaKey := e.pg.ClientCert(t, testenv.CertAuthRole, "key-passphrase")
	for _, tc := range []struct {
		name, conn, want string
		openFails        bool
	}{
		{"EC key", fmt.Sprintf("%s sslcert=%s sslkey=%s", base, cert, key), "", false},
		{"encrypted RSA key", fmt.Sprintf("%s sslcert=%s sslkey=%s sslpassword=key-passphrase", base, rsaCert, rsaKey), "", false},
		{"wrong passphrase", fmt.Sprintf("%s sslcert=%s sslkey=%s sslpassword=wrong", base, rsaCert, rsaKey), "decrypt", true},
		{"no passphrase", fmt.Sprintf("%s sslcert=%s sslkey=%s", base, rsaCert, rsaKey), "sslpassword", true},
		{"no certificate", base, "certificate", false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			s, err := postgres.Open(postgres.Config{URL: tc.conn, Prefix: prefix, Table: "cert_leases"})
			if tc.openFails {
				if err == nil || !strings.Contains(err.Error(), tc.want) || strings.Contains(err.Error(), "key-passphrase") {
					t.Errorf("Open = %v, want an error about the %s, without the passphrase", err, tc.want)
				}
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			defer s.Close()
			ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
			defer cancel()
			c := candidate("cert", 5*time.Second)
			c.Try = true
			l, err := backends.Campaign(ctx, s, "cert", c)
			if tc.want != "" {
				if !errors.Is(err, backends.ErrRefused) || !strings.Contains(err.Error(), tc.want) {
					t.Errorf("campaign = %v, want ErrRefused about the %s", err, tc.want)
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
