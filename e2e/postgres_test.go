//go:build linux

package e2e

import (
	"context"
	"errors"
	"fmt"
	"net"
	"net/url"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/leaderrun/leaderrun/internal/testenv"
)

// pgTestTimings keep the tests fast: the database expires a lease 3 s
// after its last renewal; the child gets the kill signal 2 s after the
// send time of the last acknowledged renewal and SIGKILL 500 ms later, so
// it is dead at least 500 ms before anyone can take the lock.
var pgTestTimings = timings{lease: 3 * time.Second, deadline: 2 * time.Second, retry: 500 * time.Millisecond, grace: 500 * time.Millisecond}

var pgTimings = pgTestTimings.flags()

const (
	pgLease = 3 * time.Second
	pgRetry = 500 * time.Millisecond
)

// postgresStore is PostgreSQL in the scenarios' matrix: one server, the
// superuser's URL in LEADERRUN_POSTGRES_URL (as the flag's help
// recommends: not on the command line). Waiters are notified of a
// release, and of their holder's loss, by the table's triggers.
func postgresStore() *store {
	return &store{
		name: "postgres", start: startPostgresStore, timings: pgTestTimings,
		// The database's clock expires the lease; a notified waiter tries
		// again at that moment, one that polls within a retry period.
		takeover: pgLease + pgRetry + 500*time.Millisecond, handover: 300 * time.Millisecond,
		notice: 100 * time.Millisecond, statusBound: pgLease + 5*time.Second,
		expires: true, ttl: true, remaining: true, durable: true,
		// The database expires the lease 1.2 s after the last renewal, to
		// the microsecond, and a notified waiter tries again at that
		// moment: a takeover and a 1 s job fit in the fleet's --wait 4s.
		onceTimings:   timings{lease: 1200 * time.Millisecond, deadline: 800 * time.Millisecond, retry: 200 * time.Millisecond, grace: 300 * time.Millisecond},
		escapeTimings: timings{lease: 3 * time.Second, deadline: 2 * time.Second, retry: 500 * time.Millisecond, grace: escapeGrace},
		credentials:   []string{"LEADERRUN_POSTGRES_URL"},
		kept:          []string{"PGPASSWORD=job-secret", "DATABASE_URL=postgres://job@db/data"},
	}
}

// A lock's history and markers are two documents, rows of the markers
// table keyed '#history' and '#markers', each a JSON array in identity.
// pgTermsSQL counts the terms of lock $1 in its history.
const pgTermsSQL = `coalesce((SELECT jsonb_array_length(identity::jsonb) FROM leaderrun_leases_markers
	WHERE name = $1 AND key = '#history'), 0)`

// pgMarkerSQL selects what of lock $1's marker for once-key $2 (m) as
// what says, ” if there is none.
func pgMarkerSQL(what string) string {
	return `SELECT coalesce((SELECT ` + what + ` FROM leaderrun_leases_markers, jsonb_array_elements(identity::jsonb) m
	WHERE name = $1 AND key = '#markers' AND m->>'key' = $2), '')`
}

func startPostgresStore(t *testing.T) *target {
	// The scenarios share the server: a pool of 10 candidates and 5
	// stalled trials at once hold up to 3 connections each.
	pg := testenv.StartPostgresWith(t, testenv.PostgresOptions{MaxConnections: 400})
	e := newPgEnv(t, pg)
	vars := []string{"LEADERRUN_POSTGRES_URL=" + e.url}
	row := func(sql string) func(t *testing.T, e *env, lock string) time.Time {
		return func(t *testing.T, _ *env, lock string) time.Time {
			sent := time.Now()
			if n := e.exec(t, sql, "leaderrun/"+lock); n != 1 {
				t.Fatalf("%s changed %d rows, want 1", sql, n)
			}
			return sent
		}
	}
	// Its log says mode=notify or mode=poll, in text or in JSON.
	listening := func(p *proc) bool {
		out := p.stderr.String()
		return strings.Contains(out, "mode=") || strings.Contains(out, `"mode":`)
	}
	return &target{
		env: vars, key: keyUnder("leaderrun/%s"),
		// A candidate that waits, and a holder, listen for notifications
		// (mode=notify), or poll (mode=poll).
		waiting: func(*testing.T, string) func(*proc) bool { return listening }, settled: listening,
		link: pg.Addr(),
		via: func(addr string) ([]string, []string) {
			return nil, []string{"LEADERRUN_POSTGRES_URL=" + e.via(addr)}
		},
		// The trigger's notification reports each at once; a renewal
		// would, within --retry-period.
		losses: []loss{
			{name: "Delete", says: []string{"deleted"}, do: row("DELETE FROM leaderrun_leases WHERE name = $1")},
			{name: "UpdateHolder", do: row("UPDATE leaderrun_leases SET holder = 'intruder' WHERE name = $1")},
			{name: "UpdateTokenAndHolder", do: row("UPDATE leaderrun_leases SET holder = 'intruder', token = nextval('leaderrun_leases_token_seq') WHERE name = $1")},
		},
		// The token comes from a sequence: deleting the rows does not
		// take it back.
		wipe: func(t *testing.T, lock string) {
			e.exec(t, "DELETE FROM leaderrun_leases WHERE name = $1", "leaderrun/"+lock)
		},
		loseCommand: func(t *testing.T, lock string) string {
			return fmt.Sprintf(`PGPASSWORD=%s %s -X -q -h %s -p %d -U postgres -d postgres -c "DELETE FROM leaderrun_leases WHERE name = 'leaderrun/%s'"`,
				pg.Password, filepath.Join(e.bin, "psql"), pg.Host(), pg.Port(), lock)
		},
		record: func(t *testing.T, lock string) string {
			return e.scalar(t, `SELECT coalesce((SELECT holder || ' ' || owner || ' ' || token FROM leaderrun_leases WHERE name = $1), 'none')
				|| ', terms ' || `+pgTermsSQL, "leaderrun/"+lock)
		},
		marker: func(t *testing.T, lock, key string) string {
			return e.scalar(t, pgMarkerSQL("m->>'identity'"), "leaderrun/"+lock, key)
		},
		stopServer: pg.Stop, startServer: pg.Start,
	}
}

