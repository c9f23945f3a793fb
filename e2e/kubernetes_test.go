//go:build linux

package e2e

import (
	"encoding/json"
	"fmt"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/leaderrun/leaderrun/internal/testenv"
)

// kubeTestTimings: the Lease is written as 3 s; renewals 1 s apart, so
// that a client-go elector on the same Lease sees every one and the
// runner may count on all 3 s (see docs/backends/kubernetes.md); the
// child is stopped 2 s after the send time of the last acknowledged
// renewal and killed 500 ms later, 500 ms before any follower may take
// over.
var kubeTestTimings = timings{lease: 3 * time.Second, deadline: 2 * time.Second, retry: time.Second, grace: 500 * time.Millisecond}

var kubeTimings = kubeTestTimings.flags()

const (
	kubeLease = 3 * time.Second
	kubeRetry = time.Second
)

// kubernetesStore is Kubernetes in the scenarios' matrix: an apiserver of
// its own (not SharedKube), a namespace in which the user KubeLimited
// has exactly the verbs the backend needs. Its scenarios run one at a
// time: a waiting candidate shows only in the apiserver's count of open
// watches of leases.
func kubernetesStore() *store {
	return &store{
		name: "kubernetes", start: startKubernetesStore, timings: kubeTestTimings, serial: true,
		// The follower times the record on its own clock from the last
		// renewal it saw, and watches it.
		takeover: kubeLease + kubeRetry + 500*time.Millisecond, handover: 300 * time.Millisecond,
		notice: 100 * time.Millisecond, statusBound: kubeLease + 5*time.Second,
		expires: true, ttl: true, remaining: true, durable: true, lostTerm: true,
		// A lease of 2 s (renewals 1 s apart, so all of it counts) for a
		// takeover inside the fleet's --wait 4s after a kill -9.
		onceTimings:   timings{lease: 2 * time.Second, deadline: 1400 * time.Millisecond, retry: time.Second, grace: 500 * time.Millisecond},
		escapeTimings: timings{lease: 3 * time.Second, deadline: 2 * time.Second, retry: time.Second, grace: escapeGrace},
	}
}

func startKubernetesStore(t *testing.T) *target {
	e := newKubeEnvOn(t, testenv.StartKube(t))
	k, ns := e.k, e.ns
	return &target{
		flags: []string{"--kubeconfig", e.kubeconfig}, key: keyUnder(ns + "/leases/%s"),
		waiting: func(t *testing.T, lock string) func(*proc) bool {
			before := k.LeaseWatches(t)
			watching := every(50*time.Millisecond, func() bool { return k.LeaseWatches(t) >= before+1 })
			return func(*proc) bool { return watching() }
		},
		link: k.Addr(),
		via: func(addr string) ([]string, []string) {
			return []string{"--kubeconfig", k.KubeconfigVia(t, "https://"+addr, testenv.KubeLimited, ns)}, nil
		},
		// The holder changed comes first: the scenarios that need one loss
		// keep the Lease, and with it the history it holds.
		losses: []loss{
			{name: "HolderChanged", says: []string{`was taken by \"operator\"`}, do: func(t *testing.T, _ *env, lock string) time.Time {
				e.setHolder(t, lock, "operator")
				return time.Time{}
			}},
			{name: "Deleted", says: []string{"was deleted"}, do: func(t *testing.T, _ *env, lock string) time.Time {
				e.deleteLease(t, lock)
				return time.Time{}
			}},
			{name: "HolderCleared", says: []string{"was released by someone else"}, do: func(t *testing.T, _ *env, lock string) time.Time {
				e.setHolder(t, lock, "")
				return time.Time{}
			}},
		},
		wipe: func(t *testing.T, lock string) {
			e.deleteLease(t, lock)
			if st := e.lease(t, lock); st.Exists {
				t.Fatalf("the Lease still exists after DELETE: %+v", st)
			}
		},
		// The holder is changed rather than the Lease deleted because the
		// history lives in the Lease: a DELETE takes the terms before it
		// along (docs/backends/kubernetes.md).
		loseCommand: func(t *testing.T, lock string) string { return e.takeCommand(t, lock, "operator") },
		record: func(t *testing.T, lock string) string {
			st := e.lease(t, lock)
			return fmt.Sprintf("%s token %d transitions %d", st.Holder, st.Token, st.Transitions)
		},
		stopServer: k.Stop, startServer: k.Start,
	}
}

