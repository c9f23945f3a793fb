//go:build linux

package e2e

import (
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/json"
	"encoding/pem"
	"fmt"
	"math/big"
	"os"
	"path/filepath"
	"reflect"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/leaderrun/leaderrun/internal/testenv"
)

// The test binary doubles as an exec credential plugin (client-go runs it
// from a kubeconfig's exec entry) when E2E_CERT_PLUGIN is set: it issues
// a client certificate for $E2E_CERT_USER signed by the CA in
// $E2E_CERT_CA / $E2E_CERT_CA_KEY, valid for $E2E_CERT_VALID, and says
// that it expires 2 s before it does, so that client-go asks for the next
// one while this one still works. It logs each serial number to
// $E2E_CERT_LOG.
func init() {
	if os.Getenv("E2E_CERT_PLUGIN") == "" {
		return
	}
	if err := certPlugin(); err != nil {
		fmt.Fprintln(os.Stderr, "cert plugin:", err)
		os.Exit(1)
	}
	os.Exit(0)
}

func certPlugin() error {
	valid, err := time.ParseDuration(os.Getenv("E2E_CERT_VALID"))
	if err != nil {
		return err
	}
	caPEM, err := os.ReadFile(os.Getenv("E2E_CERT_CA"))
	if err != nil {
		return err
	}
	caKeyPEM, err := os.ReadFile(os.Getenv("E2E_CERT_CA_KEY"))
	if err != nil {
		return err
	}
	caBlock, _ := pem.Decode(caPEM)
	keyBlock, _ := pem.Decode(caKeyPEM)
	if caBlock == nil || keyBlock == nil {
		return fmt.Errorf("CA files hold no PEM")
	}
	ca, err := x509.ParseCertificate(caBlock.Bytes)
	if err != nil {
		return err
	}
	caKey, err := x509.ParsePKCS8PrivateKey(keyBlock.Bytes)
	if err != nil {
		return err
	}
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		return err
	}
	serial, err := rand.Int(rand.Reader, big.NewInt(1<<62))
	if err != nil {
		return err
	}
	now := time.Now()
	der, err := x509.CreateCertificate(rand.Reader, &x509.Certificate{
		SerialNumber: serial,
		Subject:      pkix.Name{CommonName: os.Getenv("E2E_CERT_USER")},
		NotBefore:    now.Add(-time.Second),
		NotAfter:     now.Add(valid),
		KeyUsage:     x509.KeyUsageDigitalSignature,
		ExtKeyUsage:  []x509.ExtKeyUsage{x509.ExtKeyUsageClientAuth},
	}, ca, &key.PublicKey, caKey)
	if err != nil {
		return err
	}
	keyDER, err := x509.MarshalPKCS8PrivateKey(key)
	if err != nil {
		return err
	}
	logf, err := os.OpenFile(os.Getenv("E2E_CERT_LOG"), os.O_WRONLY|os.O_APPEND|os.O_CREATE, 0o600)
	if err != nil {
		return err
	}
	fmt.Fprintf(logf, "%d %s\n", now.UnixNano(), serial)
	logf.Close()
	return json.NewEncoder(os.Stdout).Encode(map[string]any{
		"apiVersion": "client.authentication.k8s.io/v1",
		"kind":       "ExecCredential",
		"status": map[string]any{
			"clientCertificateData": string(pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: der})),
			"clientKeyData":         string(pem.EncodeToMemory(&pem.Block{Type: "PRIVATE KEY", Bytes: keyDER})),
			"expirationTimestamp":   now.Add(valid - 2*time.Second).UTC().Format(time.RFC3339),
		},
	})
}

