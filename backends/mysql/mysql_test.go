package mysql_test

import (
	"context"
	"crypto/tls"
	"crypto/x509"
	"database/sql"
	"errors"
	"fmt"
	"os"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/leaderrun/leaderrun/backends"
	"github.com/leaderrun/leaderrun/backends/backendtest"
	"github.com/leaderrun/leaderrun/backends/mysql"
	"github.com/leaderrun/leaderrun/internal/testenv"
)

const prefix = "leaderrun-test/"

// env is the shared server (TCP, a unix socket and TLS), and the
// operator's own connection to it.
type env struct {
	m  *testenv.MariaDB
	db *sql.DB
}

// TestMySQL runs every test that needs one server against the same one;
// tests that restart or kill a server start their own.
func TestMySQL(t *testing.T) {
	m := testenv.StartMariaDB(t, testenv.MariaDBOptions{TLS: true})
	e := &env{m: m, db: m.DB(t)}
	for _, tc := range []struct {
		name string
		run  func(*testing.T, *env)
	}{
		{"Conformance", testConformance},
		{"ConformanceTLS", testConformanceTLS},
		{"UnixSocket", testUnixSocket},
		{"TablesCreated", testTablesCreated},
		{"TokensAcrossDeletesByHand", testTokensAcrossDeletes},
		{"StaleHolderFenced", testStaleHolderFenced},
		{"LossByHand", testLossByHand},
		{"OneWokenPerRelease", testHerd},
		{"WithdrawnWaiterLeavesAtOnce", testWithdrawn},
		{"HolderDeathWakesFirst", testHolderDeath},
		{"FrozenFirstWaiter", testFrozenFirst},
		{"FrozenHolderLeavesTheQueue", testFrozenHolder},
		{"DocumentsBounded", testDocumentsBounded},
		{"HostileServer", testHostile},
		{"Refused", testRefused},
		{"Unreachable", testUnreachable},
	} {
		t.Run(tc.name, func(t *testing.T) { tc.run(t, e) })
	}
}

// newStore opens a store on e's server; cfg.DSN defaults to root's,
// cfg.Prefix to prefix.
func newStore(t testing.TB, e *env, cfg mysql.Config) *mysql.Store {
	t.Helper()
	if cfg.DSN == "" {
		cfg.DSN = e.m.RootDSN()
	}
	if cfg.Prefix == "" {
		cfg.Prefix = prefix
	}
	s, err := mysql.Open(cfg)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { s.Close() })
	return s
}

var lockSeq atomic.Int64

func lockName() string { return fmt.Sprintf("my-%d-%d", time.Now().UnixNano()%1e9, lockSeq.Add(1)) }

// timings are valid timings of a lease of lease, with retry as the retry
// period (at most 5/12 of the lease).
func timings(lease, retry time.Duration) backends.Timings {
	return backends.Timings{LeaseDuration: lease, RenewDeadline: lease / 2, KillGrace: lease / 4, RetryPeriod: retry}
}

var defaultTimings = timings(10*time.Second, 300*time.Millisecond)

// campaign wins lock in s as id with tm within 30 s; the lease is
// released when the test ends.
func campaign(t testing.TB, s backends.Store, lock, id string, tm backends.Timings) *backends.Lease {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	l, err := backends.Campaign(ctx, s, lock, backends.Candidate{Identity: id, Timings: tm})
	if err != nil {
		t.Fatalf("%s: campaign: %v", id, err)
	}
	t.Cleanup(func() { l.Release(context.Background(), nil) })
	return l
}

var waitFor = backendtest.WaitFor

// exec runs q with args as the operator, and fails the test if it fails.
func (e *env) exec(t testing.TB, q string, args ...any) int64 {
	t.Helper()
	res, err := e.db.Exec(q, args...)
	if err != nil {
		t.Fatalf("%s: %v", q, err)
	}
	n, _ := res.RowsAffected()
	return n
}

func testConformance(t *testing.T, e *env) {
	conformance(t, e, mysql.Config{DSN: e.m.RootDSN()})
}