// kubeEnv is the apiserver that the e2e tests share and a namespace of the
// test's own, in which the user KubeLimited has exactly the verbs the
// backend needs: get, create, update and watch on leases.
type kubeEnv struct {
	k          *testenv.Kube
	ns         string
	kubeconfig string // KubeLimited's, in ns
}

func newKubeEnv(t *testing.T) *kubeEnv {
	t.Helper()
	return newKubeEnvOn(t, testenv.SharedKube(t))
}

// newKubeEnvOn is newKubeEnv on the apiserver k: one of the test's own
// (testenv.StartKube) for a test that counts the apiserver's watches
// and runs in parallel with others.
func newKubeEnvOn(t *testing.T, k *testenv.Kube) *kubeEnv {
	t.Helper()
	ns := k.Namespace(t)
	k.Grant(t, ns, testenv.KubeLimited, "get", "create", "update", "watch")
	return &kubeEnv{k: k, ns: ns, kubeconfig: k.Kubeconfig(t, testenv.KubeLimited, ns)}
}

// args are leaderrun's flags for lock as identity id, with kubeTimings.
func (e *kubeEnv) args(kubeconfig, lock, id string, extra ...string) []string {
	a := []string{"--kubeconfig", kubeconfig, "--lock", lock, "--identity", id}
	return append(append(a, kubeTimings...), extra...)
}

// run starts leaderrun with the recording child in mode.
func (e *kubeEnv) run(t *testing.T, events, mode, lock, id string, extra ...string) *proc {
	t.Helper()
	return e.runWith(t, e.kubeconfig, events, mode, lock, id, extra...)
}

func (e *kubeEnv) runWith(t *testing.T, kubeconfig, events, mode, lock, id string, extra ...string) *proc {
	t.Helper()
	args := append(e.args(kubeconfig, lock, id, extra...), "--")
	return start(t, childEnv(events, mode), append(args, childArgv(t)...)...)
}

// via returns a kubeconfig of KubeLimited that reaches the apiserver
// through a proxy of its own (TLS passes through it), and the proxy.
func (e *kubeEnv) via(t *testing.T) (string, *testenv.Proxy) {
	t.Helper()
	p := testenv.NewProxy(t, e.k.Addr())
	return e.k.KubeconfigVia(t, "https://"+p.Addr(), testenv.KubeLimited, e.ns), p
}

func (e *kubeEnv) leasePath(lock string) string {
	return "/apis/coordination.k8s.io/v1/namespaces/" + e.ns + "/leases/" + lock
}

// kubeLeaseState is what the admin reads of a Lease.
type kubeLeaseState struct {
	Exists          bool
	Holder          string
	Transitions     int
	DurationSeconds int
	RenewTime       string
	Token           uint64 // of the leaderrun/token annotation
	ResourceVersion string
}

func (e *kubeEnv) lease(t *testing.T, lock string) kubeLeaseState {
	t.Helper()
	code, data := e.k.Request(t, testenv.KubeAdmin, http.MethodGet, e.leasePath(lock), nil)
	if code == http.StatusNotFound {
		return kubeLeaseState{}
	}
	if code != http.StatusOK {
		t.Fatalf("get lease %s: %d %s", lock, code, data)
	}
	var obj struct {
		Metadata struct {
			ResourceVersion string            `json:"resourceVersion"`
			Annotations     map[string]string `json:"annotations"`
		} `json:"metadata"`
		Spec struct {
			HolderIdentity       string `json:"holderIdentity"`
			LeaseDurationSeconds int    `json:"leaseDurationSeconds"`
			LeaseTransitions     int    `json:"leaseTransitions"`
			RenewTime            string `json:"renewTime"`
		} `json:"spec"`
	}
	if err := json.Unmarshal(data, &obj); err != nil {
		t.Fatal(err)
	}
	st := kubeLeaseState{Exists: true, Holder: obj.Spec.HolderIdentity, Transitions: obj.Spec.LeaseTransitions,
		DurationSeconds: obj.Spec.LeaseDurationSeconds, RenewTime: obj.Spec.RenewTime, ResourceVersion: obj.Metadata.ResourceVersion}
	var g struct {
		Token uint64 `json:"token,string"`
	}
	if v, ok := obj.Metadata.Annotations["leaderrun/token"]; ok && json.Unmarshal([]byte(v), &g) == nil {
		st.Token = g.Token
	}
	return st
}

// deleteLease and setHolder play an operator editing the Lease.
func (e *kubeEnv) deleteLease(t *testing.T, lock string) {
	t.Helper()
	e.k.Admin(t, http.MethodDelete, e.leasePath(lock), nil)
}