// pgEnv is a PostgreSQL server, and a superuser pool that plays the
// operator.
type pgEnv struct {
	pg    *testenv.Postgres
	admin *pgxpool.Pool
	bin   string // directory of psql
	url   string // the superuser's, directly to the server
}

func newPgEnv(t *testing.T, pg *testenv.Postgres) *pgEnv {
	t.Helper()
	admin, err := pgxpool.New(context.Background(), pg.SuperuserURL())
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(admin.Close)
	e := &pgEnv{pg: pg, admin: admin, bin: testenv.PostgresBinDir(t), url: pg.SuperuserURL()}
	// Connect now, so that the operator's statements are one round trip
	// each.
	e.exec(t, "SELECT 1")
	return e
}

// TestPostgres runs what only PostgreSQL has: PgBouncer in transaction
// mode (no notifications: loss and release seen by polling), its roles
// and privileges, its errors, libpq's variables and files, and the
// fencing example. The subtests share one server and run one after the
// other: most of them measure reaction times.
func TestPostgres(t *testing.T) {
	t.Parallel()
	e := newPgEnv(t, testenv.StartPostgres(t))
	for _, tc := range []struct {
		name string
		run  func(*testing.T, *pgEnv)
	}{
		{"LossThroughPgBouncer", testPgLossThroughPgBouncer},
		{"Kill9FollowerPollsThroughPgBouncer", testPgKill9Polling},
		{"WaitPolling", testPgWaitPolling},
		{"Refused", testPgRefused},
		{"NoCreatePrivilege", testPgNoCreatePrivilege},
		{"PermissionDenied", testPgPermissionDenied},
		{"StatusTimeout", testPgStatusTimeout},
		{"MinimalGrants", testPgMinimalGrants},
		{"ConnectionsPerProcess", testPgConnections},
		{"OnceLossBeforeMarker", testPgOnceLossBeforeMarker},
		{"FencingExample", testPgFencingExample},
		{"TargetSessionAttrs", testPgTargetSessionAttrs},
		{"ChannelBinding", testPgChannelBinding},
		{"ServiceFile", testPgServiceFile},
	} {
		t.Run(tc.name, func(t *testing.T) { tc.run(t, e) })
	}
}

// exec runs sql as the superuser and returns the rows it affected.
func (e *pgEnv) exec(t *testing.T, sql string, args ...any) int64 {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	tag, err := e.admin.Exec(ctx, sql, args...)
	if err != nil {
		t.Fatalf("%s: %v", sql, err)
	}
	return tag.RowsAffected()
}

// scalar runs a query of one value as the superuser.
func (e *pgEnv) scalar(t *testing.T, sql string, args ...any) string {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	var v string
	if err := e.admin.QueryRow(ctx, sql, args...).Scan(&v); err != nil {
		t.Fatalf("%s: %v", sql, err)
	}
	return v
}

// libpq is the environment that points libpq clients (psql, and leaderrun
// with --backend postgres) at the server as the superuser, with psql in
// PATH.
func (e *pgEnv) libpq() []string {
	return []string{"PGHOST=" + e.pg.Host(), "PGPORT=" + strconv.Itoa(e.pg.Port()), "PGUSER=" + testenv.PostgresSuperuser,
		"PGPASSWORD=" + e.pg.Password, "PGDATABASE=postgres", "PGSSLMODE=disable", "PGCONNECT_TIMEOUT=5",
		"PATH=" + e.bin + string(os.PathListSeparator) + os.Getenv("PATH")}
}

// pgURL is a connection URL to addr (the server, a proxy or PgBouncer).
func pgURL(addr, role, password string, query ...string) string {
	u := url.URL{Scheme: "postgres", User: url.UserPassword(role, password), Host: addr, Path: "/postgres",
		RawQuery: strings.Join(append([]string{"sslmode=disable"}, query...), "&")}
	return u.String()
}

