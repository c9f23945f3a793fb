//go:build linux

package e2e

import (
	"encoding/json"
	"fmt"
	"os/exec"
	"strconv"
	"strings"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/aws/aws-sdk-go-v2/service/dynamodb/types"

	"github.com/leaderrun/leaderrun/internal/testenv"
)

// ddbTimings: the lease is 3 s; the holder renews, and waiters poll, every
// 500 ms; the child is stopped 2 s after the send time of the last
// acknowledged renewal and killed 500 ms later, 500 ms before any waiter
// may take over.
var ddbTimings = []string{"--lease-duration", "3s", "--renew-deadline", "2s", "--retry-period", "500ms", "--kill-grace", "500ms"}

const (
	ddbLease = 3 * time.Second
	ddbRetry = 500 * time.Millisecond
)

// ddbAll may perform every action on the emulator; ddbLeast only the
// three the backend needs on a table that exists (internal/testenv/ddbemu
// plays IAM by access key id).
const (
	ddbAll   = "admin"
	ddbLeast = "allow.GetItem.UpdateItem.ConditionCheckItem"
)

// ddbEnv is an emulator and a table of the test's own (created by the
// first leaderrun that campaigns).
type ddbEnv struct {
	emu   *testenv.DynamoDB
	table string
}

var ddbTableSeq atomic.Int64

func newDDBEnv(t *testing.T) *ddbEnv {
	t.Helper()
	return &ddbEnv{emu: testenv.StartDynamoDB(t), table: fmt.Sprintf("e2e_%d_%d", time.Now().UnixNano()%1e9, ddbTableSeq.Add(1))}
}

// args are leaderrun's flags for lock as identity id, through endpoint,
// with ddbTimings.
func (e *ddbEnv) args(endpoint, lock, id string, extra ...string) []string {
	a := []string{"--dynamodb-endpoint", endpoint, "--dynamodb-table", e.table, "--lock", lock, "--identity", id, "--log-level", "debug"}
	return append(append(a, ddbTimings...), extra...)
}

// run starts leaderrun with the recording child in mode, with every
// permission.
func (e *ddbEnv) run(t *testing.T, events, mode, lock, id string, extra ...string) *proc {
	t.Helper()
	return e.runVia(t, e.emu.URL, ddbAll, events, mode, lock, id, extra...)
}

func (e *ddbEnv) runVia(t *testing.T, endpoint, akid, events, mode, lock, id string, extra ...string) *proc {
	t.Helper()
	args := append(e.args(endpoint, lock, id, extra...), "--")
	return start(t, append(testenv.DynamoDBEnv(akid), childEnv(events, mode)...), append(args, childArgv(t)...)...)
}

// leaderrun runs a command of leaderrun (status, history, a run without a
// recording child) to the end, with akid's permissions.
func (e *ddbEnv) leaderrun(t *testing.T, akid string, args ...string) (string, int) {
	t.Helper()
	return outputEnv(t, testenv.DynamoDBEnv(akid), args...)
}

// store are the store flags of status and history.
func (e *ddbEnv) store(lock string) []string {
	return []string{"--dynamodb-endpoint", e.emu.URL, "--dynamodb-table", e.table, "--lock", lock}
}

// polling waits until p logs that it waits for the lock: it has read the
// holder's record and times it from then.
func polling(t *testing.T, p *proc) {
	t.Helper()
	waitFor(t, 10*time.Second, "the follower to poll the lock", func() bool {
		return strings.Contains(p.stderr.String(), "lock held; polling it")
	})
}

// item is the lock item of lock as an operator reads it.
func (e *ddbEnv) item(t *testing.T, lock string) map[string]types.AttributeValue {
	t.Helper()
	return e.emu.Item(t, e.table, "leaderrun/"+lock)
}

func itemString(item map[string]types.AttributeValue, attr string) string {
	if v, ok := item[attr].(*types.AttributeValueMemberS); ok {
		return v.Value
	}
	return ""
}

