//go:build linux

package e2e

import (
	"context"
	"encoding/json"
	"fmt"
	"net"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/Azure/azure-sdk-for-go/sdk/azcore/to"
	"github.com/Azure/azure-sdk-for-go/sdk/storage/azblob/container"
	azlease "github.com/Azure/azure-sdk-for-go/sdk/storage/azblob/lease"
	"github.com/Azure/azure-sdk-for-go/sdk/storage/azblob/sas"

	"github.com/leaderrun/leaderrun/internal/testenv"
)

// azTestTimings: Azure's shortest lease, 15 s; renewals a second apart,
// so that a lease checks itself half a second after each; the child is
// stopped 5 s after the send time of the last acknowledged renewal and
// killed a second later, 9 s before the lease can expire.
var azTestTimings = timings{lease: 15 * time.Second, deadline: 5 * time.Second, retry: time.Second, grace: time.Second}

var azTimings = azTestTimings.flags()

const (
	azLease = 15 * time.Second
	azRetry = time.Second
)

// azureblobStore is Azure Blob Storage in the scenarios' matrix: Azurite's
// blob service, a container of the store's own, the account's connection
// string in AZURE_STORAGE_CONNECTION_STRING. Waiters read the blob every
// retry period; the holder checks its lease half a retry period after each
// renewal.
func azureblobStore() *store {
	return &store{
		name: "azureblob", start: startAzureBlobStore, timings: azTestTimings,
		// The lease expires in the service 15 s after the last renewal,
		// and the follower reads the blob once per retry period.
		takeover: azLease + azRetry + time.Second, handover: azRetry + 300*time.Millisecond,
		notice: time.Second, statusBound: azLease + 5*time.Second,
		expires: true, ttl: true, durable: true,
		escapeTimings: timings{lease: azLease, deadline: azLease - escapeGrace - 100*time.Millisecond, retry: azRetry, grace: escapeGrace},
		credentials:   []string{"AZURE_STORAGE_CONNECTION_STRING", "AZURE_STORAGE_KEY", "AZURE_STORAGE_SAS_TOKEN"},
		// The account's name, no secret, stays.
		kept: []string{"AZURE_STORAGE_ACCOUNT=acct"},
	}
}

func startAzureBlobStore(t *testing.T) *target {
	e := newAzEnv(t, testenv.StartAzurite(t), "e2e")
	flags := []string{"--azure-container", e.container}
	return &target{
		flags: flags, env: e.env(), key: keyUnder(e.container + "/leaderrun/%s"),
		// The follower has tried once and waits: its first attempt's log
		// line.
		waiting: logWaiting("campaigning"),
		link:    e.az.Addr(),
		via: func(addr string) ([]string, []string) {
			return flags, []string{"AZURE_STORAGE_CONNECTION_STRING=" + e.az.ConnectionStringVia(addr)}
		},
		// The lease's check (half a retry period after its last proof)
		// sees it.
		losses: []loss{{name: "LeaseBroken", says: []string{"refused", "Lease"}, do: func(t *testing.T, _ *env, lock string) time.Time {
			e.breakLease(t, lock)
			return time.Time{}
		}}},
		wipe: func(t *testing.T, lock string) {
			if _, err := e.admin.NewBlobClient("leaderrun/"+lock).Delete(context.Background(), nil); err != nil {
				t.Fatalf("delete the lock blob: %v", err)
			}
		},
		// The break comes within the half retry period between two checks
		// of the lease, so it is the marker's write, conditional on the
		// lease id, that the service refuses: the history shows that term
		// as the job's exit 0 (the runner records how the command ended),
		// and no marker.
		loseCommand: func(t *testing.T, lock string) string { return e.breakCommand(t, lock) },
		record: func(t *testing.T, lock string) string {
			st, code := e.status(t, lock)
			return fmt.Sprintf("exit %d, held %v by %s with token %d", code, st.Held, st.Identity, st.Token)
		},
		stopServer: func(testing.TB) { e.az.Stop() }, startServer: func(testing.TB) { e.az.Start() },
	}
}

// newAzEnv is a container of the test's own on az, and a client of the
// container that plays the operator.
func newAzEnv(t *testing.T, az *testenv.Azurite, name string) *azEnv {
	t.Helper()
	e := &azEnv{az: az, container: name}
	var err error
	if e.admin, err = container.NewClientFromConnectionString(az.ConnectionString(), e.container, nil); err != nil {
		t.Fatal(err)
	}
	return e
}

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

// TestAzureBlob runs what only Azure Blob Storage has against one
// Azurite, each test in a container of its own: the lease durations the
// service grants, and its errors.
func TestAzureBlob(t *testing.T) {
	t.Parallel()
	az := testenv.StartAzurite(t)
	for i, tc := range []struct {
		name string
		run  func(*testing.T, *azEnv)
	}{
		{"LeaseDurations", testAzLeaseDurations},
		{"Unreachable", testAzUnreachable},
	} {
		t.Run(tc.name, func(t *testing.T) {
			tc.run(t, newAzEnv(t, az, fmt.Sprintf("e2e%d-%s", i, strings.ToLower(tc.name))))
		})
	}
}

// testAzUnreachable: a port where nothing listens, or one that accepts
// connections and says nothing, is exit 69 naming it, without the
// account key.
func testAzUnreachable(t *testing.T, e *azEnv) {
	events := etcdEvents(t)
	refused := "127.0.0.1:" + strconv.Itoa(testenv.FreePort(t, "127.0.0.1"))
	silent, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer silent.Close()
	for _, addr := range []string{refused, silent.Addr().String()} {
		began := time.Now()
		p := startProgram(t, append(childEnv(events, "exit:0"), "AZURE_STORAGE_CONNECTION_STRING="+e.az.ConnectionStringVia(addr)),
			testenv.Leaderrun(t), append(append(e.args("unreachable", "u"), "--wait", "1s", "--"), childArgv(t)...)...)
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
		if tc.code == 64 && (!strings.Contains(p.stderr.String(), "--lease-duration") || !strings.Contains(p.stderr.String(), "15s to 1m")) {
			t.Errorf("--lease-duration %s: the message does not name the flag and the range:\n%s", tc.lease, p.stderr.String())
		}
		if tc.code == 64 && count(readEvents(t, events), "start") != 0 {
			t.Errorf("--lease-duration %s: the command ran", tc.lease)
		}
	}
}