// via is the superuser's URL through addr.
func (e *pgEnv) via(addr string) string { return pgURL(addr, testenv.PostgresSuperuser, e.pg.Password) }

// run starts leaderrun on lock, connected by url given in
// LEADERRUN_POSTGRES_URL (as the flag's help recommends: not on the
// command line), with the recording child in mode.
func (e *pgEnv) run(t *testing.T, events, mode, url, lock, id string, extra ...string) *proc {
	t.Helper()
	args := append([]string{"--lock", lock, "--identity", id}, pgTimings...)
	args = append(append(args, extra...), "--")
	return start(t, append(childEnv(events, mode), "LEADERRUN_POSTGRES_URL="+url), append(args, childArgv(t)...)...)
}

// bouncer starts a PgBouncer in transaction mode in front of the server,
// for the superuser.
func (e *pgEnv) bouncer(t *testing.T) *testenv.PgBouncer {
	t.Helper()
	return testenv.StartPgBouncer(t, e.pg, "transaction", map[string]string{testenv.PostgresSuperuser: e.pg.Password})
}

// pgOutput runs leaderrun to the end with env added, and returns its
// stdout (and stderr) and exit code.
func pgOutput(t *testing.T, env []string, args ...string) (stdout, stderr string, code int) {
	t.Helper()
	cmd := exec.Command(testenv.Leaderrun(t), args...)
	cmd.Env = append(os.Environ(), env...)
	var errBuf syncBuffer
	cmd.Stderr = &errBuf
	out, err := cmd.Output()
	var ee *exec.ExitError
	switch {
	case err == nil:
	case errors.As(err, &ee):
		code = ee.ExitCode()
	default:
		t.Fatalf("leaderrun %v: %v", args, err)
	}
	return string(out), errBuf.String(), code
}

// waitListening waits until p's backend listens for notifications (its
// log says mode=notify), or polls (mode=poll): a candidate in that state
// has campaigned and waits.
func waitListening(t *testing.T, p *proc, mode string) {
	t.Helper()
	waitFor(t, 10*time.Second, "the candidate to log mode="+mode, func() bool {
		return strings.Contains(p.stderr.String(), "mode="+mode)
	})
}

func pgEvents(t *testing.T) string { return filepath.Join(t.TempDir(), "events") }

// testPgLossThroughPgBouncer (S3): an operator deleting the leader's
// row, or giving it to another holder with an UPDATE, stops the child
// within 1 s and leaderrun exits 76, also through PgBouncer in transaction
// mode, where notifications do not arrive (TestStores/postgres covers a
// direct connection): the next renewal sees it, within --retry-period
// (500 ms here).
func testPgLossThroughPgBouncer(t *testing.T, e *pgEnv) {
	bouncer := e.bouncer(t)
	for _, tc := range []struct {
		name, sql string
		bouncer   bool
	}{
		{"DeleteThroughPgBouncer", "DELETE FROM leaderrun_leases WHERE name = $1", true},
		{"UpdateHolderThroughPgBouncer", "UPDATE leaderrun_leases SET holder = 'intruder' WHERE name = $1", true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			var lat []time.Duration
			for i := range trials(t, 3) {
				events := pgEvents(t)
				lock := fmt.Sprintf("loss-%s-%d", strings.ToLower(tc.name), i)
				u, mode := e.url, "notify"
				if tc.bouncer {
					u, mode = e.via(bouncer.Addr()), "poll"
				}
				p := e.run(t, events, "forever", u, lock, "leader")
				waitEvents(t, events, 10*time.Second, "the child", etcdHas("start", "leader"))
				waitListening(t, p, mode)
				before := time.Now()
				if n := e.exec(t, tc.sql, "leaderrun/"+lock); n != 1 {
					t.Fatalf("%s changed %d rows, want 1", tc.sql, n)
				}
				took := time.Since(before)
				evs := waitEvents(t, events, 3*time.Second, "the kill signal", etcdHas("signal", "leader"))
				sig, _ := etcdFind(evs, "signal", "leader")
				d := sig.At.Sub(before)
				lat = append(lat, d)
				t.Logf("trial %d: child signalled %v after the statement was sent (the statement took %v)",
					i, d.Round(time.Microsecond), took.Round(time.Microsecond))
				if d > time.Second {
					t.Errorf("trial %d: child signalled %v after the statement, want within 1s", i, d)
				}
				if code := p.wait(10 * time.Second); code != 76 {
					t.Errorf("trial %d: leaderrun exited %d, want 76", i, code)
				}
			}
			t.Logf("%s (%s): statement → kill signal: %s", tc.name, map[bool]string{false: "notifications", true: "polling"}[tc.bouncer],
				summary(lat))
		})
	}
}