func itemNumber(item map[string]types.AttributeValue, attr string) uint64 {
	if v, ok := item[attr].(*types.AttributeValueMemberN); ok {
		n, _ := strconv.ParseUint(v.Value, 10, 64)
		return n
	}
	return 0
}

// TestDynamoDBHandovers: five rounds of three contenders (--wait), each
// running its child for 200 ms; between rounds an operator deletes the
// lock item. Never two children at once; every token is greater than the
// one before, across the deletions too. The first contender creates the
// table.
func TestDynamoDBHandovers(t *testing.T) {
	e := newDDBEnv(t)
	events := etcdEvents(t)
	const rounds, together = 5, 3
	var created int
	for r := range rounds {
		if r > 0 {
			e.emu.DeleteItem(t, e.table, "leaderrun/handover")
		}
		var ps []*proc
		for i := range together {
			ps = append(ps, e.run(t, events, "sleep:200ms", "handover", fmt.Sprintf("r%d-i%d", r, i), "--wait", "30s"))
		}
		for _, p := range ps {
			if code := p.wait(60 * time.Second); code != 0 {
				t.Fatalf("round %d: an instance exited %d:\n%s", r, code, p.stderr.String())
			}
			created += strings.Count(p.stderr.String(), "created the lock table")
		}
	}
	evs := readEvents(t, events)
	ivs := checkExclusive(t, evs)
	if len(ivs) != rounds*together {
		t.Fatalf("%d children ran, want %d:\n%s", len(ivs), rounds*together, formatEvents(evs))
	}
	var tokens []uint64
	for _, iv := range ivs {
		tokens = append(tokens, iv.Token)
	}
	if created != 1 {
		t.Errorf("%d instances say they created the table, want 1", created)
	}
	t.Logf("%d handovers, %d across a deletion of the lock item; tokens %v", len(ivs)-1, rounds-1, tokens)
}

// TestDynamoDBStoreReportsLoss (S3, by polling): the lock item deleted,
// or taken by hand, stops the child within a second: the holder reads its
// item at least every 500 ms, here with a retry period of 2 s. leaderrun
// exits 76 saying why.
func TestDynamoDBStoreReportsLoss(t *testing.T) {
	e := newDDBEnv(t)
	slow := []string{"--lease-duration", "8s", "--renew-deadline", "6s", "--retry-period", "2s", "--kill-grace", "1s"}
	for _, tc := range []struct {
		name   string
		change func(lock string)
		says   string
	}{
		{"Deleted", func(lock string) { e.emu.DeleteItem(t, e.table, "leaderrun/"+lock) }, "was deleted"},
		{"Taken", func(lock string) { e.take(t, lock, "operator") }, `was taken by \"operator\"`},
	} {
		t.Run(tc.name, func(t *testing.T) {
			events := etcdEvents(t)
			lock := "loss-" + strings.ToLower(tc.name)
			p := e.run(t, events, "forever", lock, "leader", slow...)
			waitEvents(t, events, 10*time.Second, "the child", etcdHas("start", "leader"))
			before := time.Now()
			tc.change(lock)
			evs := waitEvents(t, events, 3*time.Second, "the child to be signalled", etcdHas("signal", "leader"))
			sig, _ := etcdFind(evs, "signal", "leader")
			d := sig.At.Sub(before)
			t.Logf("child signalled %v after the change (retry period 2s)", d.Round(time.Millisecond))
			if d > time.Second {
				t.Errorf("child signalled %v after the change, want within 1s", d)
			}
			if code := p.wait(5 * time.Second); code != 76 {
				t.Errorf("leaderrun exited %d, want 76", code)
			}
			if !strings.Contains(p.stderr.String(), tc.says) {
				t.Errorf("leaderrun's log does not say %q:\n%s", tc.says, p.stderr.String())
			}
		})
	}
}

// take gives the lock to holder by hand, with a new rvn, as an operator
// (or another tool) would.
func (e *ddbEnv) take(t *testing.T, lock, holder string) {
	t.Helper()
	if out, err := exec.Command("sh", "-c", e.takeCommand(t, lock, holder)).CombinedOutput(); err != nil {
		t.Fatalf("take the lock by hand: %v\n%s", err, out)
	}
}