func (e *kubeEnv) setHolder(t *testing.T, lock, holder string) {
	t.Helper()
	e.k.Admin(t, http.MethodPatch, e.leasePath(lock), map[string]any{"spec": map[string]any{"holderIdentity": holder}})
}

// watching waits until at least n more watches of leases are open than
// before: a waiting candidate has read the Lease and follows it (leaderrun
// reports no waiters for Kubernetes; the apiserver counts its watches).
func (e *kubeEnv) watching(t *testing.T, before, n int) {
	t.Helper()
	waitFor(t, 10*time.Second, fmt.Sprintf("%d more watches of leases than %d", n, before), every(50*time.Millisecond, func() bool {
		return e.k.LeaseWatches(t) >= before+n
	}))
}

func (e *kubeEnv) status(t *testing.T, lock string) (etcdStatus, int) {
	t.Helper()
	out, code := output(t, "status", "--json", "--lock", lock, "--kubeconfig", e.kubeconfig)
	var st etcdStatus
	if code == 0 || code == 3 {
		if err := json.Unmarshal([]byte(out), &st); err != nil {
			t.Fatalf("status --json printed %q: %v", out, err)
		}
	}
	return st, code
}

// TestKubernetesTransitionsAfterDelete: rounds of three contenders
// (--wait), each running its child for 200 ms; between rounds the admin
// deletes the Lease. leaseTransitions starts again (it is 3 after every
// round), the token never does: every token is greater than the one
// before, and never two children at once.
func TestKubernetesTransitionsAfterDelete(t *testing.T) {
	t.Parallel()
	e := newKubeEnv(t)
	events := etcdEvents(t)
	const rounds, together = 3, 3
	var transitions []int
	for r := range rounds {
		if r > 0 {
			e.deleteLease(t, "handover")
			if st := e.lease(t, "handover"); st.Exists {
				t.Fatalf("round %d: the Lease still exists after DELETE: %+v", r, st)
			}
		}
		var ps []*proc
		for i := range together {
			ps = append(ps, e.run(t, events, "sleep:200ms", "handover", fmt.Sprintf("r%d-i%d", r, i), "--wait", "30s"))
		}
		for _, p := range ps {
			if code := p.wait(60 * time.Second); code != 0 {
				t.Fatalf("round %d: an instance exited %d:\n%s", r, code, p.stderr.String())
			}
		}
		transitions = append(transitions, e.lease(t, "handover").Transitions)
	}
	evs := readEvents(t, events)
	ivs := checkExclusive(t, evs)
	if len(ivs) != rounds*together {
		t.Fatalf("%d children ran, want %d:\n%s", len(ivs), rounds*together, formatEvents(evs))
	}
	for r, n := range transitions {
		if n != together {
			t.Errorf("round %d: leaseTransitions %d, want %d (the Lease is new every round)", r, n, together)
		}
	}
	t.Logf("%d handovers, %d across a DELETE of the Lease; leaseTransitions after each round %v", len(ivs)-1, rounds-1, transitions)
}

// TestKubernetesStatusAfterKill9 (issue 26): after its leader is killed
// with SIGKILL, status says held (exit 0) while the lease can still be
// alive, and not held (exit 3) once no renewal was seen for
// leaseDurationSeconds: renewTime, written by the holder, against the
// status host's clock (here the same clock).
func TestKubernetesStatusAfterKill9(t *testing.T) {
	t.Parallel()
	e := newKubeEnv(t)
	events := etcdEvents(t)
	leader := e.run(t, events, "forever", "dead", "leader")
	waitEvents(t, events, 10*time.Second, "the leader's child", etcdHas("start", "leader"))
	if err := syscall.Kill(-leader.pid(), syscall.SIGKILL); err != nil {
		t.Fatal(err)
	}
	killed := time.Now()
	leader.wait(5 * time.Second)
	st, code := e.status(t, "dead")
	if code != 0 || !st.Held || st.Identity != "leader" {
		t.Errorf("status at once after the kill: exit %d, %+v; want held by leader (its lease may still run)", code, st)
	}
	lease := e.lease(t, "dead")
	renewed, err := time.Parse(time.RFC3339Nano, lease.RenewTime)
	if err != nil {
		t.Fatal(err)
	}
	expires := renewed.Add(time.Duration(lease.DurationSeconds) * time.Second)
	var freed time.Time
	waitFor(t, kubeLease+5*time.Second, "status exit 3", every(20*time.Millisecond, func() bool {
		st, code = e.status(t, "dead")
		if code == 3 && freed.IsZero() {
			freed = time.Now()
		}
		return code == 3
	}))
	t.Logf("status says not held %v after the kill, %v after the last renewal's lease ran out",
		freed.Sub(killed).Round(time.Millisecond), freed.Sub(expires).Round(time.Millisecond))
	if st.Held || st.Identity != "" {
		t.Errorf("status --json once the lease ran out: %+v, want not held", st)
	}
	if freed.Before(expires) {
		t.Errorf("status said not held at %v, before the lease ran out at %v", freed, expires)
	}
	if out, code := output(t, "status", "--lock", "dead", "--kubeconfig", e.kubeconfig); code != 3 || !strings.Contains(out, "none") {
		t.Errorf("status: exit %d, output:\n%s\nwant exit 3 and leader none", code, out)
	}
}