// testPgKill9Polling: SIGKILL of leaderrun alone takes its child down
// within 1 s, and a follower that polls every retry period through
// PgBouncer (TestStores/postgres has it notified) starts its child within
// lease-duration + retry-period + 0.5 s, once the database's clock says
// that the dead leader's lease expired.
func testPgKill9Polling(t *testing.T, e *pgEnv) {
	bouncer := e.bouncer(t)
	for _, tc := range []struct {
		name    string
		bouncer bool
	}{{"FollowerPollsThroughPgBouncer", true}} {
		t.Run(tc.name, func(t *testing.T) {
			var gones, takes []time.Duration
			bound := pgLease + pgRetry + 500*time.Millisecond
			for i := range trials(t, 3) {
				events := pgEvents(t)
				lock := fmt.Sprintf("kill9-%t-%d", tc.bouncer, i)
				leader := e.run(t, events, "forever", e.url, lock, "leader")
				evs := waitEvents(t, events, 10*time.Second, "the leader's child", etcdHas("start", "leader"))
				old, _ := etcdFind(evs, "start", "leader")
				u, mode := e.url, "notify"
				if tc.bouncer {
					u, mode = e.via(bouncer.Addr()), "poll"
				}
				follower := e.run(t, events, "forever", u, lock, "follower")
				waitListening(t, follower, mode)
				killed := time.Now()
				if err := syscall.Kill(leader.pid(), syscall.SIGKILL); err != nil {
					t.Fatal(err)
				}
				waitFor(t, 2*time.Second, "the leader's child to die", func() bool { return !alive(old.Pid) })
				gone := time.Since(killed)
				evs = waitEvents(t, events, bound+5*time.Second, "the follower's child", etcdHas("start", "follower"))
				next, _ := etcdFind(evs, "start", "follower")
				took := next.At.Sub(killed)
				gones, takes = append(gones, gone), append(takes, took)
				t.Logf("trial %d: old child gone %v after kill -9; follower's child started %v after it; tokens %d then %d",
					i, gone.Round(time.Microsecond), took.Round(time.Millisecond), old.Token, next.Token)
				if gone > time.Second {
					t.Errorf("trial %d: old child outlived leaderrun by %v, want under 1s", i, gone)
				}
				if took > bound {
					t.Errorf("trial %d: follower's child started %v after the kill, want within lease + retry + 0.5s = %v", i, took, bound)
				}
				if next.Token <= old.Token {
					t.Errorf("trial %d: follower's token %d not greater than %d", i, next.Token, old.Token)
				}
				follower.signal(syscall.SIGTERM)
				follower.wait(10 * time.Second)
			}
			t.Logf("kill -9 of the leader (%s): old child gone after %s; follower's child started after %s (bound %v)",
				tc.name, summary(gones), summary(takes), bound)
		})
	}
}

// testPgWaitPolling: --wait 2s on a held lock, polling through
// PgBouncer (TestStores/postgres waits notified), gives up after about
// 2 s with exit 75. (Not less: a first read through a PgBouncer just
// started, on a loaded machine, has taken over 500 ms, and a wait that
// no answer came within is exit 69.)
func testPgWaitPolling(t *testing.T, e *pgEnv) {
	const lock, wait = "tw", 2 * time.Second
	events := pgEvents(t)
	e.run(t, events, "forever", e.url, lock, "holder")
	waitEvents(t, events, 10*time.Second, "the holder's child", etcdHas("start", "holder"))
	u := e.via(e.bouncer(t).Addr())
	began := time.Now()
	code := e.run(t, events, "exit:0", u, lock, "wait-poll", "--wait", wait.String()).wait(10 * time.Second)
	took := time.Since(began)
	t.Logf("--wait %v (poll) on a held lock: exit %d after %v", wait, code, took.Round(time.Millisecond))
	if code != 75 {
		t.Errorf("--wait %v (poll) exited %d, want 75", wait, code)
	}
	if took < wait || took > wait+time.Second {
		t.Errorf("--wait %v (poll) gave up after %v, want about %v", wait, took, wait)
	}
	if n := count(readEvents(t, events), "start"); n != 1 {
		t.Errorf("%d children started, want the holder's alone", n)
	}
}