// takeCommand is a shell command that makes holder the holder of lock,
// through DynamoDB's JSON API with curl (the emulator checks no
// signature).
func (e *ddbEnv) takeCommand(t *testing.T, lock, holder string) string {
	t.Helper()
	curl, err := exec.LookPath("curl")
	if err != nil {
		testenv.Missing(t, "curl is not installed")
	}
	body, _ := json.Marshal(map[string]any{
		"TableName":                 e.table,
		"Key":                       map[string]any{"name": map[string]string{"S": "leaderrun/" + lock}},
		"UpdateExpression":          "SET holder = :h, rvn = :r",
		"ExpressionAttributeValues": map[string]any{":h": map[string]string{"S": holder}, ":r": map[string]string{"S": "by-hand-" + holder}},
	})
	return fmt.Sprintf(`%s -sS --fail -o /dev/null -H 'X-Amz-Target: DynamoDB_20120810.UpdateItem' -H 'Content-Type: application/x-amz-json-1.0' -d '%s' %s`,
		curl, body, e.emu.URL)
}

// TestDynamoDBKill9Leader: SIGKILL of leaderrun alone takes its child down
// within 1 s, and the follower's child starts within lease + retry period
// + 0.5 s: the follower times the record on its own clock from the last
// renewal it saw (at most a poll after it was written).
func TestDynamoDBKill9Leader(t *testing.T) {
	e := newDDBEnv(t)
	events := etcdEvents(t)
	leader := e.run(t, events, "forever", "kill9", "leader")
	evs := waitEvents(t, events, 10*time.Second, "the leader's child", etcdHas("start", "leader"))
	old, _ := etcdFind(evs, "start", "leader")
	follower := e.run(t, events, "forever", "kill9", "follower")
	polling(t, follower)
	killed := time.Now()
	if err := syscall.Kill(leader.pid(), syscall.SIGKILL); err != nil {
		t.Fatal(err)
	}
	waitFor(t, 2*time.Second, "the leader's child to die", func() bool { return !alive(old.Pid) })
	gone := time.Since(killed)
	limit := ddbLease + ddbRetry + 500*time.Millisecond
	evs = waitEvents(t, events, limit+5*time.Second, "the follower's child", etcdHas("start", "follower"))
	next, _ := etcdFind(evs, "start", "follower")
	took := next.At.Sub(killed)
	t.Logf("after kill -9: old child gone within %v; follower's child started %v later (lease %v, retry %v); tokens %d then %d",
		gone.Round(time.Microsecond), took.Round(time.Millisecond), ddbLease, ddbRetry, old.Token, next.Token)
	if gone > time.Second {
		t.Errorf("old child outlived leaderrun by %v, want under 1s", gone)
	}
	if took > limit {
		t.Errorf("follower's child started %v after the kill, want within lease + retry + 0.5s (%v)", took, limit)
	}
	if next.Token <= old.Token {
		t.Errorf("follower's token %d not greater than %d", next.Token, old.Token)
	}
	follower.signal(syscall.SIGTERM)
	follower.wait(5 * time.Second)
}

// TestDynamoDBSigtermHandover (S6, S8): SIGTERM stops the leader's child,
// then frees the lock item; the follower, polling every retry period,
// starts its child within that and 300 ms of the old child's exit.
func TestDynamoDBSigtermHandover(t *testing.T) {
	e := newDDBEnv(t)
	events := etcdEvents(t)
	leader := e.run(t, events, "forever", "sigterm", "leader")
	waitEvents(t, events, 10*time.Second, "the leader's child", etcdHas("start", "leader"))
	follower := e.run(t, events, "forever", "sigterm", "follower")
	polling(t, follower)
	leader.signal(syscall.SIGTERM)
	evs := waitEvents(t, events, 5*time.Second, "the follower's child", etcdHas("start", "follower"))
	exit, ok := etcdFind(evs, "exit", "leader")
	if !ok {
		t.Fatalf("follower's child started before the leader's child exited:\n%s", formatEvents(evs))
	}
	next, _ := etcdFind(evs, "start", "follower")
	gap := next.At.Sub(exit.At)
	t.Logf("follower's child started %v after the leader's child exited (poll every %v)", gap.Round(time.Millisecond), ddbRetry)
	if gap < 0 || gap > ddbRetry+300*time.Millisecond {
		t.Errorf("gap %v, want between 0 and the retry period + 300ms", gap)
	}
	if code := leader.wait(5 * time.Second); code != 0 {
		t.Errorf("leader exited %d, want the child's status 0", code)
	}
	checkExclusive(t, evs)
	follower.signal(syscall.SIGTERM)
	follower.wait(5 * time.Second)
}

