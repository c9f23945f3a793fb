//go:build linux

package e2e

import (
	"context"
	"encoding/json"
	"fmt"
	"net"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/Azure/azure-sdk-for-go/sdk/azcore/to"
	"github.com/Azure/azure-sdk-for-go/sdk/storage/azblob/container"
	azlease "github.com/Azure/azure-sdk-for-go/sdk/storage/azblob/lease"
	"github.com/Azure/azure-sdk-for-go/sdk/storage/azblob/sas"

	"github.com/leaderrun/leaderrun/internal/testenv"
)

// azTimings: Azure's shortest lease, 15 s; renewals a second apart, so
// that a lease checks itself half a second after each; the child is
// stopped 5 s after the send time of the last acknowledged renewal and
// killed a second later, 9 s before the lease can expire.
var azTimings = []string{"--lease-duration", "15s", "--renew-deadline", "5s", "--retry-period", "1s", "--kill-grace", "1s"}

const (
	azLease = 15 * time.Second
	azRetry = time.Second
)

// azEnv is the blob service that the subtests of TestAzureBlob share, a
// container of the test's own, and a client of its own that plays the
// operator.
type azEnv struct {
	az        *testenv.Azurite
	container string
	admin     *container.Client
}

// env is what leaderrun needs in its environment to reach the store.
func (e *azEnv) env() []string {
	return []string{"AZURE_STORAGE_CONNECTION_STRING=" + e.az.ConnectionString()}
}

// args are leaderrun's flags for lock as identity id, with azTimings.
func (e *azEnv) args(lock, id string, extra ...string) []string {
	a := []string{"--azure-container", e.container, "--lock", lock, "--identity", id}
	return append(append(a, azTimings...), extra...)
}

// run starts leaderrun with the recording child in mode.
func (e *azEnv) run(t *testing.T, events, mode, lock, id string, extra ...string) *proc {
	t.Helper()
	args := append(e.args(lock, id, extra...), "--")
	return start(t, append(childEnv(events, mode), e.env()...), append(args, childArgv(t)...)...)
}

// output runs a subcommand (status, history) of leaderrun to the end.
func (e *azEnv) output(t *testing.T, command, lock string, extra ...string) (string, int) {
	t.Helper()
	args := append([]string{command, "--azure-container", e.container, "--lock", lock}, extra...)
	return outputEnv(t, e.env(), args...)
}

func (e *azEnv) status(t *testing.T, lock string) (etcdStatus, int) {
	t.Helper()
	out, code := e.output(t, "status", lock, "--json")
	var st etcdStatus
	if code == 0 || code == 3 {
		if err := json.Unmarshal([]byte(out), &st); err != nil {
			t.Fatalf("status --json printed %q: %v", out, err)
		}
	}
	return st, code
}

// breakLease breaks the lease on the lock's blob at once, as an operator
// would (az storage blob lease break --lease-break-period 0).
func (e *azEnv) breakLease(t *testing.T, lock string) {
	t.Helper()
	lc, err := azlease.NewBlobClient(e.admin.NewBlobClient("leaderrun/"+lock), nil)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := lc.BreakLease(context.Background(), &azlease.BlobBreakOptions{BreakPeriod: to.Ptr(int32(0))}); err != nil {
		t.Fatalf("break the lease of %s: %v", lock, err)
	}
}

// breakCommand is a shell command that breaks the lease on the lock's
// blob with curl and a SAS of the container, as an operator with a SAS
// URL would.
func (e *azEnv) breakCommand(t *testing.T, lock string) string {
	t.Helper()
	key, err := container.NewSharedKeyCredential(e.az.Account, e.az.Key)
	if err != nil {
		t.Fatal(err)
	}
	q, err := sas.BlobSignatureValues{Protocol: sas.ProtocolHTTPSandHTTP, ExpiryTime: time.Now().Add(time.Hour), ContainerName: e.container,
		Permissions: to.Ptr(sas.ContainerPermissions{Write: true, Delete: true}).String()}.SignWithSharedKey(key)
	if err != nil {
		t.Fatal(err)
	}
	u := e.az.AccountURL() + "/" + e.container + "/leaderrun/" + lock + "?comp=lease&" + q.Encode()
	return fmt.Sprintf("curl -fsS -X PUT -H 'x-ms-version: 2025-11-05' -H 'x-ms-lease-action: break' -H 'x-ms-lease-break-period: 0' -H 'Content-Length: 0' '%s'", u)
}