// testPgRefused: a wrong password, a server that refuses connections and
// one that accepts them and says nothing are exit 69, in every mode,
// naming the host and port and never the password, whether it came on
// the command line or in PGPASSWORD.
func testPgRefused(t *testing.T, e *pgEnv) {
	const secret = "Wr0ng-s3cret-pw"
	closed := fmt.Sprintf("127.0.0.1:%d", testenv.FreePort(t, "127.0.0.1"))
	// A listener that never accepts: the kernel completes the handshake
	// and nothing ever answers.
	silent, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer silent.Close()
	libpq := func(addr string) []string {
		host, port, _ := net.SplitHostPort(addr)
		return []string{"PGHOST=" + host, "PGPORT=" + port, "PGUSER=postgres", "PGPASSWORD=" + secret, "PGDATABASE=postgres",
			"PGSSLMODE=disable", "PGCONNECT_TIMEOUT=1"}
	}
	for _, tc := range []struct {
		name, addr, want string
		args, env        []string
	}{
		{name: "WrongPasswordInFlag", addr: e.pg.Addr(), want: "password authentication failed",
			args: []string{"--postgres-url", pgURL(e.pg.Addr(), "postgres", secret)}},
		{name: "WrongPasswordInPGPASSWORD", addr: e.pg.Addr(), want: "password authentication failed",
			args: []string{"--backend", "postgres"}, env: libpq(e.pg.Addr())},
		{name: "NothingListening", addr: closed, want: "connection refused",
			args: []string{"--postgres-url", pgURL(closed, "postgres", secret, "connect_timeout=1")}},
		{name: "NoAnswer", addr: silent.Addr().String(), want: "timeout",
			args: []string{"--backend", "postgres"}, env: libpq(silent.Addr().String())},
	} {
		for _, mode := range []string{"try", "wait", "status", "history"} {
			t.Run(tc.name+"/"+mode, func(t *testing.T) {
				args := append([]string{"--lock", "refused"}, tc.args...)
				switch mode {
				case "try":
					args = append(append(args, "--try", "--"), childArgv(t)...)
				case "wait":
					// A refusal ends it at once; no answer, when the wait does.
					args = append(append(args, "--wait", "1s", "--"), childArgv(t)...)
				default:
					args = append([]string{mode}, args...)
				}
				began := time.Now()
				stdout, stderr, code := pgOutput(t, append(childEnv(pgEvents(t), "exit:0"), tc.env...), args...)
				took := time.Since(began)
				out := stdout + stderr
				t.Logf("exit %d after %v: %s", code, took.Round(time.Millisecond), strings.TrimSpace(out))
				if code != 69 {
					t.Errorf("exit %d, want 69", code)
				}
				want := tc.want
				if mode == "wait" && tc.name == "NoAnswer" {
					// The wait ends the connect attempt it cut short.
					want = "within --wait 1s"
				}
				if !strings.Contains(out, tc.addr) || !strings.Contains(out, want) {
					t.Errorf("output does not name %s and say %q", tc.addr, want)
				}
				if strings.Contains(out, secret) {
					t.Errorf("output shows the password")
				}
				if took > 4*time.Second {
					t.Errorf("took %v, want about the 1s connect timeout (or --wait 1s) at most", took)
				}
			})
		}
	}
}

// testPgPermissionDenied: a role that may read the tables but not write
// them is refused for good, in every mode: exit 69 within a few seconds,
// saying permission denied on the lease table, neither retried for ever
// nor taken for a held lock. It may still read the status.
func testPgPermissionDenied(t *testing.T, e *pgEnv) {
	const pw = "reader-pw"
	if code := e.run(t, pgEvents(t), "exit:0", e.url, "denied-setup", "owner").wait(10 * time.Second); code != 0 {
		t.Fatalf("the owner's run exited %d", code)
	}
	e.pg.CreateRole(t, "reader", pw, testenv.RoleOptions{})
	e.exec(t, "GRANT SELECT ON leaderrun_leases, leaderrun_leases_markers, leaderrun_leases_history TO reader")
	env := []string{"LEADERRUN_POSTGRES_URL=" + pgURL(e.pg.Addr(), "reader", pw)}
	for _, tc := range []struct {
		name string
		mode []string
	}{{"Wait", nil}, {"Try", []string{"--try"}}, {"Wait5s", []string{"--wait", "5s"}}} {
		mode := tc.mode
		t.Run(tc.name, func(t *testing.T) {
			began := time.Now()
			_, stderr, code := pgOutput(t, env, append(append([]string{"--lock", "denied"}, mode...), "--", "/bin/true")...)
			took := time.Since(began)
			t.Logf("exit %d after %v: %s", code, took.Round(time.Millisecond), grep(stderr, "level=ERROR"))
			if code != 69 || !strings.Contains(stderr, "permission denied for table leaderrun_leases") || !strings.Contains(stderr, e.pg.Addr()) {
				t.Errorf("exit %d; want 69 saying permission denied for table leaderrun_leases, naming %s", code, e.pg.Addr())
			}
			if took > 3*time.Second {
				t.Errorf("took %v: a refusal must not be retried", took)
			}
			if strings.Contains(stderr, pw) {
				t.Errorf("output shows the password")
			}
		})
	}
	if out, errs, code := pgOutput(t, env, "status", "--lock", "denied"); code != 3 {
		t.Errorf("status as a role that may read: exit %d, want 3 (no leader)\n%s%s", code, out, errs)
	}
}

// testPgStatusTimeout: status and history give up at --timeout when the
// server does not answer, before the connect timeout: exit 69 naming the
// server, not a bare "context deadline exceeded".
func testPgStatusTimeout(t *testing.T, e *pgEnv) {
	silent, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer silent.Close()
	env := []string{"LEADERRUN_POSTGRES_URL=" + pgURL(silent.Addr().String(), "postgres", "pw", "connect_timeout=10")}
	for _, cmd := range []string{"status", "history"} {
		began := time.Now()
		_, stderr, code := pgOutput(t, env, cmd, "--lock", "timeout", "--timeout", "500ms")
		took := time.Since(began)
		t.Logf("%s --timeout 500ms: exit %d after %v: %s", cmd, code, took.Round(time.Millisecond), strings.TrimSpace(stderr))
		if code != 69 || !strings.Contains(stderr, silent.Addr().String()) {
			t.Errorf("%s: exit %d; want 69 naming %s", cmd, code, silent.Addr())
		}
		if took > 2*time.Second {
			t.Errorf("%s took %v, want about the 500ms --timeout", cmd, took)
		}
	}
}