// TestKubernetesExecCertRotation (issue 24): an exec plugin issues client
// certificates signed by the apiserver's client CA, each valid 32 s and
// due for renewal after 30 s. leaderrun leads for 90 s on them without
// losing the Lease: client-go runs the plugin again as each expires and
// opens new connections with the new certificate (the apiserver refuses
// an expired one on a connection it already has). The apiserver's audit
// log shows the certificate's user renewing all along.
func TestKubernetesExecCertRotation(t *testing.T) {
	t.Parallel()
	const user, valid, hold = "exec-cert-rotated", 32 * time.Second, 90 * time.Second
	e := newKubeEnv(t)
	e.k.Grant(t, e.ns, user, "get", "create", "update", "watch")
	self, err := os.Executable()
	if err != nil {
		t.Fatal(err)
	}
	caCert, caKey := e.k.ClientCA()
	certLog := filepath.Join(t.TempDir(), "certs")
	kc := filepath.Join(t.TempDir(), "kubeconfig")
	cfg := fmt.Sprintf(`apiVersion: v1
kind: Config
clusters:
- name: test
  cluster: {server: %s, certificate-authority: %s}
users:
- name: u
  user:
    exec:
      apiVersion: client.authentication.k8s.io/v1
      command: %s
      interactiveMode: Never
      env:
      - {name: E2E_CERT_PLUGIN, value: "1"}
      - {name: E2E_CERT_USER, value: %s}
      - {name: E2E_CERT_CA, value: %s}
      - {name: E2E_CERT_CA_KEY, value: %s}
      - {name: E2E_CERT_VALID, value: %s}
      - {name: E2E_CERT_LOG, value: %s}
contexts:
- name: c
  context: {cluster: test, user: u, namespace: %s}
current-context: c
`, e.k.URL, e.k.CAFile, self, user, caCert, caKey, valid, certLog, e.ns)
	if err := os.WriteFile(kc, []byte(cfg), 0o600); err != nil {
		t.Fatal(err)
	}
	events := etcdEvents(t)
	// A lease of 10 s and a renew deadline of 6 s: each rotation runs the
	// plugin (this test binary, built with -race) and dials anew, which a
	// busy machine has slowed past the usual 2 s deadline; a certificate
	// refused for good still fails every renewal and loses the lease.
	p := e.runWith(t, kc, events, "forever", "rotated", "leader", "--lease-duration", "10s", "--renew-deadline", "6s")
	evs := waitEvents(t, events, 15*time.Second, "the child", etcdHas("start", "leader"))
	started, _ := etcdFind(evs, "start", "leader")
	// Hold for 90 s: a renewal refused for longer than the 6 s deadline
	// would stop the child and end leaderrun.
	deadline := time.After(hold)
	select {
	case <-p.done:
		t.Fatalf("leaderrun ended after %v of leadership (exit %d):\n%s", time.Since(started.At), p.code, p.stderr.String())
	case <-deadline:
	}
	p.signal(syscall.SIGTERM)
	if code := p.wait(10 * time.Second); code != 0 {
		t.Errorf("leaderrun exited %d after SIGTERM, want the child's 0 (a lost lease is 76):\n%s", code, p.stderr.String())
	}
	t.Logf("%d failed renewals over %v", strings.Count(p.stderr.String(), "lease renewal failed"), hold)
	if evs := readEvents(t, events); count(evs, "start") != 1 || strings.Contains(p.stderr.String(), "leadership lost") {
		t.Errorf("the child started %d times; leaderrun's log:\n%s", count(evs, "start"), p.stderr.String())
	}
	data, err := os.ReadFile(certLog)
	if err != nil {
		t.Fatal(err)
	}
	issued := strings.Fields(string(data))
	serials := map[string]bool{}
	var times []time.Time
	for i := 0; i+1 < len(issued); i += 2 {
		ns, _ := strconv.ParseInt(issued[i], 10, 64)
		times = append(times, time.Unix(0, ns))
		serials[issued[i+1]] = true
	}
	t.Logf("%d certificates issued at %v after the first", len(serials), offsets(times))
	if len(serials) < 3 {
		t.Errorf("%d certificates issued over %v, want at least 3 (one per %v)", len(serials), hold, valid-2*time.Second)
	}
	// Renewals by the certificate's user, through the last 30 s.
	var renewals, late int
	for _, r := range e.k.LeaseRequests(t) {
		if r.Namespace == e.ns && r.User == user && r.Verb == "update" && r.Code == 200 {
			renewals++
			if r.At.After(started.At.Add(hold - 30*time.Second)) {
				late++
			}
		}
	}
	t.Logf("%d renewals as %s, %d in the last 30 s", renewals, user, late)
	if late < 20 {
		t.Errorf("%d renewals as %s in the last 30 s of leadership, want about one a second", late, user)
	}
}