// conformance runs the suite with stores of cfg, dropping a lease as an
// operator would: DELETE of the lock's row.
func conformance(t *testing.T, e *env, cfg mysql.Config) {
	cfg.Prefix = prefix
	backendtest.Run(t, backendtest.Harness{
		Open: func(t *testing.T) backends.Store {
			s, err := mysql.Open(cfg)
			if err != nil {
				t.Fatal(err)
			}
			return s
		},
		Drop: func(t *testing.T, lock string, _ *backends.Lease) {
			if e.exec(t, "DELETE FROM leaderrun_locks WHERE name = ?", prefix+lock) != 1 {
				t.Fatalf("no row of %s to delete", lock)
			}
		},
	})
}

// testConformanceTLS: the suite over TLS, as a user the server lets in
// over TLS alone, with the CA given as --mysql-ssl-ca gives it.
func testConformanceTLS(t *testing.T, e *env) {
	e.m.CreateUser(t, "tlsonly", "tls-Pa55", "ALL ON leaderrun.*")
	e.exec(t, "ALTER USER 'tlsonly'@'127.0.0.1' REQUIRE SSL")
	ca := caConfig(t, e.m.CAFile())
	dsn := e.m.DSN("tlsonly", "tls-Pa55", "leaderrun", "")
	conformance(t, e, mysql.Config{DSN: dsn, TLS: ca})

	// Without TLS the server refuses the user; with the system's roots
	// the driver refuses the server, even where the DSN said to skip the
	// check or fall back to plain text: the TLS given replaces them.
	for _, tc := range []struct {
		name string
		cfg  mysql.Config
	}{
		{"plain", mysql.Config{DSN: dsn}},
		{"unknown CA", mysql.Config{DSN: dsn + "?tls=true"}},
		{"skip-verify replaced", mysql.Config{DSN: dsn + "?tls=skip-verify", TLS: &tls.Config{}}},
		{"preferred replaced", mysql.Config{DSN: dsn + "?tls=preferred", TLS: &tls.Config{}}},
	} {
		s := newStore(t, e, tc.cfg)
		_, err := backends.Campaign(context.Background(), s, lockName(), backends.Candidate{Identity: "x", Timings: defaultTimings, Wait: 10 * time.Second})
		if !errors.Is(err, backends.ErrRefused) || !errors.Is(err, backends.ErrUnavailable) {
			t.Errorf("%s: campaign: %v, want refused", tc.name, err)
		}
	}
}

func caConfig(t *testing.T, file string) *tls.Config {
	t.Helper()
	pem, err := os.ReadFile(file)
	if err != nil {
		t.Fatal(err)
	}
	pool := x509.NewCertPool()
	pool.AppendCertsFromPEM(pem)
	return &tls.Config{RootCAs: pool, MinVersion: tls.VersionTLS12}
}

// testUnixSocket: a store over the server's unix socket, the password
// given apart from the DSN (as --mysql-password-file or MYSQL_PWD do).
func testUnixSocket(t *testing.T, e *env) {
	s := newStore(t, e, mysql.Config{DSN: "root@unix(" + e.m.SocketPath() + ")/leaderrun", Password: e.m.RootPassword})
	lock := lockName()
	l := campaign(t, s, lock, "socket", defaultTimings)
	st, err := backends.ReadStatus(context.Background(), s, lock)
	if err != nil || !st.Held || st.Token != l.Token() || !strings.Contains(st.Node, "unix(") {
		t.Errorf("status over the socket: %+v, %v", st, err)
	}
}