// testPgNoCreatePrivilege: a role that may not create tables, on a lease
// table that does not exist, exits 69 naming the table and the privilege.
func testPgNoCreatePrivilege(t *testing.T, e *pgEnv) {
	const pw = "no-create-pw"
	e.pg.CreateRole(t, "no_create", pw, testenv.RoleOptions{})
	_, stderr, code := pgOutput(t, []string{"LEADERRUN_POSTGRES_URL=" + pgURL(e.pg.Addr(), "no_create", pw)},
		"--lock", "x", "--postgres-table", "missing_leases", "--", "/bin/true")
	t.Logf("exit %d: %s", code, strings.TrimSpace(stderr))
	if code != 69 {
		t.Errorf("exit %d, want 69", code)
	}
	// The log quotes the error: its own quotes are escaped.
	for _, want := range []string{"table missing_leases", "permission denied", "needs the CREATE privilege on schema", "public", "no_create", e.pg.Addr()} {
		if !strings.Contains(stderr, want) {
			t.Errorf("output does not say %q", want)
		}
	}
	if strings.Contains(stderr, pw) {
		t.Errorf("output shows the password")
	}
}

// pgMinimalGrants are the privileges that docs/backends/postgres.md lists
// for a role using tables that someone else created (%[1]s: the role).
const pgMinimalGrants = `GRANT SELECT, INSERT, UPDATE ON leaderrun_leases TO %[1]s;
GRANT SELECT, INSERT, UPDATE, DELETE ON leaderrun_leases_markers TO %[1]s;
GRANT SELECT, INSERT, DELETE ON leaderrun_leases_history TO %[1]s;
GRANT USAGE ON SEQUENCE leaderrun_leases_token_seq TO %[1]s;`

// testPgMinimalGrants: with the tables and triggers created by their owner
// (the superuser's runs before), a role that has only the documented
// privileges runs a job, records and reads its completion marker and its
// history, shows status, is refused --try on a held lock, and is told of
// its loss by notification.
func testPgMinimalGrants(t *testing.T, e *pgEnv) {
	const pw = "app-pw"
	events := pgEvents(t)
	// The owner's first run creates the tables and triggers, if no
	// earlier test did.
	if code := e.run(t, events, "exit:0", e.url, "grants-setup", "owner").wait(10 * time.Second); code != 0 {
		t.Fatalf("the owner's run exited %d", code)
	}
	e.pg.CreateRole(t, "app", pw, testenv.RoleOptions{})
	e.exec(t, fmt.Sprintf(pgMinimalGrants, "app"))
	app := pgURL(e.pg.Addr(), "app", pw)
	env := []string{"LEADERRUN_POSTGRES_URL=" + app}
	for _, want := range []int{0, 0} {
		p := e.run(t, events, "exit:0", app, "grants", "app", "--once-key", "k")
		if code := p.wait(10 * time.Second); code != want {
			t.Fatalf("run as app: exit %d, want %d\n%s", code, want, p.stderr.String())
		}
		if strings.Contains(p.stderr.String(), "level=WARN") || strings.Contains(p.stderr.String(), "level=ERROR") {
			t.Errorf("run as app logged a warning or an error:\n%s", p.stderr.String())
		}
	}
	if n := count(readEvents(t, events), "start"); n != 2 {
		t.Errorf("%d jobs ran, want 2 (the owner's, and app's first): the second run finds the marker", n)
	}
	if out, _, code := pgOutput(t, env, "history", "--lock", "grants"); code != 0 || !strings.Contains(out, "exited 0") || !strings.Contains(out, "skipped") {
		t.Errorf("history as app: exit %d\n%s", code, out)
	}
	holder := e.run(t, events, "forever", app, "grants-held", "app-holder")
	waitEvents(t, events, 10*time.Second, "the holder's job", etcdHas("start", "app-holder"))
	waitListening(t, holder, "notify")
	if out, errs, code := pgOutput(t, env, "status", "--lock", "grants-held"); code != 0 || !strings.Contains(out, "app-holder") {
		t.Errorf("status as app: exit %d\n%s%s", code, out, errs)
	}
	if code := e.run(t, events, "exit:0", app, "grants-held", "app-try", "--try").wait(10 * time.Second); code != 75 {
		t.Errorf("--try as app on a held lock: exit %d, want 75", code)
	}
	deleted := time.Now()
	e.exec(t, "DELETE FROM leaderrun_leases WHERE name = 'leaderrun/grants-held'")
	evs := waitEvents(t, events, 3*time.Second, "the kill signal", etcdHas("signal", "app-holder"))
	sig, _ := etcdFind(evs, "signal", "app-holder")
	t.Logf("as a role with only the documented grants: marker, history, status, --try work; row deleted → kill signal after %v",
		sig.At.Sub(deleted).Round(time.Microsecond))
	if d := sig.At.Sub(deleted); d > time.Second {
		t.Errorf("kill signal %v after the delete, want within 1s", d)
	}
	if code := holder.wait(10 * time.Second); code != 76 {
		t.Errorf("holder exited %d, want 76", code)
	}
}