// TestDynamoDBStalledLeader (S2): the leader's link to DynamoDB stops
// forwarding without closing. Its child must be dead before the
// follower's starts, in every trial ($E2E_TRIALS, default 3).
func TestDynamoDBStalledLeader(t *testing.T) {
	e := newDDBEnv(t)
	for i := range kubeTrials(t, 3) {
		events := etcdEvents(t)
		lock := fmt.Sprintf("stall-%d", i)
		proxy := testenv.NewProxy(t, e.emu.Addr())
		leader := e.runVia(t, "http://"+proxy.Addr(), ddbAll, events, "forever", lock, "leader")
		waitEvents(t, events, 10*time.Second, "the leader's child", etcdHas("start", "leader"))
		follower := e.run(t, events, "forever", lock, "follower")
		polling(t, follower)
		proxy.Stall()
		stalled := time.Now()
		evs := waitEvents(t, events, ddbLease+5*time.Second, "the follower's child", etcdHas("start", "follower"))
		next, _ := etcdFind(evs, "start", "follower")
		exit, ok := etcdFind(evs, "exit", "leader")
		if !ok {
			t.Fatalf("trial %d: follower's child started while the stalled leader's child still ran:\n%s", i, formatEvents(evs))
		}
		gap := next.At.Sub(exit.At)
		t.Logf("trial %d: old child stopped %v after the stall, new child started %v after the stall: gap %v",
			i, exit.At.Sub(stalled).Round(time.Millisecond), next.At.Sub(stalled).Round(time.Millisecond), gap.Round(time.Millisecond))
		if gap <= 0 {
			t.Errorf("trial %d: children overlapped by %v", i, -gap)
		}
		proxy.Resume()
		if code := leader.wait(15 * time.Second); code != 76 {
			t.Errorf("trial %d: stalled leader exited %d, want 76", i, code)
		}
		follower.signal(syscall.SIGTERM)
		follower.wait(5 * time.Second)
	}
}

