//go:build linux

package e2e

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"net"
	"net/url"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/leaderrun/leaderrun/internal/testenv"
)

// pgTimings keep the tests fast: the database expires a lease 3 s after
// its last renewal; the child gets the kill signal 2 s after the send time
// of the last acknowledged renewal and SIGKILL 500 ms later, so it is dead
// at least 500 ms before anyone can take the lock.
var pgTimings = []string{"--lease-duration", "3s", "--renew-deadline", "2s", "--retry-period", "500ms", "--kill-grace", "500ms"}

const (
	pgLease = 3 * time.Second
	pgRetry = 500 * time.Millisecond
)

// pgEnv is the cluster that the PostgreSQL tests share (initdb costs
// seconds on this machine), and a superuser pool that plays the operator.
type pgEnv struct {
	pg    *testenv.Postgres
	admin *pgxpool.Pool
	bin   string // directory of psql
	url   string // the superuser's, directly to the server
}

// TestPostgres runs the binary against a real PostgreSQL: every "Must show"
// of the PostgreSQL backend and of once-per-period runs on it. The subtests
// run one after the other: most of them measure reaction times.
func TestPostgres(t *testing.T) {
	pg := testenv.StartPostgres(t)
	admin, err := pgxpool.New(context.Background(), pg.SuperuserURL())
	if err != nil {
		t.Fatal(err)
	}
	defer admin.Close()
	e := &pgEnv{pg: pg, admin: admin, bin: testenv.PostgresBinDir(t), url: pg.SuperuserURL()}
	// Connect now, so that the operator's statements below are one
	// round trip each.
	e.exec(t, "SELECT 1")
	for _, tc := range []struct {
		name string
		run  func(*testing.T, *pgEnv)
	}{
		{"HandoversAndTokensAcrossDelete", testPgHandovers},
		{"RowDeletedOrTaken", testPgRowDeletedOrTaken},
		{"Kill9Leader", testPgKill9Leader},
		{"StalledLeader", testPgStalledLeader},
		{"SigtermHandover", testPgSigtermHandover},
		{"TryAndWait", testPgTryAndWait},
		{"Refused", testPgRefused},
		{"NoCreatePrivilege", testPgNoCreatePrivilege},
		{"PermissionDenied", testPgPermissionDenied},
		{"StatusTimeout", testPgStatusTimeout},
		{"CredentialsStayOut", testPgCredentials},
		{"MinimalGrants", testPgMinimalGrants},
		{"ConnectionsPerProcess", testPgConnections},
		{"StatusAndHistory", testPgStatusAndHistory},
		{"Check", testPgCheck},
		{"OncePerPeriodCron", testPgOnceCron},
		{"OnceFailures", testPgOnceFailures},
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

// statusOf is `leaderrun status --json` of lock, and its exit code.
func (e *pgEnv) statusOf(t *testing.T, lock string) (etcdStatus, int) {
	t.Helper()
	out, errs, code := pgOutput(t, []string{"LEADERRUN_POSTGRES_URL=" + e.url}, "status", "--json", "--lock", lock)
	var st etcdStatus
	if code != 0 && code != 3 {
		t.Fatalf("status: exit %d\n%s%s", code, out, errs)
	}
	if err := json.Unmarshal([]byte(out), &st); err != nil {
		t.Fatalf("status --json printed %q: %v", out, err)
	}
	return st, code
}

// pgTerm is one line of `leaderrun history --json`.
type pgTerm struct {
	Identity string    `json:"identity"`
	Token    uint64    `json:"token"`
	Acquired time.Time `json:"acquired"`
	Started  time.Time `json:"started"`
	Ended    time.Time `json:"ended"`
	End      string    `json:"end"`
	ExitCode int       `json:"exit_code"`
	Signal   string    `json:"signal"`
	Reason   string    `json:"reason"`
	OnceKey  string    `json:"once_key"`
}

// history is `leaderrun history --json` of lock, newest first.
func (e *pgEnv) history(t *testing.T, lock string) []pgTerm {
	t.Helper()
	out, errs, code := pgOutput(t, []string{"LEADERRUN_POSTGRES_URL=" + e.url}, "history", "--json", "--limit", "100", "--lock", lock)
	if code != 0 {
		t.Fatalf("history: exit %d\n%s%s", code, out, errs)
	}
	var terms []pgTerm
	for _, line := range strings.Split(strings.TrimSpace(out), "\n") {
		if line == "" {
			continue
		}
		var tm pgTerm
		if err := json.Unmarshal([]byte(line), &tm); err != nil {
			t.Fatalf("history --json line %q: %v", line, err)
		}
		terms = append(terms, tm)
	}
	return terms
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

// testPgHandovers: three instances at a time contend for one lock, each
// replaced when it exits, as systemd would; between two leaders the whole
// lease table is emptied by hand (DELETE FROM leaderrun_leases). Over 21
// children (20 handovers) two never run at once and every token is greater
// than the one before, across the DELETE too: the sequence does not care.
func testPgHandovers(t *testing.T, e *pgEnv) {
	events := pgEvents(t)
	const lock = "handover"
	runSlots := func(n int) {
		var slots [3]*proc
		run := func(i int) {
			slots[i] = e.run(t, events, "sleep:100ms", e.url, lock, fmt.Sprintf("slot%d", i))
		}
		for i := range slots {
			run(i)
		}
		for target := count(readEvents(t, events), "start") + n; ; {
			var exited int
			select {
			case <-slots[0].done:
				exited = 0
			case <-slots[1].done:
				exited = 1
			case <-slots[2].done:
				exited = 2
			case <-time.After(30 * time.Second):
				t.Fatalf("no instance exited for 30s\n%s", formatEvents(readEvents(t, events)))
			}
			if code := slots[exited].code; code != 0 {
				t.Fatalf("slot %d exited %d\n%s", exited, code, slots[exited].stderr.String())
			}
			if count(readEvents(t, events), "start") >= target {
				break
			}
			run(exited)
		}
		for _, p := range slots {
			if !p.exited() {
				p.signal(syscall.SIGTERM)
				p.wait(10 * time.Second)
			}
		}
	}

	runSlots(10)
	before := consulStarts(readEvents(t, events))
	lastBefore := before[len(before)-1].Token
	deleted := e.exec(t, "DELETE FROM leaderrun_leases")
	runSlots(11)

	evs := readEvents(t, events)
	ivs := checkExclusive(t, evs)
	if len(ivs) < 21 {
		t.Fatalf("%d children ran, want 21 (20 handovers)", len(ivs))
	}
	if first := ivs[len(before)].Token; first <= lastBefore {
		t.Errorf("first token after DELETE FROM leaderrun_leases is %d, not greater than %d before it", first, lastBefore)
	}
	var gaps []time.Duration
	tokens := make([]uint64, len(ivs))
	for i, iv := range ivs {
		tokens[i] = iv.Token
		if i > 0 && i != len(before) {
			gaps = append(gaps, iv.Start.Sub(ivs[i-1].End))
		}
	}
	t.Logf("%d children, %d handovers; tokens %v; DELETE FROM leaderrun_leases (%d row) after token %d",
		len(ivs), len(ivs)-1, tokens, deleted, lastBefore)
	t.Logf("handover gap, old child's exit → next child's start: %s", consulSummary(gaps))
}

// testPgRowDeletedOrTaken (S3): an operator deleting the leader's row, or
// giving it to another holder with an UPDATE, stops the child within 1 s
// (aim: 100 ms) and leaderrun exits 76. Directly, the trigger's
// notification reports it; through PgBouncer in transaction mode, where
// notifications do not arrive, the next renewal does (within
// --retry-period, 500 ms here).
func testPgRowDeletedOrTaken(t *testing.T, e *pgEnv) {
	bouncer := e.bouncer(t)
	for _, tc := range []struct {
		name, sql string
		bouncer   bool
	}{
		{"Delete", "DELETE FROM leaderrun_leases WHERE name = $1", false},
		{"UpdateHolder", "UPDATE leaderrun_leases SET holder = 'intruder' WHERE name = $1", false},
		{"UpdateTokenAndHolder", "UPDATE leaderrun_leases SET holder = 'intruder', token = nextval('leaderrun_leases_token_seq') WHERE name = $1", false},
		{"DeleteThroughPgBouncer", "DELETE FROM leaderrun_leases WHERE name = $1", true},
		{"UpdateHolderThroughPgBouncer", "UPDATE leaderrun_leases SET holder = 'intruder' WHERE name = $1", true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			var lat []time.Duration
			for i := range consulTrials(t, 3) {
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
				consulSummary(lat))
		})
	}
}

// testPgKill9Leader: SIGKILL of leaderrun alone takes its child down
// within 1 s (pdeathsig and the watchdog), and a follower's child starts
// within lease-duration + retry-period + 0.5 s, once the database's clock
// says that the dead leader's lease expired: woken at the expiry when it
// is notified, by its poll every retry period through PgBouncer.
func testPgKill9Leader(t *testing.T, e *pgEnv) {
	bouncer := e.bouncer(t)
	for _, tc := range []struct {
		name    string
		bouncer bool
	}{{"FollowerNotified", false}, {"FollowerPollsThroughPgBouncer", true}} {
		t.Run(tc.name, func(t *testing.T) {
			var gones, takes []time.Duration
			bound := pgLease + pgRetry + 500*time.Millisecond
			for i := range consulTrials(t, 3) {
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
				tc.name, consulSummary(gones), consulSummary(takes), bound)
		})
	}
}

// testPgStalledLeader (S2): the leader's link to PostgreSQL stops
// forwarding without closing (its renewals and its listening connection
// alike). Its child must be dead before the follower's starts, in every
// trial ($E2E_TRIALS, default 20). The trials run five at a time side by
// side, each with its own lock and proxy: they wait on the database's
// clock, not on the CPU.
func testPgStalledLeader(t *testing.T, e *pgEnv) {
	type trial struct {
		lock, events string
		proxy        *testenv.Proxy
		leader       *proc
		stalled      time.Time
	}
	total := consulTrials(t, 20)
	var stops, takes, margins []time.Duration
	ok := 0
	for first := 0; first < total; first += 5 {
		trials := make([]*trial, min(5, total-first))
		for i := range trials {
			tr := &trial{lock: fmt.Sprintf("stall-%d", first+i), events: pgEvents(t), proxy: testenv.NewProxy(t, e.pg.Addr())}
			tr.leader = e.run(t, tr.events, "forever", e.via(tr.proxy.Addr()), tr.lock, "leader")
			trials[i] = tr
		}
		for _, tr := range trials {
			waitEvents(t, tr.events, 10*time.Second, tr.lock+": the leader's child", etcdHas("start", "leader"))
			waitListening(t, tr.leader, "notify")
			waitListening(t, e.run(t, tr.events, "forever", e.url, tr.lock, "follower"), "notify")
		}
		for _, tr := range trials {
			tr.stalled = time.Now()
			tr.proxy.Stall()
		}
		for _, tr := range trials {
			evs := waitEvents(t, tr.events, pgLease+10*time.Second, tr.lock+": the follower's child", etcdHas("start", "follower"))
			checkExclusive(t, evs)
			sig, signalled := etcdFind(evs, "signal", "leader")
			exit, exited := etcdFind(evs, "exit", "leader")
			next, _ := etcdFind(evs, "start", "follower")
			if !signalled || !exited || !exit.At.Before(next.At) {
				t.Errorf("%s: the leader's child was not dead before the follower's started\n%s", tr.lock, formatEvents(evs))
				continue
			}
			ok++
			stops = append(stops, sig.At.Sub(tr.stalled))
			takes = append(takes, next.At.Sub(tr.stalled))
			margins = append(margins, next.At.Sub(exit.At))
		}
		for _, tr := range trials {
			tr.proxy.Resume()
			if code := tr.leader.wait(15 * time.Second); code != 76 {
				t.Errorf("%s: the stalled leader exited %d, want 76", tr.lock, code)
			}
		}
	}
	t.Logf("stalled leader: old child dead before the new one started in %d of %d trials", ok, total)
	t.Logf("stall → leader's child signalled: %s", consulSummary(stops))
	t.Logf("stall → follower's child started: %s", consulSummary(takes))
	t.Logf("leader's child exit → follower's child start (safety margin): %s", consulSummary(margins))
}

// testPgSigtermHandover (S6, S8): SIGTERM stops the leader's child,
// releases the row, and the notified follower's child starts within
// 300 ms of the old child's exit (the median of the trials; a single trial
// may take up to 1 s on a busy machine).
func testPgSigtermHandover(t *testing.T, e *pgEnv) {
	var gaps []time.Duration
	for i := range consulTrials(t, 5) {
		events := pgEvents(t)
		lock := fmt.Sprintf("sigterm-%d", i)
		leader := e.run(t, events, "forever", e.url, lock, "leader")
		waitEvents(t, events, 10*time.Second, "the leader's child", etcdHas("start", "leader"))
		follower := e.run(t, events, "forever", e.url, lock, "follower")
		waitListening(t, follower, "notify")
		leader.signal(syscall.SIGTERM)
		if code := leader.wait(10 * time.Second); code != 0 {
			t.Errorf("trial %d: leader exited %d after SIGTERM, want its child's 0", i, code)
		}
		evs := waitEvents(t, events, 5*time.Second, "the follower's child", etcdHas("start", "follower"))
		checkExclusive(t, evs)
		exit, _ := etcdFind(evs, "exit", "leader")
		next, _ := etcdFind(evs, "start", "follower")
		gap := next.At.Sub(exit.At)
		gaps = append(gaps, gap)
		if gap > time.Second {
			t.Errorf("trial %d: follower's child started %v after the leader's child exited, want within 1s", i, gap)
		}
		follower.signal(syscall.SIGTERM)
		follower.wait(10 * time.Second)
	}
	t.Logf("SIGTERM handover, old child's exit → new child's start: %s", consulSummary(gaps))
	if m := median(gaps); m > 300*time.Millisecond {
		t.Errorf("SIGTERM handover: median %v from the old child's exit to the new child's start, want within 300ms", m)
	}
}

// testPgTryAndWait: --try on a held lock exits 75 within 100 ms (process
// start, connection and authentication included) and changes nothing in
// the database; --wait 500ms gives up after about 0.5 s; a waiting
// candidate that gets SIGTERM withdraws at once.
func testPgTryAndWait(t *testing.T, e *pgEnv) {
	const lock = "tw"
	events := pgEvents(t)
	e.run(t, events, "forever", e.url, lock, "holder")
	waitEvents(t, events, 10*time.Second, "the holder's child", etcdHas("start", "holder"))
	row := func() string {
		return e.scalar(t, "SELECT holder || ' ' || owner || ' ' || token FROM leaderrun_leases WHERE name = $1", "leaderrun/"+lock)
	}
	before := row()

	var tries []time.Duration
	for i := range 5 {
		began := time.Now()
		code := e.run(t, events, "exit:0", e.url, lock, fmt.Sprintf("try%d", i), "--try").wait(10 * time.Second)
		tries = append(tries, time.Since(began))
		if code != 75 {
			t.Errorf("--try on a held lock exited %d, want 75", code)
		}
	}
	slices.Sort(tries)
	t.Logf("--try on a held lock, exit 75 after (process start included): %s", consulSummary(tries))
	if med := tries[len(tries)/2]; med > 100*time.Millisecond {
		t.Errorf("--try took %v (median), want within 100ms", med)
	}
	if after := row(); after != before {
		t.Errorf("--try changed the row from %q to %q", before, after)
	}
	if n := e.scalar(t, "SELECT count(*) FROM leaderrun_leases_history WHERE name = $1", "leaderrun/"+lock); n != "0" {
		t.Errorf("--try left %s terms in the history, want none", n)
	}

	for _, mode := range []string{"notify", "poll"} {
		u := e.url
		if mode == "poll" {
			u = e.via(e.bouncer(t).Addr())
		}
		began := time.Now()
		code := e.run(t, events, "exit:0", u, lock, "wait-"+mode, "--wait", "500ms").wait(10 * time.Second)
		took := time.Since(began)
		t.Logf("--wait 500ms (%s) on a held lock: exit %d after %v", mode, code, took.Round(time.Millisecond))
		if code != 75 {
			t.Errorf("--wait 500ms (%s) exited %d, want 75", mode, code)
		}
		if took < 500*time.Millisecond || took > time.Second {
			t.Errorf("--wait 500ms (%s) gave up after %v, want about 500ms", mode, took)
		}
	}

	w := e.run(t, events, "exit:0", e.url, lock, "waiter")
	waitListening(t, w, "notify")
	w.signal(syscall.SIGTERM)
	if code := w.wait(3 * time.Second); code != 128+int(syscall.SIGTERM) {
		t.Errorf("waiter interrupted by SIGTERM exited %d, want %d", code, 128+int(syscall.SIGTERM))
	}
	if after := row(); after != before {
		t.Errorf("the withdrawn waiter changed the row from %q to %q", before, after)
	}
	if evs := readEvents(t, events); count(evs, "start") != 1 {
		t.Errorf("children started:\n%s\nwant only the holder's", formatEvents(evs))
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
					args = append(append(args, "--"), childArgv(t)...)
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
				if !strings.Contains(out, tc.addr) || !strings.Contains(out, tc.want) {
					t.Errorf("output does not name %s and say %q", tc.addr, tc.want)
				}
				if strings.Contains(out, secret) {
					t.Errorf("output shows the password")
				}
				if took > 3*time.Second {
					t.Errorf("took %v, want about the 1s connect timeout at most", took)
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

// testPgCredentials: LEADERRUN_POSTGRES_URL, leaderrun's own credential,
// does not reach the job unless --pass-credentials; PGPASSWORD and
// DATABASE_URL, which a job uses for its own data, do.
func testPgCredentials(t *testing.T, e *pgEnv) {
	for _, tc := range []struct {
		name  string
		extra []string
		want  string
	}{
		{"Default", nil, "url= pw=set db=set"},
		{"PassCredentials", []string{"--pass-credentials"}, "url=set pw=set db=set"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			out := filepath.Join(t.TempDir(), "env")
			job := `echo "url=${LEADERRUN_POSTGRES_URL:+set} pw=${PGPASSWORD:+set} db=${DATABASE_URL:+set}" > ` + out
			env := []string{"LEADERRUN_POSTGRES_URL=" + e.url, "PGPASSWORD=job-secret", "DATABASE_URL=postgres://job@db/data"}
			args := append(append(append([]string{"--lock", "creds"}, pgTimings...), tc.extra...), "--shell", "--", job)
			if _, stderr, code := pgOutput(t, env, args...); code != 0 {
				t.Fatalf("exit %d\n%s", code, stderr)
			}
			got, err := os.ReadFile(out)
			if err != nil {
				t.Fatal(err)
			}
			if strings.TrimSpace(string(got)) != tc.want {
				t.Errorf("the job saw %q, want %q", strings.TrimSpace(string(got)), tc.want)
			}
		})
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

// testPgStatusAndHistory: status exits 3 on a free lock and 0 with a
// leader, whose identity, token (the child's FENCE_TOKEN), lease duration
// and time left by the database's clock it shows; history of a lock never
// used prints nothing and exits 0, and lists terms that ended in every
// way, newest first, with the right statuses and tokens.
func testPgStatusAndHistory(t *testing.T, e *pgEnv) {
	const lock = "st"
	env := []string{"LEADERRUN_POSTGRES_URL=" + e.url}
	if out, errs, code := pgOutput(t, env, "history", "--lock", "never-used"); code != 0 || out != "" {
		t.Errorf("history of a lock never used: exit %d, output %q %q; want exit 0 and nothing", code, out, errs)
	}
	out, _, code := pgOutput(t, env, "status", "--lock", lock)
	if code != 3 || !strings.Contains(out, "none") {
		t.Errorf("status of a free lock: exit %d, output:\n%s\nwant exit 3 and leader none", code, out)
	}

	events := pgEvents(t)
	// Four terms: exit 0, exit 3, lost (row deleted), stopped by SIGTERM.
	if code := e.run(t, events, "exit:0", e.url, lock, "ok").wait(10 * time.Second); code != 0 {
		t.Fatalf("first run exited %d", code)
	}
	if code := e.run(t, events, "exit:3", e.url, lock, "three").wait(10 * time.Second); code != 3 {
		t.Fatalf("second run exited %d, want the child's 3", code)
	}
	lost := e.run(t, events, "forever", e.url, lock, "lost")
	waitEvents(t, events, 10*time.Second, "the third child", etcdHas("start", "lost"))
	waitListening(t, lost, "notify")
	e.exec(t, "DELETE FROM leaderrun_leases WHERE name = $1", "leaderrun/"+lock)
	if code := lost.wait(10 * time.Second); code != 76 {
		t.Fatalf("third run exited %d after its row was deleted, want 76", code)
	}
	holder := e.run(t, events, "forever", e.url, lock, "holder-1")
	evs := waitEvents(t, events, 10*time.Second, "the holder's child", etcdHas("start", "holder-1"))
	child, _ := etcdFind(evs, "start", "holder-1")

	out, _, code = pgOutput(t, env, "status", "--lock", lock)
	t.Logf("status:\n%s", out)
	for _, want := range []string{"backend:     postgres", "leader:      holder-1", "token:       " + strconv.FormatUint(child.Token, 10),
		"ttl:         3s", "lease left:", "last term:"} {
		if !strings.Contains(out, want) {
			t.Errorf("status does not say %q", want)
		}
	}
	if code != 0 || strings.Contains(out, "waiting:") {
		t.Errorf("status: exit %d; want 0, and no waiting count (waiters leave no trace in the database)", code)
	}
	st, code := e.statusOf(t, lock)
	if code != 0 || !st.Held || st.Identity != "holder-1" || st.Token != child.Token || st.Backend != "postgres" ||
		st.Key != "leaderrun/"+lock || time.Duration(st.TTL) != pgLease || st.Waiting != -1 ||
		st.Remaining <= 0 || time.Duration(st.Remaining) > pgLease {
		t.Errorf("status --json: exit %d, %+v; want held by holder-1 with token %d, ttl %v, 0 < remaining <= ttl, waiting -1",
			code, st, child.Token, pgLease)
	}
	holder.signal(syscall.SIGTERM)
	if code := holder.wait(10 * time.Second); code != 0 {
		t.Fatalf("holder exited %d after SIGTERM, want its child's 0", code)
	}

	terms := e.history(t, lock)
	out, _, _ = pgOutput(t, env, "history", "--lock", lock)
	t.Logf("history:\n%s", out)
	starts := consulStarts(readEvents(t, events))
	want := []struct {
		id, end string
		exit    int
	}{{"holder-1", "stopped", 0}, {"lost", "lost", 143}, {"three", "exited", 3}, {"ok", "exited", 0}}
	if len(terms) != len(want) || len(starts) != len(want) {
		t.Fatalf("history --json has %d terms, %d children ran; want %d:\n%+v", len(terms), len(starts), len(want), terms)
	}
	for i, w := range want {
		tm := terms[i]
		if tm.Identity != w.id || tm.End != w.end || tm.Token != starts[len(starts)-1-i].Token ||
			tm.Started.IsZero() || tm.Ended.Before(tm.Started) || tm.Acquired.After(tm.Started) {
			t.Errorf("term %d: %+v; want %s ended %q with the token of its child, %d", i, tm, w.id, w.end, starts[len(starts)-1-i].Token)
		}
		if w.end != "lost" && tm.ExitCode != w.exit {
			t.Errorf("term %d (%s): exit code %d, want %d", i, w.id, tm.ExitCode, w.exit)
		}
		if i > 0 && tm.Token >= terms[i-1].Token {
			t.Errorf("history not newest first: token %d after %d", tm.Token, terms[i-1].Token)
		}
	}
	if !strings.Contains(terms[1].Reason, "deleted") {
		t.Errorf("the lost term's reason %q does not say that the row was deleted", terms[1].Reason)
	}
	if terms[0].Signal != "SIGTERM" {
		t.Errorf("the stopped term's signal is %q, want SIGTERM", terms[0].Signal)
	}
	if lines := strings.Split(strings.TrimSpace(out), "\n"); len(lines) != 1+len(want) || !strings.HasPrefix(lines[0], "TOKEN") {
		t.Errorf("history prints %d lines, want a header and %d terms", len(lines), len(want))
	}
}

// testPgCheck: `leaderrun check` in the child exits 0 while leading, and
// 1 within 100 ms of the row being deleted; leaderrun exits 76.
func testPgCheck(t *testing.T, e *pgEnv) {
	out, job := checkJob(t)
	args := []string{"--lock", "chk", "--lease-duration", "8s", "--renew-deadline", "4s", "--retry-period", "1s",
		"--kill-grace", "3s", "--shell", "--", job}
	p := start(t, []string{"LEADERRUN_POSTGRES_URL=" + e.url}, args...)
	waitFor(t, 10*time.Second, "a successful check", func() bool { return len(checks(out, 0)) > 0 })
	waitListening(t, p, "notify")
	deleted := time.Now()
	e.exec(t, "DELETE FROM leaderrun_leases WHERE name = 'leaderrun/chk'")
	expectCheckFails(t, p, out, deleted)
}

// pgOnceTimings are short enough for a waiting host to take over a killed
// leader's lease, and run its 1 s job, within the fleet's --wait 3s: the
// database expires the lease 1.2 s after the last renewal, to the
// microsecond, and a notified waiter tries again at that moment.
var pgOnceTimings = []string{"--lease-duration", "1200ms", "--renew-deadline", "800ms", "--retry-period", "200ms", "--kill-grace", "300ms"}

// testPgOnceCron is the fleet's crontab (cronFleet) on PostgreSQL: 10
// periods of 4 s, three hosts at random offsets with --wait 3s --once-per
// 4s, a kill -9 of the leader mid-run in 3 of them. Exactly one completed
// run per period, never two jobs at once, and history agrees.
func testPgOnceCron(t *testing.T, e *pgEnv) {
	const lock = "cron"
	cronFleet{
		args: func(int) []string {
			return append([]string{"--postgres-url", e.url, "--lock", lock}, pgOnceTimings...)
		},
		period: 4 * time.Second, wait: 3 * time.Second, periods: 10, kills: []int{2, 5, 8}, jobTime: time.Second,
		history: func(t *testing.T) []historyTerm {
			out, code := output(t, "history", "--json", "--limit", "100", "--postgres-url", e.url, "--lock", lock)
			if code != 0 {
				t.Fatalf("history exit %d: %s", code, out)
			}
			return parseHistory(t, out)
		},
	}.run(t)
	// The markers table agrees with the history: each completed period's
	// marker carries the token of the term that completed it.
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	rows, err := e.admin.Query(ctx, `SELECT m.key, m.identity, m.token, h.end_ok FROM leaderrun_leases_markers m
		LEFT JOIN LATERAL (SELECT bool_and(how = 'exited' AND exit_code = 0) AS end_ok FROM leaderrun_leases_history
			WHERE name = m.name AND token = m.token) h ON true
		WHERE m.name = $1 ORDER BY m.key`, "leaderrun/"+lock)
	if err != nil {
		t.Fatal(err)
	}
	defer rows.Close()
	n := 0
	for rows.Next() {
		var (
			key, id string
			token   int64
			ok      *bool
		)
		if err := rows.Scan(&key, &id, &token, &ok); err != nil {
			t.Fatal(err)
		}
		n++
		if ok == nil || !*ok {
			t.Errorf("marker %s by %s with token %d has no term in the history that exited 0", key, id, token)
		}
	}
	if n == 0 {
		t.Errorf("no markers in leaderrun_leases_markers")
	}
	t.Logf("%d markers of the fleet's periods are still kept (they expire 7 periods after their run)", n)
}

// testPgOnceFailures (the shared onceFailures): a job that exits 1
// records nothing and the next candidate runs it; a job that deletes its
// leader's row and exits 0 leaves no marker, its leader exits 76, and the
// next candidate runs it; after a success the next candidate runs nothing.
func testPgOnceFailures(t *testing.T, e *pgEnv) {
	const lock = "nightly"
	args := append([]string{"--postgres-url", e.url, "--lock", lock}, pgTimings...)
	del := fmt.Sprintf(`PGPASSWORD=%s %s -X -q -h %s -p %d -U postgres -d postgres -c "DELETE FROM leaderrun_leases WHERE name = 'leaderrun/%s'"`,
		e.pg.Password, filepath.Join(e.bin, "psql"), e.pg.Host(), e.pg.Port(), lock)
	onceFailures(t, args, del)
	out, code := output(t, "history", "--postgres-url", e.url, "--lock", lock)
	if code != 0 || !strings.Contains(out, "exited 1") || !strings.Contains(out, "skipped") {
		t.Errorf("history (exit %d):\n%s", code, out)
	}
	t.Logf("history:\n%s", out)
	// The candidate that lost its row ran its job to exit 0: the marker is
	// the one of the candidate after it.
	terms := e.history(t, lock)
	marker := e.scalar(t, "SELECT identity || ' ' || token FROM leaderrun_leases_markers WHERE name = $1 AND key = 'nightly-1'", "leaderrun/"+lock)
	var succeeded pgTerm
	for _, tm := range terms {
		if tm.Identity == "succeeds" {
			succeeded = tm
		}
	}
	if want := fmt.Sprintf("succeeds %d", succeeded.Token); marker != want {
		t.Errorf("marker %q, want %q", marker, want)
	}
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
			marker := e.scalar(t, "SELECT identity || ' ' || token FROM leaderrun_leases_markers WHERE name = $1 AND key = $2",
				"leaderrun/"+lock, key)
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