// testPgConnections counts the server connections of one leader and one
// waiting follower (pg_stat_activity, application_name leaderrun): what
// each leaderrun costs the server's max_connections.
func testPgConnections(t *testing.T, e *pgEnv) {
	conns := func() int {
		n, _ := strconv.Atoi(e.scalar(t, "SELECT count(*) FROM pg_stat_activity WHERE application_name = 'leaderrun'"))
		return n
	}
	waitFor(t, 10*time.Second, "the earlier tests' connections to close", func() bool { return conns() == 0 })
	events := pgEvents(t)
	renewals := func(p *proc) int { return strings.Count(p.stderr.String(), "lease renewed") }
	leader := e.run(t, events, "forever", e.url, "conns", "leader", "--log-level", "debug")
	waitEvents(t, events, 10*time.Second, "the leader's job", etcdHas("start", "leader"))
	waitListening(t, leader, "notify")
	waitFor(t, 10*time.Second, "three renewals", func() bool { return renewals(leader) >= 3 })
	alone := conns()
	follower := e.run(t, events, "forever", e.url, "conns", "follower")
	waitListening(t, follower, "notify")
	from := renewals(leader)
	waitFor(t, 10*time.Second, "three more renewals", func() bool { return renewals(leader) >= from+3 })
	both := conns()
	t.Logf("server connections: a leader %d, a waiting follower %d (pool of at most 2, and the listening connection)", alone, both-alone)
	if alone > 3 || both-alone > 3 {
		t.Errorf("a leader holds %d connections and a follower %d, want at most 3 each", alone, both-alone)
	}
	follower.signal(syscall.SIGTERM)
	follower.wait(10 * time.Second)
	leader.signal(syscall.SIGTERM)
	leader.wait(10 * time.Second)
}

// testPgOnceLossBeforeMarker: a leader whose lease is lost between its
// job's successful exit and the marker write writes no marker, exits 76,
// and the candidate waiting behind it runs the job and records it. Here
// the fenced write itself must find the loss (onceFailures covers a
// direct connection, where the notification may come first): the job's
// last command deletes the row while the leader is connected through
// PgBouncer in transaction mode, where nothing is notified; or the
// leader's link stalls once the job has ended, so that the write hangs,
// and lands, if ever, after the lease expired.
func testPgOnceLossBeforeMarker(t *testing.T, e *pgEnv) {
	bouncer := e.bouncer(t)
	for i, tc := range []struct {
		name           string
		bouncer, stall bool
	}{
		{"RowDeletedAsTheJobEndsThroughPgBouncer", true, false},
		{"LinkStalledAfterTheJobEnded", false, true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			lock, key := fmt.Sprintf("once-loss-%d", i), "k"
			dir := t.TempDir()
			events := filepath.Join(dir, "events")
			u := e.url
			var proxy *testenv.Proxy
			switch {
			case tc.bouncer:
				u = e.via(bouncer.Addr())
			case tc.stall:
				proxy = testenv.NewProxy(t, e.pg.Addr())
				u = e.via(proxy.Addr())
			}
			self := childArgv(t)[0]
			job := fmt.Sprintf(`%s && psql -X -q -c "DELETE FROM leaderrun_leases WHERE name = 'leaderrun/%s'"`, self, lock)
			if tc.stall {
				job = fmt.Sprintf(`%s && touch %s/exited && while [ ! -e %s/stalled ]; do sleep 0.01; done`, self, dir, dir)
			}
			args := append(append([]string{"--lock", lock, "--identity", "a", "--once-key", key}, pgTimings...), "--shell", "--", job)
			a := start(t, append(append(childEnv(events, "sleep:300ms"), e.libpq()...), "LEADERRUN_POSTGRES_URL="+u), args...)
			waitEvents(t, events, 10*time.Second, "a's child", etcdHas("start", "a"))
			b := e.run(t, events, "sleep:300ms", e.url, lock, "b", "--once-key", key, "--wait", "20s")
			waitListening(t, b, "notify")
			var stalled time.Time
			if tc.stall {
				waitFor(t, 10*time.Second, "a's job to end", func() bool { _, err := os.Stat(filepath.Join(dir, "exited")); return err == nil })
				proxy.Stall()
				stalled = time.Now()
				if err := os.WriteFile(filepath.Join(dir, "stalled"), nil, 0o644); err != nil {
					t.Fatal(err)
				}
			}
			evs := waitEvents(t, events, pgLease+10*time.Second, "b's child", etcdHas("start", "b"))
			next, _ := etcdFind(evs, "start", "b")
			if tc.stall {
				t.Logf("b's child started %v after a's link stalled", next.At.Sub(stalled).Round(time.Millisecond))
				proxy.Resume()
			}
			if code := a.wait(20 * time.Second); code != 76 {
				t.Errorf("a exited %d, want 76", code)
			}
			// A renewal (every 500 ms) falling between the DELETE and the
			// job's exit would see the loss first: rare, and as safe.
			log := a.stderr.String()
			switch {
			case strings.Contains(log, "completion marker was not written"):
				t.Logf("a: the job exited 0, the fenced marker write found the lease gone: %s", grep(log, "marker was not written"))
			case strings.Contains(log, "leadership lost; stopping child"):
				t.Logf("a: a renewal saw the loss before the job ended: %s", grep(log, "leadership lost"))
			default:
				t.Errorf("a's log says neither that the marker was not written nor that leadership was lost:\n%s", log)
			}
			if strings.Contains(log, "completion recorded") {
				t.Errorf("a recorded a completion:\n%s", log)
			}
			if code := b.wait(10 * time.Second); code != 0 {
				t.Errorf("b exited %d, want 0", code)
			}
			checkExclusive(t, readEvents(t, events))
			marker := e.scalar(t, pgMarkerSQL("(m->>'identity') || ' ' || (m->>'token')"), "leaderrun/"+lock, key)
			if want := fmt.Sprintf("b %d", next.Token); marker != want {
				t.Errorf("marker %q, want %q: b's run", marker, want)
			}
		})
	}
}