// TestKubernetesErrors: refusals are exit 69 at once, in every mode,
// naming the verb RBAC denied; an apiserver that cannot be reached is 69
// naming it; a lock that cannot name a Lease is 64 naming the rule.
func TestKubernetesErrors(t *testing.T) {
	t.Parallel()
	k := testenv.SharedKube(t)
	verbs := []string{"get", "create", "update", "watch"}
	for _, missing := range verbs {
		ns := k.Namespace(t)
		granted := slices.DeleteFunc(slices.Clone(verbs), func(v string) bool { return v == missing })
		k.Grant(t, ns, testenv.KubeLimited, granted...)
		kc := k.Kubeconfig(t, testenv.KubeLimited, ns)
		for _, mode := range [][]string{nil, {"--try"}, {"--wait", "5s"}} {
			t.Run(fmt.Sprintf("without %s %v", missing, mode), func(t *testing.T) {
				args := append([]string{"--kubeconfig", kc, "--lock", "refused"}, kubeTimings...)
				began := time.Now()
				out, code := output(t, append(append(args, mode...), "--", "/bin/true")...)
				took := time.Since(began)
				t.Logf("exit %d after %v: %s", code, took.Round(time.Millisecond), lastLine(out))
				// The apiserver's words, quoted in the log line.
				want := fmt.Sprintf(`cannot %s resource \"leases\"`, missing)
				if code != 69 || !strings.Contains(out, want) || !strings.Contains(out, k.URL) {
					t.Errorf("exit %d; want 69 saying %q and naming %s", code, want, k.URL)
				}
				if took > 3*time.Second {
					t.Errorf("took %v: a refusal must not be retried", took)
				}
			})
		}
	}
	t.Run("unreachable", func(t *testing.T) {
		addr := fmt.Sprintf("127.0.0.1:%d", testenv.FreePort(t, "127.0.0.1"))
		kc := k.KubeconfigVia(t, "https://"+addr, testenv.KubeLimited, "")
		out, code := output(t, append(append([]string{"--kubeconfig", kc, "--lock", "unreachable", "--wait", "1s"}, kubeTimings...), "--", "/bin/true")...)
		t.Logf("exit %d: %s", code, lastLine(out))
		if code != 69 || !strings.Contains(out, addr) || strings.Contains(out, k.Token(testenv.KubeLimited)) {
			t.Errorf("exit %d; want 69 naming %s, without the token", code, addr)
		}
	})
	t.Run("lock name", func(t *testing.T) {
		out, code := output(t, "--kubeconfig", k.Kubeconfig(t, testenv.KubeLimited, ""), "--lock", "Billing_Job", "--", "/bin/true")
		if code != 64 || !strings.Contains(out, "RFC 1123 subdomain") {
			t.Errorf("exit %d, output %q; want 64 naming the rule", code, out)
		}
	})
}

// takeCommand is a shell command that makes holder the Lease's holder as
// the admin, as an operator's kubectl patch would.
func (e *kubeEnv) takeCommand(t *testing.T, lock, holder string) string {
	t.Helper()
	curl, err := exec.LookPath("curl")
	if err != nil {
		testenv.Missing(t, "curl is not installed")
	}
	headers := filepath.Join(t.TempDir(), "headers")
	data := "Authorization: Bearer " + e.k.Token(testenv.KubeAdmin) + "\nContent-Type: application/merge-patch+json\n"
	if err := os.WriteFile(headers, []byte(data), 0o600); err != nil {
		t.Fatal(err)
	}
	return fmt.Sprintf(`%s -sS --fail -o /dev/null --cacert %s -H @%s -X PATCH -d '{"spec":{"holderIdentity":%q}}' %s%s`,
		curl, e.k.CAFile, headers, holder, e.k.URL, e.leasePath(lock))
}