// TestAzureBlob runs the end-to-end tests against one Azurite, each in a
// container of its own.
func TestAzureBlob(t *testing.T) {
	az := testenv.StartAzurite(t)
	for i, tc := range []struct {
		name string
		run  func(*testing.T, *azEnv)
	}{
		{"HandoversAcrossDeletes", testAzHandovers},
		{"LeaseBroken", testAzLeaseBroken},
		{"Kill9Leader", testAzKill9Leader},
		{"SigtermHandover", testAzSigtermHandover},
		{"TryAndWait", testAzTryAndWait},
		{"StatusAndHistory", testAzStatusHistory},
		{"OncePerPeriod", testAzOncePerPeriod},
		{"OnceFailures", testAzOnceFailures},
		{"LeaseDurations", testAzLeaseDurations},
		{"CredentialsNotPassed", testAzCredentials},
	} {
		t.Run(tc.name, func(t *testing.T) {
			e := &azEnv{az: az, container: fmt.Sprintf("e2e%d-%s", i, strings.ToLower(tc.name))}
			var err error
			if e.admin, err = container.NewClientFromConnectionString(az.ConnectionString(), e.container, nil); err != nil {
				t.Fatal(err)
			}
			tc.run(t, e)
		})
	}
}

// testAzHandovers: three contenders at a time hand the lock over, 12
// children of 200 ms; between the two waves, with nobody holding it, the
// operator deletes the lock blob. Never two children at once, every token
// greater than the one before.
func testAzHandovers(t *testing.T, e *azEnv) {
	events := etcdEvents(t)
	n := 0
	wave := func() {
		var procs []*proc
		for range 6 {
			procs = append(procs, e.run(t, events, "sleep:200ms", "handovers", fmt.Sprintf("i%02d", n)))
			n++
		}
		for _, p := range procs {
			if code := p.wait(60 * time.Second); code != 0 {
				t.Fatalf("an instance exited %d:\n%s", code, p.stderr.String())
			}
		}
	}
	wave()
	if _, err := e.admin.NewBlobClient("leaderrun/handovers").Delete(context.Background(), nil); err != nil {
		t.Fatalf("delete the lock blob: %v", err)
	}
	wave()
	ivs := checkExclusive(t, readEvents(t, events))
	if len(ivs) != n {
		t.Errorf("%d children ran, want %d", len(ivs), n)
	}
	t.Logf("%d children, tokens %d to %d, the lock blob deleted half-way", len(ivs), ivs[0].Token, ivs[len(ivs)-1].Token)
}

// testAzLeaseBroken (S3): the operator breaks the leader's lease; the
// lease's check (half a retry period after its last proof) sees it, and
// the child gets SIGTERM within a second; leaderrun exits 76 saying why.
func testAzLeaseBroken(t *testing.T, e *azEnv) {
	events := etcdEvents(t)
	p := e.run(t, events, "forever", "broken", "leader")
	waitEvents(t, events, 10*time.Second, "the child", etcdHas("start", "leader"))
	before := time.Now()
	e.breakLease(t, "broken")
	evs := waitEvents(t, events, 5*time.Second, "the child to be signalled", etcdHas("signal", "leader"))
	sig, _ := etcdFind(evs, "signal", "leader")
	d := sig.At.Sub(before)
	t.Logf("child signalled %v after the break was sent (retry period %v)", d.Round(time.Millisecond), azRetry)
	if d > time.Second {
		t.Errorf("child signalled %v after the break, want within 1s", d)
	}
	if code := p.wait(10 * time.Second); code != 76 {
		t.Errorf("leaderrun exited %d, want 76", code)
	}
	if out := p.stderr.String(); !strings.Contains(out, "refused") || !strings.Contains(out, "Lease") {
		t.Errorf("leaderrun's log does not say the service refused the lease:\n%s", out)
	}
}