// fenceRow is row 1 of the fencing example's table: the token and value of
// the last accepted write.
func (e *pgEnv) fenceRow(t *testing.T) (uint64, string) {
	t.Helper()
	var (
		token int64
		value string
	)
	err := e.admin.QueryRow(context.Background(), "SELECT fence_token, value FROM job_state WHERE id = 1").Scan(&token, &value)
	if err != nil {
		t.Fatalf("read job_state: %v", err)
	}
	return uint64(token), value
}

// testPgFencingExample runs examples/fencing/postgres-job.sh as its
// comments say: under leaderrun with --backend postgres, configured by the
// same libpq variables as the job's psql, against the same server. Two
// runs write with increasing tokens; then a paused old leader's late
// write, carrying the first run's token, is refused and changes nothing;
// the current leader's retry is accepted.
func testPgFencingExample(t *testing.T, e *pgEnv) {
	script := filepath.Join(filepath.Dir(fencingScript()), "postgres-job.sh")
	env := e.libpq()
	run := func(value string) uint64 {
		t.Helper()
		p := start(t, env, append(append([]string{"--backend", "postgres", "--lock", "fence"}, pgTimings...), "--", script, value)...)
		if code := p.wait(10 * time.Second); code != 0 {
			t.Fatalf("leaderrun with %s exited %d, want 0:\n%s", value, code, p.stderr.String())
		}
		if !strings.Contains(p.stderr.String(), "postgres-job: wrote with token") {
			t.Errorf("the %s run does not say it wrote:\n%s", value, p.stderr.String())
		}
		token, got := e.fenceRow(t)
		if got != value {
			t.Fatalf("after the %s run the row holds %q (token %d), want %q", value, got, token, value)
		}
		return token
	}
	first := run("first")
	second := run("it's the second") // a quote, which psql must quote
	if second <= first {
		t.Fatalf("second leader wrote with token %d, want more than the first's %d", second, first)
	}

	// The first leader, paused before its write and resumed after the
	// second leader's, still holds its old token. leaderrun would set
	// FENCE_TOKEN itself, so the late write runs the script directly.
	job := func(token, value string) (string, int) {
		cmd := exec.Command(script, value)
		cmd.Env = append(append(os.Environ(), env...), "FENCE_TOKEN="+token)
		out, err := cmd.CombinedOutput()
		var ee *exec.ExitError
		if err != nil && !errors.As(err, &ee) {
			t.Fatalf("%s: %v", script, err)
		}
		return string(out), cmd.ProcessState.ExitCode()
	}
	out, code := job(strconv.FormatUint(first, 10), "stale")
	if code != 3 || !strings.Contains(out, "rejected") || !strings.Contains(out, strconv.FormatUint(second, 10)) {
		t.Errorf("stale write with token %d: exit %d, %q; want exit 3, rejected, naming token %d", first, code, out, second)
	}
	if token, value := e.fenceRow(t); token != second || value != "it's the second" {
		t.Errorf("after the stale write the row holds %q with token %d, want the second run's, %d", value, token, second)
	}
	// The current leader retrying its own write is accepted: the guard is
	// fence_token <= FENCE_TOKEN, not <.
	if out, code := job(strconv.FormatUint(second, 10), "second, retried"); code != 0 {
		t.Errorf("retry with the current token %d: exit %d\n%s", second, code, out)
	}
	if token, value := e.fenceRow(t); token != second || value != "second, retried" {
		t.Errorf("after the retry the row holds %q with token %d, want %q with %d", value, token, "second, retried", second)
	}
	if out, code := job("12; DROP TABLE job_state", "x"); code != 64 {
		t.Errorf("a FENCE_TOKEN that is not a number: exit %d, want 64\n%s", code, out)
	}
	t.Logf("first leader wrote with token %d, second with %d; the stale write with %d was refused", first, second, first)
}