// testTablesCreated: a table named with its database is created with the
// two beside it on first use, by a user allowed to create; one who is
// not is refused, and may use tables that exist.
func testTablesCreated(t *testing.T, e *env) {
	e.exec(t, "CREATE DATABASE ops")
	s := newStore(t, e, mysql.Config{DSN: e.m.DSN("root", e.m.RootPassword, "", ""), Table: "ops.locks"})
	lock := lockName()
	l := campaign(t, s, lock, "ops", defaultTimings)
	var n int
	if err := e.db.QueryRow("SELECT COUNT(*) FROM information_schema.TABLES WHERE TABLE_SCHEMA = 'ops' AND TABLE_NAME IN ('locks', 'locks_tokens', 'locks_docs')").Scan(&n); err != nil || n != 3 {
		t.Fatalf("tables created in ops: %d, %v; want 3", n, err)
	}
	var holder string
	var token uint64
	if err := e.db.QueryRow("SELECT holder, token FROM ops.locks WHERE name = ?", prefix+lock).Scan(&holder, &token); err != nil || holder != "ops" || token != l.Token() {
		t.Errorf("the row in ops.locks: %q %d %v; want ops, %d", holder, token, err, l.Token())
	}

	e.m.CreateUser(t, "user_rw", "rw-Pa55", "SELECT, INSERT, UPDATE ON ops.*")
	rw := newStore(t, e, mysql.Config{DSN: e.m.DSN("user_rw", "rw-Pa55", "ops", ""), Table: "locks"})
	l.Release(context.Background(), nil)
	campaign(t, rw, lock, "rw", defaultTimings)
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	rwNew := newStore(t, e, mysql.Config{DSN: e.m.DSN("user_rw", "rw-Pa55", "ops", ""), Table: "others"})
	_, err := backends.Campaign(ctx, rwNew, lock, backends.Candidate{Identity: "rw", Timings: defaultTimings, Wait: 10 * time.Second})
	if !errors.Is(err, backends.ErrRefused) || !strings.Contains(err.Error(), "CREATE command denied") {
		t.Errorf("a user who may not create the tables: %v, want refused", err)
	}
}

// testTokensAcrossDeletesByHand: tokens grow whatever an operator
// deletes: the lock's row while held or free, the whole table, the
// counter's row; only both together start again.
func testTokensAcrossDeletes(t *testing.T, e *env) {
	s := newStore(t, e, mysql.Config{})
	lock := lockName()
	key := prefix + lock
	var last uint64
	grant := func(step string) *backends.Lease {
		l := campaign(t, s, lock, step, defaultTimings)
		if l.Token() <= last {
			t.Fatalf("%s: token %d, not above %d", step, l.Token(), last)
		}
		last = l.Token()
		return l
	}
	l := grant("first")
	e.exec(t, "DELETE FROM leaderrun_locks WHERE name = ?", key)
	backendtest.Release(t, l)
	l = grant("after the row was deleted while held")
	backendtest.Release(t, l)
	e.exec(t, "DELETE FROM leaderrun_locks WHERE name = ?", key)
	backendtest.Release(t, grant("after the free row was deleted"))
	e.exec(t, "DELETE FROM leaderrun_locks_tokens WHERE name = ?", key)
	backendtest.Release(t, grant("after the counter was deleted"))
	e.exec(t, "DELETE FROM leaderrun_locks")
	backendtest.Release(t, grant("after the table was emptied"))
}

// testStaleHolderFenced: a holder that stops renewing is taken over once
// its lease ran out by the database's clock, not before; it then can
// renew, complete and release nothing, and learns of the loss.
func testStaleHolderFenced(t *testing.T, e *env) {
	a, b := newStore(t, e, mysql.Config{}), newStore(t, e, mysql.Config{})
	lock := lockName()
	tm := timings(2*time.Second, 200*time.Millisecond)
	la := campaign(t, a, lock, "stale", tm)
	granted := time.Now()
	lb := campaign(t, b, lock, "next", tm)
	took := time.Since(granted)
	if took < 1900*time.Millisecond || took > 3*time.Second {
		t.Errorf("taken over %v after the grant, want just after the 2s lease", took)
	}
	if lb.Token() <= la.Token() {
		t.Errorf("next token %d, not above %d", lb.Token(), la.Token())
	}
	select {
	case <-la.Lost():
	case <-time.After(time.Second):
		t.Error("the stale holder did not learn of its loss within 1s")
	}
	ctx := context.Background()
	if err := la.Renew(ctx); !errors.Is(err, backends.ErrLeaseLost) {
		t.Errorf("stale renew: %v, want ErrLeaseLost", err)
	}
	// Through the store, as if the loss had not been seen yet.
	lk := a.Lock(lock).(backends.RecordLock)
	if err := lk.WriteDocHeld(ctx, backends.Doc{Name: backends.DocMarkers, Data: []byte("[]")}, backends.Record{Owner: "x", Token: la.Token()}); !errors.Is(err, backends.ErrLeaseLost) {
		t.Errorf("stale fenced write: %v, want ErrLeaseLost", err)
	}
	if _, err := lk.Keep(ctx, backends.Record{Owner: "x", Token: la.Token()}); !errors.Is(err, backends.ErrLeaseLost) {
		t.Errorf("stale keep: %v, want ErrLeaseLost", err)
	}
	now := time.Now()
	if err := la.Complete(ctx, backends.Marker{Key: "k", Identity: "stale", Token: la.Token(), At: now, Expires: now.Add(time.Hour)}); !errors.Is(err, backends.ErrLeaseLost) {
		t.Errorf("stale complete: %v, want ErrLeaseLost", err)
	}
	backendtest.Release(t, la)
	if st, err := backends.ReadStatus(ctx, b, lock); err != nil || st.Identity != "next" || st.Token != lb.Token() {
		t.Errorf("after the stale release: %+v, %v; want held by next", st, err)
	}
	if m, err := backends.ReadMarker(ctx, b, lock, "k"); err != nil || m != nil {
		t.Errorf("the stale holder's marker: %+v, %v", m, err)
	}
}