// TestDynamoDBStatusAndHistory: status is exit 3 and "none" for a lock
// nobody holds (the table need not exist), exit 0 with the holder, its
// token (the child's FENCE_TOKEN) and the lease; history --json lists the
// terms, newest first.
func TestDynamoDBStatusAndHistory(t *testing.T) {
	e := newDDBEnv(t)
	out, code := e.leaderrun(t, ddbAll, append([]string{"status"}, e.store("st")...)...)
	if code != 3 || !strings.Contains(out, "none") {
		t.Errorf("status of a free lock without a table: exit %d, output:\n%s\nwant exit 3 and leader none", code, out)
	}
	events := etcdEvents(t)
	for i, mode := range []string{"exit:0", "exit:3"} {
		if code := e.run(t, events, mode, "st", fmt.Sprintf("term-%d", i)).wait(10 * time.Second); code != i*3 {
			t.Fatalf("term %d: exit %d, want %d", i, code, i*3)
		}
	}
	e.run(t, events, "forever", "st", "holder")
	evs := waitEvents(t, events, 10*time.Second, "the holder's child", etcdHas("start", "holder"))
	child, _ := etcdFind(evs, "start", "holder")
	out, code = e.leaderrun(t, ddbLeast, append([]string{"status", "--json"}, e.store("st")...)...)
	var st etcdStatus
	if err := json.Unmarshal([]byte(out), &st); err != nil {
		t.Fatalf("status --json printed %q: %v", out, err)
	}
	if code != 0 || !st.Held || st.Identity != "holder" || st.Token != child.Token || st.Backend != "dynamodb" ||
		time.Duration(st.TTL) != ddbLease || st.Remaining <= 0 || st.Key != e.table+"/leaderrun/st" {
		t.Errorf("status --json: exit %d, %+v; want held by holder with token %d, ttl %v", code, st, child.Token, ddbLease)
	}
	out, _ = e.leaderrun(t, ddbLeast, append([]string{"status"}, e.store("st")...)...)
	t.Logf("status:\n%s", out)
	out, code = e.leaderrun(t, ddbLeast, append([]string{"history", "--json"}, e.store("st")...)...)
	if code != 0 {
		t.Fatalf("history --json: exit %d: %s", code, out)
	}
	terms := parseHistory(t, out)
	if len(terms) != 2 || terms[0].Identity != "term-1" || terms[0].ExitCode != 3 || terms[1].Identity != "term-0" ||
		terms[1].ExitCode != 0 || terms[0].Token <= terms[1].Token || terms[0].End != "exited" {
		t.Errorf("history --json, newest first, want term-1 (exit 3) then term-0 (exit 0) with growing tokens:\n%s", out)
	}
	out, _ = e.leaderrun(t, ddbLeast, append([]string{"history"}, e.store("st")...)...)
	t.Logf("history:\n%s", out)
	if out, code := e.leaderrun(t, ddbLeast, append([]string{"history"}, e.store("never-used")...)...); code != 0 || out != "" {
		t.Errorf("history of a lock never used: exit %d, output %q; want 0 and nothing", code, out)
	}
}

// TestDynamoDBTryAndWait: --try on a held lock exits 75 at once without
// writing; --wait gives up after its duration, also without a write; a
// waiting candidate that gets SIGTERM withdraws at once (143).
func TestDynamoDBTryAndWait(t *testing.T) {
	e := newDDBEnv(t)
	events := etcdEvents(t)
	e.run(t, events, "forever", "tw", "holder")
	waitEvents(t, events, 10*time.Second, "the holder's child", etcdHas("start", "holder"))
	token := itemNumber(e.item(t, "tw"), "token")

	began := time.Now()
	if code := e.run(t, events, "exit:0", "tw", "try", "--try").wait(10 * time.Second); code != 75 {
		t.Errorf("--try on a held lock exited %d, want 75", code)
	}
	t.Logf("--try on a held lock: exit 75 after %v (process start included)", time.Since(began).Round(time.Millisecond))

	began = time.Now()
	if code := e.run(t, events, "exit:0", "tw", "wait", "--wait", "1s").wait(10 * time.Second); code != 75 {
		t.Errorf("--wait 1s on a held lock exited %d, want 75", code)
	}
	if took := time.Since(began); took < time.Second || took > 3*time.Second {
		t.Errorf("--wait 1s gave up after %v", took)
	}
	if it := e.item(t, "tw"); itemString(it, "holder") != "holder" || itemNumber(it, "token") != token ||
		itemNumber(e.emu.Item(t, e.table, "leaderrun/tw#token"), "token") != token {
		t.Errorf("after --try and --wait the lock item is %v, want it as the holder left it (token %d)", it, token)
	}

	w := e.run(t, events, "exit:0", "tw", "waiter")
	polling(t, w)
	w.signal(syscall.SIGTERM)
	if code := w.wait(3 * time.Second); code != 128+int(syscall.SIGTERM) {
		t.Errorf("waiter interrupted by SIGTERM exited %d, want %d", code, 128+int(syscall.SIGTERM))
	}
	if evs := readEvents(t, events); count(evs, "start") != 1 {
		t.Errorf("children started:\n%s\nwant only the holder's", formatEvents(evs))
	}
}