func offsets(ts []time.Time) []time.Duration {
	var out []time.Duration
	for _, t := range ts {
		out = append(out, t.Sub(ts[0]).Round(100*time.Millisecond))
	}
	return out
}

// TestKubernetesImpersonation (issue 24): a kubeconfig user that
// impersonates another (as:) with extras (as-user-extra:) reaches the
// apiserver as that user with those extras: every request on the Lease
// in the audit log.
func TestKubernetesImpersonation(t *testing.T) {
	t.Parallel()
	e := newKubeEnv(t)
	kc := filepath.Join(t.TempDir(), "kubeconfig")
	cfg := fmt.Sprintf(`apiVersion: v1
kind: Config
clusters:
- name: test
  cluster: {server: %s, certificate-authority: %s}
users:
- name: u
  user:
    token: %s
    as: %s
    as-user-extra:
      reason: [nightly-report]
      ticket: ["OPS-1", "OPS-2"]
contexts:
- name: c
  context: {cluster: test, user: u, namespace: %s}
current-context: c
`, e.k.URL, e.k.CAFile, e.k.Token(testenv.KubeAdmin), testenv.KubeLimited, e.ns)
	if err := os.WriteFile(kc, []byte(cfg), 0o600); err != nil {
		t.Fatal(err)
	}
	events := etcdEvents(t)
	if code := e.runWith(t, kc, events, "exit:0", "impersonated", "leader").wait(15 * time.Second); code != 0 {
		t.Fatalf("exit %d", code)
	}
	want := map[string][]string{"reason": {"nightly-report"}, "ticket": {"OPS-1", "OPS-2"}}
	n := 0
	for _, r := range e.k.LeaseRequests(t) {
		if r.Namespace != e.ns || r.Name != "impersonated" && r.Verb != "watch" {
			continue
		}
		n++
		if r.User != testenv.KubeAdmin || r.Impersonated != testenv.KubeLimited || !reflect.DeepEqual(r.ImpersonatedExtra, want) {
			t.Errorf("%s as %q impersonating %q with %v; want %s impersonating %s with %v",
				r.Verb, r.User, r.Impersonated, r.ImpersonatedExtra, testenv.KubeAdmin, testenv.KubeLimited, want)
		}
	}
	t.Logf("%d requests on the Lease, all as %s impersonating %s with %v", n, testenv.KubeAdmin, testenv.KubeLimited, want)
	if n < 3 {
		t.Errorf("%d requests on the Lease in the audit log, want the read, the grant and the release at least", n)
	}
}

// TestKubernetesInClusterTokenRotation: in a pod (rest.InClusterConfig),
// the kubelet swaps a new bound service-account token into the token file
// while the old one is still valid, as it does at 80% of a token's life.
// client-go reads the file again within a minute (the old token is cached
// that long), so the leader's renewals go on as the new account; then the
// old account is deleted, which voids its token, and the leader keeps the
// Lease on the new one for a whole lease more: its child is never stopped.
func TestKubernetesInClusterTokenRotation(t *testing.T) {
	t.Parallel()
	e := newKubeEnv(t)
	old, next := "runner", "runner-rotated"
	for _, sa := range []string{old, next} {
		e.k.Grant(t, e.ns, "system:serviceaccount:"+e.ns+":"+sa, "get", "create", "update", "watch")
	}
	events := etcdEvents(t)
	argv := []string{"leaderrun", "--backend", "kubernetes", "--lock", "rotated", "--identity", "pod-a",
		"--lease-duration", "8s", "--renew-deadline", "5s", "--retry-period", "1s", "--kill-grace", "1s", "--", childArgv(t)[0]}
	p, sa := inPodDir(t, e.k, e.ns, e.k.ServiceAccountToken(t, e.ns, old), argv, childEnv(events, "forever"))
	waitEvents(t, events, 15*time.Second, "the child", etcdHas("start", "pod-a"))

	// The kubelet's way: a new file renamed over the old one.
	tmp := filepath.Join(sa, "..token.tmp")
	if err := os.WriteFile(tmp, []byte(e.k.ServiceAccountToken(t, e.ns, next)), 0o644); err != nil {
		t.Fatal(err)
	}
	if err := os.Rename(tmp, filepath.Join(sa, "token")); err != nil {
		t.Fatal(err)
	}
	rotated := time.Now()
	newUser := "system:serviceaccount:" + e.ns + ":" + next
	waitFor(t, 90*time.Second, "a renewal as "+newUser, func() bool {
		for _, r := range e.k.LeaseRequests(t) {
			if r.Namespace == e.ns && r.User == newUser && r.Verb == "update" && r.Code == 200 {
				return true
			}
		}
		return false
	})
	t.Logf("renewing as %s %v after the rotation", newUser, time.Since(rotated).Round(time.Millisecond))
	e.k.Admin(t, "DELETE", "/api/v1/namespaces/"+e.ns+"/serviceaccounts/"+old, nil)
	select {
	case <-p.done:
		t.Fatalf("leaderrun ended (exit %d):\n%s", p.code, p.stderr.String())
	case <-time.After(8 * time.Second): // a whole lease on the new token alone
	}
	p.signal(syscall.SIGTERM)
	if code := p.wait(10 * time.Second); code != 0 || strings.Contains(p.stderr.String(), "renewal failed") {
		t.Errorf("exit %d, want the child's 0 and no failed renewal:\n%s", code, p.stderr.String())
	}
	if evs := readEvents(t, events); count(evs, "start") != 1 {
		t.Errorf("the child started %d times", count(evs, "start"))
	}
}