// testLossByHand: a row an operator gives to another owner, or frees, is
// a loss seen within a second.
func testLossByHand(t *testing.T, e *env) {
	s := newStore(t, e, mysql.Config{})
	for _, q := range []string{
		"UPDATE leaderrun_locks SET owner = 'someone' WHERE name = ?",
		"UPDATE leaderrun_locks SET holder = '' WHERE name = ?",
		"UPDATE leaderrun_locks SET expires = UTC_TIMESTAMP(6) WHERE name = ?",
	} {
		lock := lockName()
		l := campaign(t, s, lock, "held", defaultTimings)
		e.exec(t, q, prefix+lock)
		at := time.Now()
		select {
		case <-l.Lost():
			t.Logf("%s: loss seen after %v: %v", q, time.Since(at).Round(time.Millisecond), l.Err())
		case <-time.After(time.Second):
			t.Errorf("%s: no loss seen within 1s", q)
		}
	}
}

// testHerd: with 50 waiters, each release wakes one of them alone (the
// first in line, which takes the lock). The winner keeps the queue's named
// lock as the holder, so the next waiter sleeps on until the next release.
func testHerd(t *testing.T, e *env) {
	const waiters, releases = 50, 10
	lock := lockName()
	queue, held := mysql.NamedLocks(newStore(t, e, mysql.Config{}), lock)
	stores := make([]*mysql.Store, waiters+1)
	for i := range stores {
		stores[i] = newStore(t, e, mysql.Config{})
	}
	// The waiters woken: those whose store counted a wake-up.
	counts := func() []uint64 {
		n := make([]uint64, len(stores))
		for i, s := range stores {
			n[i] = s.Woken()
		}
		return n
	}
	cur := campaign(t, stores[0], lock, "holder", defaultTimings)
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	won := make(chan *backends.Lease, waiters)
	for i := 1; i <= waiters; i++ {
		go func() {
			l, err := backends.Campaign(ctx, stores[i], lock, backends.Candidate{Identity: fmt.Sprint("w", i), Timings: defaultTimings})
			if err == nil {
				won <- l
			}
		}()
	}
	// The first holder took the free lock, not through the queue: the
	// first in line waits for its named lock, the others for the queue's.
	// Every later holder won through the queue and keeps the queue's
	// named lock: every waiter waits for it.
	settled := func(left, first int) {
		waitFor(t, fmt.Sprintf("%d waiters in line", left), func() bool {
			return e.m.SessionsOf(t, e.db, held) == first && e.m.SessionsOf(t, e.db, queue) == left-first
		})
	}
	settled(waiters, 1)
	var max uint64
	var hand []time.Duration
	for r := range releases {
		before := counts()
		at := time.Now()
		backendtest.Release(t, cur)
		select {
		case cur = <-won:
		case <-time.After(10 * time.Second):
			t.Fatalf("release %d: no waiter won within 10s", r)
		}
		hand = append(hand, time.Since(at))
		settled(waiters-r-1, 0)
		var n uint64
		for i, c := range counts() {
			if c != before[i] {
				n++
			}
		}
		max = maxOf(max, n)
		if n != 1 {
			t.Errorf("release %d woke %d waiters, want 1", r, n)
		}
	}
	backendtest.Release(t, cur)
	t.Logf("%d waiters: one woken per release (at most %d); handovers %v", waiters, max, hand)
}