// testAzKill9Leader: SIGKILL of leaderrun alone takes its child down
// within 1 s, and the follower's child starts within lease + retry period
// + 1 s: the lease expires in the service 15 s after the last renewal,
// and the follower reads the blob once per retry period.
func testAzKill9Leader(t *testing.T, e *azEnv) {
	events := etcdEvents(t)
	leader := e.run(t, events, "forever", "kill9", "leader")
	evs := waitEvents(t, events, 10*time.Second, "the leader's child", etcdHas("start", "leader"))
	old, _ := etcdFind(evs, "start", "leader")
	follower := e.run(t, events, "forever", "kill9", "follower")
	// The follower has tried once and waits: its first attempt's log line.
	waitFor(t, 10*time.Second, "the follower to campaign", func() bool { return strings.Contains(follower.stderr.String(), "campaigning") })
	killed := time.Now()
	if err := syscall.Kill(leader.pid(), syscall.SIGKILL); err != nil {
		t.Fatal(err)
	}
	waitFor(t, 2*time.Second, "the leader's child to die", func() bool { return !alive(old.Pid) })
	gone := time.Since(killed)
	limit := azLease + azRetry + time.Second
	evs = waitEvents(t, events, limit+10*time.Second, "the follower's child", etcdHas("start", "follower"))
	next, _ := etcdFind(evs, "start", "follower")
	took := next.At.Sub(killed)
	t.Logf("after kill -9: old child gone within %v; follower's child started %v later (lease %v, retry %v); tokens %d then %d",
		gone.Round(time.Millisecond), took.Round(time.Millisecond), azLease, azRetry, old.Token, next.Token)
	if gone > time.Second {
		t.Errorf("old child outlived leaderrun by %v, want under 1s", gone)
	}
	if took > limit {
		t.Errorf("follower's child started %v after the kill, want within lease + retry + 1s (%v)", took, limit)
	}
	if next.Token <= old.Token {
		t.Errorf("follower's token %d not greater than %d", next.Token, old.Token)
	}
	follower.signal(syscall.SIGTERM)
	follower.wait(10 * time.Second)
}

// testAzSigtermHandover (S6, S8): SIGTERM stops the leader's child, then
// releases the lease; the follower, reading the blob every retry period,
// starts its child within a retry period (and 300 ms) of the old child's
// exit.
func testAzSigtermHandover(t *testing.T, e *azEnv) {
	events := etcdEvents(t)
	leader := e.run(t, events, "forever", "sigterm", "leader")
	waitEvents(t, events, 10*time.Second, "the leader's child", etcdHas("start", "leader"))
	follower := e.run(t, events, "forever", "sigterm", "follower")
	waitFor(t, 10*time.Second, "the follower to campaign", func() bool { return strings.Contains(follower.stderr.String(), "campaigning") })
	leader.signal(syscall.SIGTERM)
	evs := waitEvents(t, events, 10*time.Second, "the follower's child", etcdHas("start", "follower"))
	exit, ok := etcdFind(evs, "exit", "leader")
	if !ok {
		t.Fatalf("follower's child started before the leader's child exited:\n%s", formatEvents(evs))
	}
	next, _ := etcdFind(evs, "start", "follower")
	gap := next.At.Sub(exit.At)
	t.Logf("follower's child started %v after the leader's child exited (retry period %v)", gap.Round(time.Millisecond), azRetry)
	if gap < 0 || gap > azRetry+300*time.Millisecond {
		t.Errorf("gap %v, want between 0 and the retry period + 300ms", gap)
	}
	if code := leader.wait(10 * time.Second); code != 0 {
		t.Errorf("leader exited %d, want the child's status 0", code)
	}
	checkExclusive(t, evs)
	follower.signal(syscall.SIGTERM)
	follower.wait(10 * time.Second)
}

// testAzTryAndWait: --try on a held lock exits 75 at once; --wait gives up
// after its duration; a waiting candidate that gets SIGTERM withdraws at
// once; a port where nothing listens is exit 69 naming it.
func testAzTryAndWait(t *testing.T, e *azEnv) {
	events := etcdEvents(t)
	e.run(t, events, "forever", "tw", "holder")
	waitEvents(t, events, 10*time.Second, "the holder's child", etcdHas("start", "holder"))

	began := time.Now()
	try := e.run(t, events, "exit:0", "tw", "try", "--try")
	if code := try.wait(10 * time.Second); code != 75 {
		t.Errorf("--try on a held lock exited %d, want 75", code)
	}
	if took := time.Since(began); took > time.Second {
		t.Errorf("--try on a held lock took %v, want well under 1s", took)
	}
	t.Logf("--try on a held lock: exit 75 after %v (process start included)", time.Since(began).Round(time.Millisecond))

	began = time.Now()
	if code := e.run(t, events, "exit:0", "tw", "wait", "--wait", "2s").wait(10 * time.Second); code != 75 {
		t.Errorf("--wait 2s on a held lock exited %d, want 75", code)
	}
	if took := time.Since(began); took < 2*time.Second || took > 4*time.Second {
		t.Errorf("--wait 2s gave up after %v", took)
	}

	w := e.run(t, events, "exit:0", "tw", "waiter")
	waitFor(t, 10*time.Second, "the waiter to campaign", func() bool { return strings.Contains(w.stderr.String(), "campaigning") })
	w.signal(syscall.SIGTERM)
	if code := w.wait(3 * time.Second); code != 128+int(syscall.SIGTERM) {
		t.Errorf("waiter interrupted by SIGTERM exited %d, want %d", code, 128+int(syscall.SIGTERM))
	}
	if evs := readEvents(t, events); count(evs, "start") != 1 {
		t.Errorf("children started:\n%s\nwant only the holder's", formatEvents(evs))
	}

	refused := "127.0.0.1:" + strconv.Itoa(testenv.FreePort(t, "127.0.0.1"))
	silent, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer silent.Close()
	for _, addr := range []string{refused, silent.Addr().String()} {
		began := time.Now()
		p := startProgram(t, append(childEnv(events, "exit:0"), "AZURE_STORAGE_CONNECTION_STRING="+e.az.ConnectionStringVia(addr)),
			testenv.Leaderrun(t), append(append(e.args("unreachable", "u"), "--"), childArgv(t)...)...)
		code := p.wait(30 * time.Second)
		took := time.Since(began)
		t.Logf("store at %s: exit %d after %v: %s", addr, code, took.Round(time.Millisecond), lastLine(p.stderr.String()))
		if code != 69 || !strings.Contains(p.stderr.String(), addr) {
			t.Errorf("store at %s: exit %d, want 69 naming it", addr, code)
		}
		// A refused connection fails at once (and twice more, retried);
		// a silent one costs the request timeout (10 s) and the
		// withdrawal of the acquisition it may have sent (2 s).
		if took > 15*time.Second {
			t.Errorf("store at %s: exit after %v, want within 15s", addr, took)
		}
		if strings.Contains(p.stderr.String(), e.az.Key) {
			t.Errorf("the message shows the account key")
		}
	}
}