// TestKubernetesExecPluginWhileLeading: leaderrun reaps the orphans of
// its command as a subreaper; the exec credential plugins that client-go
// runs are leaderrun's children too, and must be left to client-go to
// wait for. A plugin whose token is always expired runs for every
// request: over 10 s of leadership, every renewal gets its credential,
// none fails with a plugin reaped from under client-go ("waitid: no child
// processes").
func TestKubernetesExecPluginWhileLeading(t *testing.T) {
	t.Parallel()
	e := newKubeEnv(t)
	dir := t.TempDir()
	plugin := filepath.Join(dir, "plugin.sh")
	script := fmt.Sprintf(`#!/bin/sh
echo run >>%s/runs
printf '{"apiVersion":"client.authentication.k8s.io/v1","kind":"ExecCredential","status":{"token":"%s","expirationTimestamp":"2000-01-01T00:00:00Z"}}'
`, dir, e.k.Token(testenv.KubeLimited))
	testenv.WriteExecutable(t, plugin, []byte(script), 0o700)
	kc := filepath.Join(dir, "kubeconfig")
	cfg := fmt.Sprintf(`apiVersion: v1
kind: Config
clusters:
- name: test
  cluster: {server: %s, certificate-authority: %s}
users:
- name: u
  user:
    exec: {apiVersion: client.authentication.k8s.io/v1, command: %s, interactiveMode: Never}
contexts:
- name: c
  context: {cluster: test, user: u, namespace: %s}
current-context: c
`, e.k.URL, e.k.CAFile, plugin, e.ns)
	if err := os.WriteFile(kc, []byte(cfg), 0o600); err != nil {
		t.Fatal(err)
	}
	events := etcdEvents(t)
	p := e.runWith(t, kc, events, "forever", "plugin", "leader", "--retry-period", "200ms", "--lease-duration", "5s")
	waitEvents(t, events, 15*time.Second, "the child", etcdHas("start", "leader"))
	select {
	case <-p.done:
		t.Fatalf("leaderrun ended (exit %d):\n%s", p.code, p.stderr.String())
	case <-time.After(10 * time.Second):
	}
	p.signal(syscall.SIGTERM)
	code := p.wait(10 * time.Second)
	data, _ := os.ReadFile(filepath.Join(dir, "runs"))
	out := p.stderr.String()
	t.Logf("the plugin ran %d times; %d failed renewals", strings.Count(string(data), "run"), strings.Count(out, "lease renewal failed"))
	if code != 0 || strings.Contains(out, "no child processes") || strings.Contains(out, "renewal failed") {
		t.Errorf("exit %d, want the child's 0 with no failed renewal:\n%s", code, out)
	}
}
