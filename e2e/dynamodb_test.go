//go:build linux

package e2e

import (
	"encoding/json"
	"fmt"
	"os/exec"
	"strconv"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/aws/aws-sdk-go-v2/service/dynamodb/types"

	"github.com/leaderrun/leaderrun/internal/testenv"
)

// ddbTestTimings: the lease is 3 s; the holder renews, and waiters poll,
// every 500 ms; the child is stopped 2 s after the send time of the last
// acknowledged renewal and killed 500 ms later, 500 ms before any waiter
// may take over.
var ddbTestTimings = timings{lease: 3 * time.Second, deadline: 2 * time.Second, retry: 500 * time.Millisecond, grace: 500 * time.Millisecond}

var ddbTimings = ddbTestTimings.flags()

const (
	ddbLease = 3 * time.Second
	ddbRetry = 500 * time.Millisecond
)

// dynamodbStore is DynamoDB in the scenarios' matrix: the emulator, a
// table of the store's own (created by the first leaderrun that
// campaigns), credentials with every permission. Waiters poll the lock
// item every retry period and time the lease on their own clock; the
// holder reads its item at least every 500 ms. The emulator keeps its
// tables in memory: a restart loses them.
func dynamodbStore() *store {
	return &store{
		name: "dynamodb", start: startDynamoDBStore, timings: ddbTestTimings,
		// Waiters log that they poll only at --log-level debug.
		runFlags: []string{"--log-level", "debug"},
		// The follower times the record on its own clock from the last
		// renewal it saw, at most a poll after it was written.
		takeover: ddbLease + ddbRetry + 500*time.Millisecond, handover: ddbRetry + 300*time.Millisecond,
		notice: 500*time.Millisecond + 100*time.Millisecond, statusBound: ddbLease + 5*time.Second,
		expires: true, ttl: true, remaining: true,
		// A lease of 2 s, for a takeover inside the fleet's --wait 4s
		// after a kill -9; renewals and polls every 300 ms.
		onceTimings:   timings{lease: 2 * time.Second, deadline: 1200 * time.Millisecond, retry: 300 * time.Millisecond, grace: 500 * time.Millisecond},
		escapeTimings: timings{lease: 3 * time.Second, deadline: 2 * time.Second, retry: 500 * time.Millisecond, grace: escapeGrace},
	}
}

func startDynamoDBStore(t *testing.T) *target {
	e := newDDBEnv(t)
	// The holder reads its item at least every 500 ms, also with a retry
	// period of 2 s.
	slow := []string{"--lease-duration", "8s", "--renew-deadline", "6s", "--retry-period", "2s", "--kill-grace", "1s"}
	return &target{
		flags: []string{"--dynamodb-endpoint", e.emu.URL, "--dynamodb-table", e.table}, env: testenv.DynamoDBEnv(ddbAll),
		// It has read the holder's record and times it from then.
		waiting: logWaiting("campaigning"), key: keyUnder(e.table + "/leaderrun/%s"),
		link: e.emu.Addr(),
		via: func(addr string) ([]string, []string) {
			return []string{"--dynamodb-endpoint", "http://" + addr, "--dynamodb-table", e.table}, testenv.DynamoDBEnv(ddbAll)
		},
		losses: []loss{
			{name: "Deleted", extra: slow, says: []string{"was deleted"}, do: func(t *testing.T, _ *env, lock string) time.Time {
				e.emu.DeleteItem(t, e.table, "leaderrun/"+lock)
				return time.Time{}
			}},
			{name: "Taken", extra: slow, says: []string{`was taken by \"operator\"`}, do: func(t *testing.T, _ *env, lock string) time.Time {
				e.take(t, lock, "operator")
				return time.Time{}
			}},
		},
		wipe: func(t *testing.T, lock string) { e.emu.DeleteItem(t, e.table, "leaderrun/"+lock) },
		// Its leader may see the loss only when the fenced marker write is
		// refused (a poll may not have come yet), so its term may read
		// "exited 0", but it writes no marker and exits 76.
		loseCommand: func(t *testing.T, lock string) string { return e.takeCommand(t, lock, "operator") },
		record: func(t *testing.T, lock string) string {
			it := e.item(t, lock)
			return fmt.Sprintf("%s token %d, counter %d", itemString(it, "holder"), itemNumber(it, "token"),
				itemNumber(e.emu.Item(t, e.table, "leaderrun/"+lock+"#token"), "token"))
		},
		marker: func(t *testing.T, lock, key string) string {
			var all []struct{ Key, Identity string }
			_ = json.Unmarshal([]byte(itemString(e.emu.Item(t, e.table, "leaderrun/"+lock+"#markers"), "markers")), &all)
			for _, m := range all {
				if m.Key == key {
					return m.Identity
				}
			}
			return ""
		},
		stopServer: e.emu.Stop, startServer: e.emu.Start,
	}
}

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

// TestDynamoDBTableCreatedOnce: three candidates campaign at once on a
// table that does not exist: one of them creates it, and says so; all
// three run their child in turn.
func TestDynamoDBTableCreatedOnce(t *testing.T) {
	t.Parallel()
	e := newDDBEnv(t)
	events := etcdEvents(t)
	var ps []*proc
	for i := range 3 {
		ps = append(ps, e.run(t, events, "sleep:200ms", "created", fmt.Sprintf("i%d", i), "--wait", "30s"))
	}
	created := 0
	for _, p := range ps {
		if code := p.wait(60 * time.Second); code != 0 {
			t.Fatalf("an instance exited %d:\n%s", code, p.stderr.String())
		}
		created += strings.Count(p.stderr.String(), "created the lock table")
	}
	if ivs := checkExclusive(t, readEvents(t, events)); len(ivs) != 3 {
		t.Errorf("%d children ran, want 3", len(ivs))
	}
	if created != 1 {
		t.Errorf("%d instances say they created the table, want 1", created)
	}
}

// TestDynamoDBErrors: refusals are exit 69 at once, in every mode, naming
// the action IAM refused (CreateTable for a missing table; GetItem); an
// endpoint that cannot be reached is 69 naming it. Credentials allowed
// only GetItem, UpdateItem and ConditionCheckItem run everything on a
// table that exists.
func TestDynamoDBErrors(t *testing.T) {
	t.Parallel()
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
		out, code := e.leaderrun(t, ddbAll, append(e.args(url, "unreachable", "u"), "--wait", "1s", "--", "/bin/true")...)
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