func maxOf(a, b uint64) uint64 {
	if a > b {
		return a
	}
	return b
}

// follow puts a waiter of its own for lock in s in the queue.
func follow(t *testing.T, s *mysql.Store, lock string, tm backends.Timings) backends.Follower {
	t.Helper()
	lk := s.Lock(lock).(backends.RecordLock)
	f, err := lk.Follow(context.Background(), backends.Claim{Identity: "f", Owner: lockName(), Timings: tm}, nil)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(f.Close)
	return f
}

// testWithdrawn: a waiter that leaves the queue, first in line or not,
// leaves at once: its session is killed (as a user with no privilege
// but on the lock's tables may), not left waiting in GET_LOCK until the
// server notices that its connection closed.
func testWithdrawn(t *testing.T, e *env) {
	lock := lockName()
	q, h := mysql.NamedLocks(newStore(t, e, mysql.Config{}), lock)
	if tq, th := testenv.MySQLNamedLocks("leaderrun", "leaderrun_locks", prefix+lock); tq != q || th != h {
		t.Errorf("testenv.MySQLNamedLocks says %s and %s, the store %s and %s", tq, th, q, h)
	}
	e.m.CreateUser(t, "waiter", "waiter-Pa55", "SELECT, INSERT, UPDATE, CREATE ON leaderrun.*")
	user := mysql.Config{DSN: e.m.DSN("waiter", "waiter-Pa55", "leaderrun", "")}
	queue, held := mysql.NamedLocks(newStore(t, e, user), lock)
	holder := campaign(t, newStore(t, e, user), lock, "holder", defaultTimings)
	defer backendtest.Release(t, holder)
	f1 := follow(t, newStore(t, e, user), lock, defaultTimings)
	f2 := follow(t, newStore(t, e, user), lock, defaultTimings)
	f3 := follow(t, newStore(t, e, user), lock, defaultTimings)
	if f1.Behind() || !f2.Behind() || !f3.Behind() {
		t.Fatalf("behind: %v %v %v, want the first alone ahead", f1.Behind(), f2.Behind(), f3.Behind())
	}
	waitFor(t, "two waiters in GET_LOCK", func() bool { return e.m.SessionsOf(t, e.db, queue) == 2 })
	f2.Close()
	start := time.Now()
	waitFor(t, "the second to leave", func() bool { return e.m.SessionsOf(t, e.db, queue) == 1 })
	f1.Close()
	waitFor(t, "the third to be first", func() bool { return !f3.Behind() })
	if d := time.Since(start); d > 500*time.Millisecond {
		t.Errorf("two waiters left in %v, want well under a second each", d)
	}
	waitFor(t, "the third to wait for the holder", func() bool { return e.m.SessionsOf(t, e.db, held) == 1 })
	f3.Close()
	waitFor(t, "no session left", func() bool { return e.m.SessionsOf(t, e.db, held)+e.m.SessionsOf(t, e.db, queue) == 0 })
}