// testAzStatusHistory: status names the holder and its token (exit 0),
// or nobody (exit 3); history lists the terms, newest first.
func testAzStatusHistory(t *testing.T, e *azEnv) {
	if st, code := e.status(t, "st"); code != 3 || st.Held {
		t.Errorf("status --json of a lock never used: exit %d, %+v", code, st)
	}
	events := etcdEvents(t)
	for i := range 2 {
		id := fmt.Sprintf("ran-%d", i)
		if code := e.run(t, events, "exit:"+strconv.Itoa(i), "st", id).wait(30 * time.Second); code != i {
			t.Fatalf("%s exited %d, want %d", id, code, i)
		}
	}
	p := e.run(t, events, "forever", "st", "holder-1")
	evs := waitEvents(t, events, 10*time.Second, "the holder's child", etcdHas("start", "holder-1"))
	child, _ := etcdFind(evs, "start", "holder-1")
	st, code := e.status(t, "st")
	if code != 0 || !st.Held || st.Identity != "holder-1" || st.Token != child.Token || st.Backend != "azureblob" ||
		time.Duration(st.TTL) != azLease || st.Key != e.container+"/leaderrun/st" {
		t.Errorf("status --json: exit %d, %+v; want held by holder-1 with token %d", code, st, child.Token)
	}
	out, code := e.output(t, "status", "st")
	t.Logf("status (exit %d):\n%s", code, out)
	p.signal(syscall.SIGTERM)
	p.wait(10 * time.Second)
	out, code = e.output(t, "history", "st", "--json")
	if code != 0 {
		t.Fatalf("history: exit %d:\n%s", code, out)
	}
	terms := parseHistory(t, out)
	if len(terms) != 3 || terms[0].Identity != "holder-1" || terms[1].ExitCode != 1 || terms[2].Identity != "ran-0" ||
		terms[0].Token <= terms[1].Token || terms[1].Token <= terms[2].Token {
		t.Errorf("history: %+v", terms)
	}
	if st, code := e.status(t, "st"); code != 3 || st.Held {
		t.Errorf("status after the release: exit %d, %+v", code, st)
	}
	out, _ = e.output(t, "history", "st")
	t.Logf("history:\n%s", out)
}

// testAzOncePerPeriod: with --once-per, the first run of the period runs
// the command; the next finds it done and exits 0 (or --done-exit-code)
// without running anything.
func testAzOncePerPeriod(t *testing.T, e *azEnv) {
	events := etcdEvents(t)
	if code := e.run(t, events, "sleep:10ms", "daily", "first", "--once-per", "24h").wait(30 * time.Second); code != 0 {
		t.Fatalf("first run exited %d", code)
	}
	p := e.run(t, events, "sleep:10ms", "daily", "second", "--once-per", "24h")
	if code := p.wait(30 * time.Second); code != 0 {
		t.Fatalf("second run exited %d, want 0", code)
	}
	if code := e.run(t, events, "sleep:10ms", "daily", "third", "--once-per", "24h", "--done-exit-code", "9").wait(30 * time.Second); code != 9 {
		t.Errorf("third run exited %d, want 9", code)
	}
	if evs := readEvents(t, events); count(evs, "start") != 1 {
		t.Errorf("children started:\n%s\nwant only the first's", formatEvents(evs))
	}
	if !strings.Contains(p.stderr.String(), "already completed") || !strings.Contains(p.stderr.String(), "completed_by=first") {
		t.Errorf("the second run does not say who completed the period:\n%s", p.stderr.String())
	}
}