// TestDynamoDBErrors: refusals are exit 69 at once, in every mode, naming
// the action IAM refused (CreateTable for a missing table; GetItem); an
// endpoint that cannot be reached is 69 naming it. Credentials allowed
// only GetItem, UpdateItem and ConditionCheckItem run everything on a
// table that exists.
func TestDynamoDBErrors(t *testing.T) {
	e := newDDBEnv(t)
	for _, tc := range []struct {
		name, akid, action string
		table              bool // the table exists
	}{
		{"table creation refused", "deny.CreateTable", "dynamodb:CreateTable", false},
		{"read refused", "deny.GetItem", "dynamodb:GetItem", true},
		{"write refused", "deny.UpdateItem", "dynamodb:UpdateItem", true},
	} {
		for _, mode := range [][]string{nil, {"--try"}, {"--wait", "5s"}} {
			t.Run(fmt.Sprintf("%s %v", tc.name, mode), func(t *testing.T) {
				if tc.table {
					if code := e.run(t, etcdEvents(t), "exit:0", "setup", "setup").wait(10 * time.Second); code != 0 {
						t.Fatalf("creating the table: exit %d", code)
					}
				}
				args := append(append(e.args(e.emu.URL, "refused", "r"), mode...), "--", "/bin/true")
				began := time.Now()
				out, code := e.leaderrun(t, tc.akid, args...)
				took := time.Since(began)
				t.Logf("exit %d after %v: %s", code, took.Round(time.Millisecond), lastLine(out))
				if code != 69 || !strings.Contains(out, tc.action) || !strings.Contains(out, e.emu.URL) {
					t.Errorf("exit %d; want 69 naming %s and %s:\n%s", code, tc.action, e.emu.URL, out)
				}
				if took > 3*time.Second {
					t.Errorf("took %v: a refusal must not be retried", took)
				}
			})
		}
	}
	t.Run("unreachable", func(t *testing.T) {
		url := fmt.Sprintf("http://127.0.0.1:%d", testenv.FreePort(t, "127.0.0.1"))
		out, code := e.leaderrun(t, ddbAll, append(e.args(url, "unreachable", "u"), "--", "/bin/true")...)
		t.Logf("exit %d: %s", code, lastLine(out))
		if code != 69 || !strings.Contains(out, url) || strings.Contains(out, "test-secret") {
			t.Errorf("exit %d; want 69 naming %s, without the secret key:\n%s", code, url, out)
		}
	})
	t.Run("least privilege", func(t *testing.T) {
		events := etcdEvents(t)
		p := e.runVia(t, e.emu.URL, ddbLeast, events, "exit:0", "least", "least", "--once-key", "k1")
		if code := p.wait(10 * time.Second); code != 0 || !strings.Contains(p.stderr.String(), "completion recorded") {
			t.Fatalf("with GetItem, UpdateItem and ConditionCheckItem only: exit %d:\n%s", code, p.stderr.String())
		}
		p = e.runVia(t, e.emu.URL, ddbLeast, events, "exit:0", "least", "again", "--once-key", "k1")
		if code := p.wait(10 * time.Second); code != 0 || count(readEvents(t, events), "start") != 1 {
			t.Fatalf("the second run of k1: exit %d, want 0 without running:\n%s", code, p.stderr.String())
		}
	})
}

// ddbOnceTimings: a lease of 2 s, for a takeover inside the fleet's --wait
// 3s after a kill -9; renewals and polls every 300 ms; the child is
// stopped 1.2 s after the last acknowledged renewal's send time and
// killed 500 ms later.
var ddbOnceTimings = []string{"--lease-duration", "2s", "--renew-deadline", "1200ms", "--retry-period", "300ms", "--kill-grace", "500ms"}