// testHolderDeath: the first in line learns at once that the holder's
// connection closed, reads the row, and takes the lock when the lease ran
// out by the database's clock, not before.
func testHolderDeath(t *testing.T, e *env) {
	lock := lockName()
	a, b := newStore(t, e, mysql.Config{}), newStore(t, e, mysql.Config{})
	_, held := mysql.NamedLocks(a, lock)
	tm := timings(3*time.Second, 200*time.Millisecond)
	la := campaign(t, a, lock, "dies", tm)
	granted := time.Now()
	won := make(chan *backends.Lease, 1)
	go func() {
		l, err := backends.Campaign(context.Background(), b, lock, backends.Candidate{Identity: "next", Timings: tm})
		if err != nil {
			t.Error(err)
		}
		won <- l
	}()
	waitFor(t, "the waiter to wait for the holder", func() bool { return e.m.SessionsOf(t, e.db, held) == 1 })
	before := b.Woken()
	var id int64
	if err := e.db.QueryRow("SELECT IS_USED_LOCK(?)", held).Scan(&id); err != nil {
		t.Fatal(err)
	}
	e.exec(t, fmt.Sprintf("KILL %d", id))
	killed := time.Now()
	waitFor(t, "the waiter to be woken", func() bool { return b.Woken() > before })
	woke := time.Since(killed)
	if woke > time.Second {
		t.Errorf("the waiter woke %v after the holder's connection closed", woke)
	}
	lb := <-won
	defer backendtest.Release(t, lb)
	var left time.Duration
	if rec, err := a.Lock(lock).(backends.RecordLock).Get(context.Background()); err == nil {
		left = rec.Left
	}
	if lb.Token() <= la.Token() || time.Since(killed) > 3500*time.Millisecond || left <= 0 {
		t.Errorf("taken over %v after the holder died, token %d after %d", time.Since(killed), lb.Token(), la.Token())
	}
	t.Logf("the first in line woke %v after the holder's connection closed, and took the lock %v after its grant (lease 3s)",
		woke.Round(time.Millisecond), time.Since(granted).Round(time.Millisecond))
}