// testAzOnceFailures: a failed run records nothing; a run whose lease is
// broken (by the job itself, with curl and a SAS) just before it exits 0
// records nothing and exits 76; then one runs and the next skips. The
// break comes within the half retry period between two checks of the
// lease, so it is the marker's write, conditional on the lease id, that
// the service refuses: the history shows that term as the job's exit 0
// (the runner records how the command ended), and no marker.
func testAzOnceFailures(t *testing.T, e *azEnv) {
	args := append([]string{"--azure-container", e.container, "--lock", "nightly"}, azTimings...)
	for _, kv := range e.env() {
		name, value, _ := strings.Cut(kv, "=")
		t.Setenv(name, value)
	}
	onceFailures(t, args, e.breakCommand(t, "nightly"))
	out, code := e.output(t, "history", "nightly")
	if code != 0 || !strings.Contains(out, "exited 1") || !strings.Contains(out, "loses") || !strings.Contains(out, "skipped") {
		t.Errorf("history (exit %d):\n%s", code, out)
	}
	t.Logf("history:\n%s", out)
}

// testAzLeaseDurations: lease durations Azure does not grant are exit 64
// naming --lease-duration and the range, before anything is contacted;
// 60s is accepted.
func testAzLeaseDurations(t *testing.T, e *azEnv) {
	for _, tc := range []struct {
		lease, deadline string
		code            int
	}{{"10s", "5s", 64}, {"14500ms", "5s", 0}, {"61s", "5s", 64}, {"60s", "5s", 0}} {
		events := etcdEvents(t)
		p := e.run(t, events, "exit:0", "durations", "d", "--lease-duration", tc.lease, "--renew-deadline", tc.deadline)
		code := p.wait(30 * time.Second)
		if code != tc.code {
			t.Errorf("--lease-duration %s: exit %d, want %d:\n%s", tc.lease, code, tc.code, p.stderr.String())
		}
		if tc.code == 64 && (!strings.Contains(p.stderr.String(), "--lease-duration") || !strings.Contains(p.stderr.String(), "15s to 1m0s")) {
			t.Errorf("--lease-duration %s: the message does not name the flag and the range:\n%s", tc.lease, p.stderr.String())
		}
		if tc.code == 64 && count(readEvents(t, events), "start") != 0 {
			t.Errorf("--lease-duration %s: the command ran", tc.lease)
		}
	}
}

// testAzCredentials: the variables that carry the store's credentials
// are removed from the command's environment (the account's name, no
// secret, stays); --pass-credentials passes them on.
func testAzCredentials(t *testing.T, e *azEnv) {
	for _, pass := range []bool{false, true} {
		out := filepath.Join(t.TempDir(), "env")
		extra := []string{"--shell"}
		if pass {
			extra = append(extra, "--pass-credentials")
		}
		args := append(e.args("creds", "c", extra...), "--", "env > "+out)
		env := append(e.env(), "AZURE_STORAGE_KEY=unused-key", "AZURE_STORAGE_SAS_TOKEN=unused-sas", "AZURE_STORAGE_ACCOUNT=acct")
		p := start(t, env, args...)
		if code := p.wait(30 * time.Second); code != 0 {
			t.Fatalf("exit %d:\n%s", code, p.stderr.String())
		}
		data, err := os.ReadFile(out)
		if err != nil {
			t.Fatal(err)
		}
		got := map[string]bool{}
		for _, line := range strings.Split(string(data), "\n") {
			name, _, _ := strings.Cut(line, "=")
			got[name] = true
		}
		for _, name := range []string{"AZURE_STORAGE_CONNECTION_STRING", "AZURE_STORAGE_KEY", "AZURE_STORAGE_SAS_TOKEN"} {
			if got[name] != pass {
				t.Errorf("pass %v: %s in the command's environment: %v", pass, name, got[name])
			}
		}
		if !got["AZURE_STORAGE_ACCOUNT"] || !got["FENCE_TOKEN"] {
			t.Errorf("pass %v: AZURE_STORAGE_ACCOUNT or FENCE_TOKEN missing from the command's environment", pass)
		}
	}
}