// TestDynamoDBOncePerPeriod: the fleet's crontab on DynamoDB.
func TestDynamoDBOncePerPeriod(t *testing.T) {
	e := newDDBEnv(t)
	lock := "cron"
	for _, kv := range testenv.DynamoDBEnv(ddbAll) {
		k, v, _ := strings.Cut(kv, "=")
		t.Setenv(k, v)
	}
	cronFleet{
		args: func(int) []string {
			return append([]string{"--dynamodb-endpoint", e.emu.URL, "--dynamodb-table", e.table, "--lock", lock}, ddbOnceTimings...)
		},
		period: 4 * time.Second, wait: 3 * time.Second, periods: 10, kills: []int{2, 5, 8}, jobTime: time.Second,
		history: func(t *testing.T) []historyTerm {
			out, code := e.leaderrun(t, ddbAll, append([]string{"history", "--json", "--limit", "100"}, e.store(lock)...)...)
			if code != 0 {
				t.Fatalf("history exit %d: %s", code, out)
			}
			return parseHistory(t, out)
		},
	}.run(t)
}

// TestDynamoDBOnceFailures: the job that exits 1, and the one whose lock
// an operator takes away before its marker is written (the job itself
// does, with curl, then exits 0): its leader may see the loss only when
// the fenced marker write is refused (a poll may not have come yet), so
// its term may read "exited 0", but it writes no marker and exits 76.
func TestDynamoDBOnceFailures(t *testing.T) {
	e := newDDBEnv(t)
	for _, kv := range testenv.DynamoDBEnv(ddbAll) {
		k, v, _ := strings.Cut(kv, "=")
		t.Setenv(k, v)
	}
	args := append([]string{"--dynamodb-endpoint", e.emu.URL, "--dynamodb-table", e.table, "--lock", "nightly"}, ddbTimings...)
	onceFailures(t, args, e.takeCommand(t, "nightly", "operator"))
	out, code := e.leaderrun(t, ddbAll, append([]string{"history"}, e.store("nightly")...)...)
	if code != 0 || !strings.Contains(out, "exited 1") || !strings.Contains(out, "skipped") {
		t.Errorf("history (exit %d):\n%s", code, out)
	}
	t.Logf("history:\n%s", out)
	markers := itemString(e.emu.Item(t, e.table, "leaderrun/nightly#markers"), "markers")
	if !strings.Contains(markers, `"identity":"succeeds"`) || strings.Contains(markers, `"identity":"loses"`) {
		t.Errorf("markers %s; want the one of succeeds only", markers)
	}
}

// TestEscapedHelperDynamoDB (S9): a setsid helper that ignores SIGTERM is
// SIGKILLed within --kill-grace of the first kill signal, with a stalled
// link (the follower's job starts only after it is gone: the lease leaves
// one grace of margin, 3 s = 2 s + 0.9 s + 0.1 s) and with the lock item
// deleted by an operator (which frees it at once: only the one deadline is
// checked, the token protects the resource).
func TestEscapedHelperDynamoDB(t *testing.T) {
	e := newDDBEnv(t)
	for _, kv := range testenv.DynamoDBEnv(ddbAll) {
		k, v, _ := strings.Cut(kv, "=")
		t.Setenv(k, v)
	}
	timings := []string{"--lease-duration", "3s", "--renew-deadline", "2s", "--retry-period", "500ms", "--kill-grace", escapeGrace.String()}
	args := func(addr, lock, id string) []string {
		return append([]string{"--dynamodb-endpoint", "http://" + addr, "--dynamodb-table", e.table, "--lock", lock, "--identity", id,
			"--log-level", "debug"}, timings...)
	}
	// The follower has read the holder's record once the lock item shows a
	// holder and the follower's first poll went out: it is enough that
	// the item is held for a while.
	queued := func(lock string) bool { return itemString(e.item(t, lock), "holder") == "leader" }
	escapeOnStore(t, e.emu.Addr(), e.emu.Addr(), args, queued, []escapeFault{
		{name: "stalled link", ordered: true, fault: func(t *testing.T, proxy *testenv.Proxy, lock string) { proxy.Stall() }},
		{name: "lock item deleted", fault: func(t *testing.T, proxy *testenv.Proxy, lock string) {
			e.emu.DeleteItem(t, e.table, "leaderrun/"+lock)
		}},
	})
}