// testFrozenFirst: a first waiter that does nothing (its process frozen;
// here an operator's session that holds the queue's named lock, with the
// idle timeout of the store's own) holds up the others only until the
// server ends its idle session: then one of them takes the lock.
func testFrozenFirst(t *testing.T, e *env) {
	lock := lockName()
	queue, _ := mysql.NamedLocks(newStore(t, e, mysql.Config{}), lock)
	conn, err := e.db.Conn(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	var got int
	if _, err := conn.ExecContext(context.Background(), "SET SESSION wait_timeout = 1"); err != nil {
		t.Fatal(err)
	}
	if err := conn.QueryRowContext(context.Background(), "SELECT GET_LOCK(?, 0)", queue).Scan(&got); err != nil || got != 1 {
		t.Fatalf("GET_LOCK of the queue: %d, %v", got, err)
	}
	held := time.Now()
	tm := timings(time.Second, 200*time.Millisecond)
	l := campaign(t, newStore(t, e, mysql.Config{}), lock, "holder", tm)
	won := make(chan *backends.Lease, 2)
	for i := range 2 {
		go func() {
			l, err := backends.Campaign(context.Background(), newStore(t, e, mysql.Config{}), lock,
				backends.Candidate{Identity: fmt.Sprint("w", i), Timings: tm, Wait: 20 * time.Second})
			if err != nil {
				t.Error(err)
			}
			won <- l
		}()
	}
	waitFor(t, "two waiters in line", func() bool { return e.m.SessionsOf(t, e.db, queue) == 2 })
	backendtest.Release(t, l)
	lw := <-won
	if d := time.Since(held); d > 3*time.Second {
		t.Errorf("a waiter took the lock %v after the frozen session took the queue's named lock, want about its idle timeout (1s)", d)
	}
	t.Logf("taken %v after the frozen session took the queue's named lock (idle timeout 1s)", time.Since(held).Round(time.Millisecond))
	if lw != nil {
		backendtest.Release(t, lw)
	}
	if lw = <-won; lw != nil {
		backendtest.Release(t, lw)
	}
}

// testFrozenHolder: a holder that won through the queue keeps its queue
// session; frozen (here: it renews nothing, and sends nothing), the server
// ends that session once it idled for a lease, which wakes the next
// waiter, and that one takes the lock as the lease runs out by the
// database's clock: not before, and not leases later.
func testFrozenHolder(t *testing.T, e *env) {
	lock := lockName()
	queue, held := mysql.NamedLocks(newStore(t, e, mysql.Config{}), lock)
	tm := timings(3*time.Second, 200*time.Millisecond)
	first := campaign(t, newStore(t, e, mysql.Config{}), lock, "first", tm)
	wait := func(id string) <-chan *backends.Lease {
		won := make(chan *backends.Lease, 1)
		go func() {
			l, err := backends.Campaign(context.Background(), newStore(t, e, mysql.Config{}), lock,
				backends.Candidate{Identity: id, Timings: tm, Wait: 20 * time.Second})
			if err != nil {
				t.Error(err)
			}
			won <- l
		}()
		return won
	}
	wonFrozen := wait("frozen")
	waitFor(t, "the first in line", func() bool { return e.m.SessionsOf(t, e.db, held) == 1 })
	wonNext := wait("next")
	waitFor(t, "the next in line", func() bool { return e.m.SessionsOf(t, e.db, queue) == 1 })
	backendtest.Release(t, first)
	frozen := <-wonFrozen
	granted := time.Now()
	next := <-wonNext
	took := time.Since(granted)
	if frozen == nil || next == nil {
		t.Fatal("a campaign failed")
	}
	defer backendtest.Release(t, next)
	defer backendtest.Release(t, frozen)
	if next.Token() <= frozen.Token() || took < 2900*time.Millisecond || took > 4500*time.Millisecond {
		t.Errorf("the next waiter took the lock %v after the frozen holder's grant (token %d after %d), want just after the 3s lease",
			took, next.Token(), frozen.Token())
	}
	t.Logf("taken %v after the frozen holder's grant (lease 3s)", took.Round(time.Millisecond))
}

// testDocumentsBounded: a document larger than a document may be, made
// by hand, is read to its bound and refused.
func testDocumentsBounded(t *testing.T, e *env) {
	s := newStore(t, e, mysql.Config{})
	lock := lockName()
	l := campaign(t, s, lock, "docs", defaultTimings)
	backendtest.ReleaseTerm(t, l, &backends.Term{Identity: "docs", Token: l.Token(), End: backends.EndExited})
	e.exec(t, "UPDATE leaderrun_locks_docs SET data = REPEAT('x', 4 << 20) WHERE name = ? AND doc = 'history'", prefix+lock)
	_, err := backends.ReadHistory(context.Background(), s, lock, 0)
	if !errors.Is(err, backends.ErrRefused) {
		t.Errorf("history of 4 MiB: %v, want refused", err)
	}
}

// testRefused: credentials, privileges and a database that is not there
// end a campaign at once, even one that would wait; no message shows the
// password.
func testRefused(t *testing.T, e *env) {
	const secret = "wrong-Pa55-word"
	e.m.CreateUser(t, "nobody", secret, "")
	e.m.CreateUser(t, "reader", secret, "SELECT ON leaderrun.*")
	for _, tc := range []struct{ name, dsn string }{
		{"wrong password", e.m.DSN("root", secret, "leaderrun", "")},
		{"no privileges", e.m.DSN("nobody", secret, "leaderrun", "")},
		{"read only", e.m.DSN("reader", secret, "leaderrun", "")},
		{"no database", e.m.DSN("root", e.m.RootPassword, "nowhere", "")},
	} {
		s := newStore(t, e, mysql.Config{DSN: tc.dsn})
		start := time.Now()
		_, err := backends.Campaign(context.Background(), s, lockName(), backends.Candidate{Identity: "x", Timings: defaultTimings, Wait: 10 * time.Second})
		if !errors.Is(err, backends.ErrRefused) || time.Since(start) > 2*time.Second {
			t.Errorf("%s: %v after %v, want refused at once", tc.name, err, time.Since(start))
		}
		if err != nil && strings.Contains(err.Error(), secret) {
			t.Errorf("%s: the message shows the password: %v", tc.name, err)
		}
	}
}

// testUnreachable: nothing listening is unavailable, never refused: a
// --wait retries it until the wait ends.
func testUnreachable(t *testing.T, e *env) {
	port := testenv.FreePort(t, "127.0.0.1")
	s := newStore(t, e, mysql.Config{DSN: fmt.Sprintf("root:%s@tcp(127.0.0.1:%d)/leaderrun", e.m.RootPassword, port)})
	start := time.Now()
	_, err := backends.Campaign(context.Background(), s, lockName(), backends.Candidate{Identity: "x", Timings: defaultTimings, Wait: 2 * time.Second})
	if !errors.Is(err, backends.ErrUnavailable) || errors.Is(err, backends.ErrRefused) || time.Since(start) < 2*time.Second {
		t.Errorf("nothing listening: %v after %v, want unavailable once the wait ended", err, time.Since(start))
	}
	if err != nil && strings.Contains(err.Error(), e.m.RootPassword) {
		t.Errorf("the message shows the password: %v", err)
	}
}
