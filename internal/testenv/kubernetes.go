package testenv

import (
	"bytes"
	"context"
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/tls"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/hex"
	"encoding/json"
	"encoding/pem"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"
)

// KubeAPIServerBinary finds kube-apiserver: $LEADERRUN_KUBE_APISERVER_BIN,
// the cache that scripts/install-kube-apiserver.sh fills, or PATH.
func KubeAPIServerBinary(t testing.TB) string {
	t.Helper()
	return Binary(t, "LEADERRUN_KUBE_APISERVER_BIN", "kube-apiserver-v1.37.2/bin/kube-apiserver", "kube-apiserver")
}

// Users of every Kube, authenticated by bearer token (Kube.Token).
const (
	// KubeAdmin is in system:masters: RBAC allows it everything.
	KubeAdmin = "admin"
	// KubeLimited has no rights until a test grants some (Kube.Grant).
	KubeLimited = "limited"
	// KubeOther is a second user without rights.
	KubeOther = "other"
)

var kubeUsers = []string{KubeAdmin, KubeLimited, KubeOther}

// Kube is a real kube-apiserver on 127.0.0.1 with a one-member etcd of its
// own, RBAC on, as a cluster would run it:
//   - it serves TLS with a certificate for 127.0.0.1 and localhost signed by
//     a CA made for it (CAFile), which also signs client certificates
//     (ClientCert);
//   - the users KubeAdmin, KubeLimited and KubeOther authenticate with
//     bearer tokens (Token);
//   - service accounts get tokens through the TokenRequest API
//     (ServiceAccountToken), signed with a key pair made for it.
//
// No controllers run (no kube-controller-manager): objects are stored and
// watched, nothing reconciles them, namespaces are never finalized.
type Kube struct {
	// URL is the apiserver's address, https://127.0.0.1:PORT.
	URL string
	// CAFile is the PEM certificate of the CA that signed the serving
	// certificate; the apiserver also trusts it for client certificates.
	CAFile string

	dir    string
	name   string // "" for the first server, "-2", "-3", ... for its peers
	ca     *testCert
	tokens map[string]string
	etcd   *Etcd
	http   *http.Client
	peers  *atomic.Int64 // servers started on the same etcd, this one included
	srv    *Server
	seq    atomic.Int64
}

// kubeStartTimeout bounds the wait for /readyz: a cold start on a loaded
// machine takes a few seconds (bootstrap RBAC policy, priority levels).
const kubeStartTimeout = 90 * time.Second

// StartKube starts an apiserver and its etcd for one test; both are
// stopped when the test ends. Tests that can share one (each in its own
// namespace) use SharedKube instead: a start costs seconds.
func StartKube(t testing.TB) *Kube {
	t.Helper()
	return startKube(t, KubeAPIServerBinary(t), EtcdBinary(t))
}

var sharedKube struct {
	mu    sync.Mutex
	kube  *Kube
	err   string
	scope *procScope
}

// SharedKube returns the apiserver that all tests of the test binary
// share, starting it on first use. The package's TestMain must call
// StopSharedKube after m.Run. Tests isolate themselves with a namespace of
// their own (Namespace). A failed start fails every test that asks.
func SharedKube(t testing.TB) *Kube {
	t.Helper()
	apiserver, etcd := KubeAPIServerBinary(t), EtcdBinary(t)
	s := &sharedKube
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.kube == nil && s.err == "" {
		s.scope = newProcScope()
		func() {
			defer s.scope.recover(&s.err)
			s.kube = startKube(s.scope, apiserver, etcd)
		}()
	}
	if s.err != "" {
		t.Fatalf("shared kube-apiserver: %s", s.err)
	}
	return s.kube
}

// StopSharedKube stops the shared apiserver and its etcd, if started, and
// removes their files.
func StopSharedKube() {
	s := &sharedKube
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.scope != nil {
		s.scope.close()
	}
	s.kube, s.scope, s.err = nil, nil, ""
}

func startKube(t scope, apiserver, etcdBin string) *Kube {
	t.Helper()
	k := &Kube{dir: t.TempDir(), tokens: map[string]string{}, peers: new(atomic.Int64)}
	k.peers.Add(1)
	k.etcd = startEtcd(t, etcdBin, 1, nil)
	k.writeFiles(t)
	k.listen(t, apiserver)
	return k
}

// StartPeer starts another apiserver on the same etcd, with the same CA,
// users and service-account keys: a second server of a highly available
// control plane, which clients reach through a load balancer (see
// testenv.NewBalancer and Ready). It stops when t ends.
func (k *Kube) StartPeer(t testing.TB) *Kube {
	t.Helper()
	p := &Kube{CAFile: k.CAFile, dir: k.dir, ca: k.ca, tokens: k.tokens, etcd: k.etcd, http: k.http, peers: k.peers,
		name: fmt.Sprintf("-%d", k.peers.Add(1))}
	p.listen(t, KubeAPIServerBinary(t))
	return p
}

// listen starts the apiserver on a free port and waits until it is ready.
func (k *Kube) listen(t scope, apiserver string) {
	t.Helper()
	var lastErr error
	for try := 0; try < 3; try++ {
		k.URL = fmt.Sprintf("https://127.0.0.1:%d", freePort(t, "127.0.0.1"))
		// Each start's log anew: a retry on another port need not quote
		// the last one's failure.
		log := filepath.Join(k.dir, fmt.Sprintf("kube-apiserver%s.%d.log", k.name, try))
		k.srv = &Server{Name: "kube-apiserver" + k.name, Argv: k.argv(apiserver), Log: log,
			StartTimeout: kubeStartTimeout, Ready: k.ready}
		if lastErr = k.srv.Start(); lastErr == nil {
			t.Cleanup(k.srv.Stop)
			return
		}
		if !strings.Contains(lastErr.Error(), "address already in use") {
			break
		}
	}
	t.Fatalf("start kube-apiserver: %v", lastErr)
}

// writeFiles makes the CA, the serving certificate, the service-account
// key pair and the token file.
func (k *Kube) writeFiles(t scope) {
	t.Helper()
	k.ca = newCert(t, nil, func(c *x509.Certificate) {
		c.Subject.CommonName = "leaderrun test kubernetes CA"
		c.IsCA, c.BasicConstraintsValid = true, true
		c.KeyUsage = x509.KeyUsageCertSign | x509.KeyUsageDigitalSignature
	})
	k.CAFile = k.ca.write(t, k.dir, "ca")
	server := newCert(t, k.ca, func(c *x509.Certificate) {
		c.Subject.CommonName = "kube-apiserver"
		c.ExtKeyUsage = []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth}
		c.IPAddresses = []net.IP{net.IPv4(127, 0, 0, 1)}
		c.DNSNames = []string{"localhost"}
	})
	server.write(t, k.dir, "server")

	saKey, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		t.Fatalf("service-account key: %v", err)
	}
	priv, err := x509.MarshalPKCS8PrivateKey(saKey)
	if err != nil {
		t.Fatalf("service-account key: %v", err)
	}
	pub, err := x509.MarshalPKIXPublicKey(&saKey.PublicKey)
	if err != nil {
		t.Fatalf("service-account key: %v", err)
	}
	writeFile(t, filepath.Join(k.dir, "sa.key"), pem.EncodeToMemory(&pem.Block{Type: "PRIVATE KEY", Bytes: priv}))
	writeFile(t, filepath.Join(k.dir, "sa.pub"), pem.EncodeToMemory(&pem.Block{Type: "PUBLIC KEY", Bytes: pub}))

	var csv strings.Builder
	for _, user := range kubeUsers {
		k.tokens[user] = randomToken(t)
		groups := ""
		if user == KubeAdmin {
			groups = `,"system:masters"`
		}
		fmt.Fprintf(&csv, "%s,%s,%s%s\n", k.tokens[user], user, user, groups)
	}
	writeFile(t, filepath.Join(k.dir, "tokens.csv"), []byte(csv.String()))
	writeFile(t, filepath.Join(k.dir, "audit-policy.yaml"), []byte(auditPolicy))

	pool := x509.NewCertPool()
	pool.AddCert(k.ca.cert)
	k.http = &http.Client{Timeout: 10 * time.Second, Transport: &http.Transport{
		TLSClientConfig: &tls.Config{RootCAs: pool},
	}}
}

func (k *Kube) argv(bin string) []string {
	port := k.URL[strings.LastIndexByte(k.URL, ':')+1:]
	f := func(name string) string { return filepath.Join(k.dir, name) }
	return []string{bin,
		"--etcd-servers=" + strings.Join(k.etcd.Endpoints(), ","),
		"--service-account-issuer=https://kubernetes.default.svc",
		"--service-account-key-file=" + f("sa.pub"),
		"--service-account-signing-key-file=" + f("sa.key"),
		"--authorization-mode=RBAC",
		"--token-auth-file=" + f("tokens.csv"),
		"--client-ca-file=" + k.CAFile,
		"--tls-cert-file=" + f("server.pem"),
		"--tls-private-key-file=" + f("server-key.pem"),
		"--secure-port=" + port,
		"--bind-address=127.0.0.1",
		"--advertise-address=127.0.0.1",
		"--endpoint-reconciler-type=none",
		"--cert-dir=" + f("certs"),
		// Only configuration: no service is ever reached at these addresses.
		"--service-cluster-ip-range=10.96.0.0/24",
		// The ServiceAccount admission plugin wants a token controller,
		// which no test runs.
		"--disable-admission-plugins=ServiceAccount",
		"--profiling=false",
		// Every request on leases, one line each (see Audit).
		"--audit-policy-file=" + f("audit-policy.yaml"),
		"--audit-log-path=" + f("audit"+k.name+".log"),
		"--audit-log-format=json",
		"--audit-log-mode=blocking",
	}
}

// auditPolicy logs each request on leases once, when its answer is
// complete (a watch: when it ends), without bodies; nothing else.
const auditPolicy = `apiVersion: audit.k8s.io/v1
kind: Policy
omitStages: ["RequestReceived", "ResponseStarted"]
rules:
- level: Metadata
  resources:
  - group: coordination.k8s.io
    resources: ["leases"]
- level: None
`

// KubeRequest is one request on leases as the apiserver's audit log
// records it.
type KubeRequest struct {
	User      string    // who sent it
	Verb      string    // get, create, update, watch, delete, ...
	Namespace string    // of the Lease
	Name      string    // of the Lease ("" for a list or a watch by field selector)
	Code      int       // the answer's HTTP status
	At        time.Time // when the apiserver received it
	// SourceIPs are the client's addresses as the apiserver saw them
	// (X-Forwarded-For, X-Real-Ip, then the connection's peer), so that a
	// test can tell the clients apart by the address they connect from.
	SourceIPs []string
	// Impersonated is the user the request acted as (Impersonate-User),
	// "" if none; ImpersonatedExtra its extras (Impersonate-Extra-*).
	Impersonated      string
	ImpersonatedExtra map[string][]string
}

// LeaseRequests reads the audit logs of the apiserver and its peers:
// every request on leases that has been answered (watches that are still
// open are not there yet), in the order each server completed them.
func (k *Kube) LeaseRequests(t testing.TB) []KubeRequest {
	t.Helper()
	files, _ := filepath.Glob(filepath.Join(k.dir, "audit*.log"))
	var data []byte
	for _, f := range files {
		d, err := os.ReadFile(f)
		if err != nil {
			t.Fatalf("audit log: %v", err)
		}
		data = append(data, d...)
	}
	var reqs []KubeRequest
	for _, line := range strings.Split(string(data), "\n") {
		if line == "" {
			continue
		}
		var ev struct {
			Verb string `json:"verb"`
			User struct {
				Username string `json:"username"`
			} `json:"user"`
			ObjectRef struct {
				Namespace string `json:"namespace"`
				Name      string `json:"name"`
			} `json:"objectRef"`
			ResponseStatus struct {
				Code int `json:"code"`
			} `json:"responseStatus"`
			RequestReceivedTimestamp time.Time `json:"requestReceivedTimestamp"`
			SourceIPs                []string  `json:"sourceIPs"`
			ImpersonatedUser         *struct {
				Username string              `json:"username"`
				Extra    map[string][]string `json:"extra"`
			} `json:"impersonatedUser"`
		}
		if json.Unmarshal([]byte(line), &ev) != nil {
			continue // a line being written
		}
		r := KubeRequest{User: ev.User.Username, Verb: ev.Verb, Namespace: ev.ObjectRef.Namespace,
			Name: ev.ObjectRef.Name, Code: ev.ResponseStatus.Code, At: ev.RequestReceivedTimestamp, SourceIPs: ev.SourceIPs}
		if iu := ev.ImpersonatedUser; iu != nil {
			r.Impersonated, r.ImpersonatedExtra = iu.Username, iu.Extra
		}
		reqs = append(reqs, r)
	}
	return reqs
}

// LeaseWatches is how many watches of leases the apiserver is serving now,
// from its own metrics: a candidate that waits holds one open. The
// apiserver itself may hold some; compare with a count taken before.
func (k *Kube) LeaseWatches(t testing.TB) int {
	t.Helper()
	data := k.Admin(t, http.MethodGet, "/metrics", nil)
	n := 0
	for _, line := range strings.Split(string(data), "\n") {
		if !strings.HasPrefix(line, "apiserver_longrunning_requests{") ||
			!strings.Contains(line, `resource="leases"`) || !strings.Contains(line, `verb="WATCH"`) {
			continue
		}
		f := strings.Fields(line)
		v, err := strconv.ParseFloat(f[len(f)-1], 64)
		if err == nil {
			n += int(v)
		}
	}
	return n
}

// Stop stops the apiserver (SIGTERM, as a service manager would), leaving
// its etcd running; Start starts it again on the same port.
func (k *Kube) Stop(t testing.TB) {
	t.Helper()
	k.srv.Stop()
}

// Start starts a stopped apiserver again and waits until it is ready.
func (k *Kube) Start(t testing.TB) {
	t.Helper()
	if err := k.srv.Start(); err != nil {
		t.Fatal(err)
	}
}

// Pid is the apiserver's process id, 0 if it is not running.
func (k *Kube) Pid() int { return k.srv.Pid() }

// Ready reports whether the apiserver answers its /readyz check with ok
// within a second: what a load balancer in front of it asks before it
// sends it a connection.
func (k *Kube) Ready() bool {
	ctx, cancel := context.WithTimeout(context.Background(), time.Second)
	defer cancel()
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, k.URL+"/readyz", nil)
	if err != nil {
		return false
	}
	resp, err := k.http.Do(req)
	if err != nil {
		return false
	}
	resp.Body.Close()
	return resp.StatusCode == http.StatusOK
}

// Addr is the apiserver's host:port.
func (k *Kube) Addr() string { return strings.TrimPrefix(k.URL, "https://") }

// ready asks /readyz, the apiserver's own readiness check.
func (k *Kube) ready() error {
	code, body, err := k.do(KubeAdmin, http.MethodGet, "/readyz", nil)
	if err == nil && code != http.StatusOK {
		err = fmt.Errorf("/readyz: %d %s", code, firstLine(body))
	}
	return err
}

func firstLine(b []byte) string {
	s, _, _ := strings.Cut(string(b), "\n")
	return s
}

// Token is the bearer token of user (KubeAdmin, KubeLimited, KubeOther).
func (k *Kube) Token(user string) string {
	tok, ok := k.tokens[user]
	if !ok {
		panic("testenv: no kube user " + user)
	}
	return tok
}

// do sends one request as user; body, if not nil, is sent as JSON (as a
// merge patch for PATCH).
func (k *Kube) do(user, method, path string, body any) (int, []byte, error) {
	var rd io.Reader
	if body != nil {
		data, err := json.Marshal(body)
		if err != nil {
			return 0, nil, err
		}
		rd = bytes.NewReader(data)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	req, err := http.NewRequestWithContext(ctx, method, k.URL+path, rd)
	if err != nil {
		return 0, nil, err
	}
	req.Header.Set("Authorization", "Bearer "+k.Token(user))
	req.Header.Set("Accept", "application/json")
	switch {
	case method == http.MethodPatch:
		req.Header.Set("Content-Type", "application/merge-patch+json")
	case body != nil:
		req.Header.Set("Content-Type", "application/json")
	}
	resp, err := k.http.Do(req)
	if err != nil {
		return 0, nil, err
	}
	defer resp.Body.Close()
	data, err := io.ReadAll(resp.Body)
	return resp.StatusCode, data, err
}

// Request sends one request as user and returns the status code and body;
// a request that gets no answer fails the test.
func (k *Kube) Request(t testing.TB, user, method, path string, body any) (int, []byte) {
	t.Helper()
	code, data, err := k.do(user, method, path, body)
	if err != nil {
		t.Fatalf("%s %s as %s: %v", method, path, user, err)
	}
	return code, data
}

// Admin sends one request as KubeAdmin and fails the test unless the
// apiserver answers 2xx, or one of the codes in also.
func (k *Kube) Admin(t testing.TB, method, path string, body any, also ...int) []byte {
	t.Helper()
	code, data := k.Request(t, KubeAdmin, method, path, body)
	if code/100 != 2 && !containsInt(also, code) {
		t.Fatalf("%s %s: %d %s", method, path, code, data)
	}
	return data
}

func containsInt(s []int, v int) bool {
	for _, x := range s {
		if x == v {
			return true
		}
	}
	return false
}

// Namespace creates a namespace of the test's own, named after it.
func (k *Kube) Namespace(t testing.TB) string {
	t.Helper()
	name := strings.ToLower(t.Name())
	name = strings.Map(func(r rune) rune {
		if r >= 'a' && r <= 'z' || r >= '0' && r <= '9' {
			return r
		}
		return '-'
	}, name)
	name = strings.Trim(name, "-")
	if len(name) > 40 {
		name = strings.Trim(name[len(name)-40:], "-")
	}
	name = fmt.Sprintf("%s-%d", name, k.seq.Add(1))
	k.Admin(t, http.MethodPost, "/api/v1/namespaces", map[string]any{
		"apiVersion": "v1", "kind": "Namespace", "metadata": map[string]any{"name": name},
	})
	return name
}

// Grant lets subject use the verbs on leases in namespace ns, with a Role
// and a RoleBinding as an operator would write them. A subject of the form
// system:serviceaccount:NS:NAME is bound as that service account, any
// other as a user.
func (k *Kube) Grant(t testing.TB, ns, subject string, verbs ...string) {
	t.Helper()
	name := fmt.Sprintf("leases-%d", k.seq.Add(1))
	k.Admin(t, http.MethodPost, "/apis/rbac.authorization.k8s.io/v1/namespaces/"+ns+"/roles", map[string]any{
		"apiVersion": "rbac.authorization.k8s.io/v1", "kind": "Role",
		"metadata": map[string]any{"name": name},
		"rules": []any{map[string]any{
			"apiGroups": []string{"coordination.k8s.io"}, "resources": []string{"leases"}, "verbs": verbs,
		}},
	})
	subj := map[string]any{"kind": "User", "apiGroup": "rbac.authorization.k8s.io", "name": subject}
	if rest, ok := strings.CutPrefix(subject, "system:serviceaccount:"); ok {
		sans, sa, _ := strings.Cut(rest, ":")
		subj = map[string]any{"kind": "ServiceAccount", "namespace": sans, "name": sa}
	}
	k.Admin(t, http.MethodPost, "/apis/rbac.authorization.k8s.io/v1/namespaces/"+ns+"/rolebindings", map[string]any{
		"apiVersion": "rbac.authorization.k8s.io/v1", "kind": "RoleBinding",
		"metadata": map[string]any{"name": name},
		"roleRef":  map[string]any{"apiGroup": "rbac.authorization.k8s.io", "kind": "Role", "name": name},
		"subjects": []any{subj},
	})
	k.waitAuthorized(t, ns, subject, verbs)
}

// waitAuthorized waits until the apiserver's authorizer allows subject
// every verb on leases in ns: RBAC's caches take a moment to see a new
// binding, and a test's first request must not meet a 403 meanwhile.
func (k *Kube) waitAuthorized(t testing.TB, ns, subject string, verbs []string) {
	t.Helper()
	deadline := time.Now().Add(10 * time.Second)
	for _, verb := range verbs {
		for {
			review := k.Admin(t, http.MethodPost, "/apis/authorization.k8s.io/v1/subjectaccessreviews", map[string]any{
				"apiVersion": "authorization.k8s.io/v1", "kind": "SubjectAccessReview",
				"spec": map[string]any{"user": subject, "resourceAttributes": map[string]any{
					"namespace": ns, "verb": verb, "group": "coordination.k8s.io", "resource": "leases"}},
			})
			var r struct {
				Status struct{ Allowed bool } `json:"status"`
			}
			if err := json.Unmarshal(review, &r); err != nil {
				t.Fatalf("subject access review: %v", err)
			}
			if r.Status.Allowed {
				break
			}
			if time.Now().After(deadline) {
				t.Fatalf("%s is still not allowed to %s leases in %s 10 s after the binding", subject, verb, ns)
			}
			time.Sleep(20 * time.Millisecond) // polling the authorizer: nothing to wait on
		}
	}
}

// ServiceAccountToken creates the service account ns/name if needed and
// returns a token for it from the TokenRequest API, valid for an hour.
func (k *Kube) ServiceAccountToken(t testing.TB, ns, name string) string {
	t.Helper()
	k.Admin(t, http.MethodPost, "/api/v1/namespaces/"+ns+"/serviceaccounts", map[string]any{
		"apiVersion": "v1", "kind": "ServiceAccount", "metadata": map[string]any{"name": name},
	}, http.StatusConflict)
	data := k.Admin(t, http.MethodPost, "/api/v1/namespaces/"+ns+"/serviceaccounts/"+name+"/token", map[string]any{
		"apiVersion": "authentication.k8s.io/v1", "kind": "TokenRequest",
		"spec": map[string]any{"expirationSeconds": 3600},
	})
	var tr struct {
		Status struct{ Token string } `json:"status"`
	}
	if err := json.Unmarshal(data, &tr); err != nil || tr.Status.Token == "" {
		t.Fatalf("token request for %s/%s: %v %s", ns, name, err, data)
	}
	return tr.Status.Token
}

// ClientCert issues a client certificate for user (the apiserver takes
// the common name as the user name, the organizations as groups), signed
// by the CA, and returns the paths of the certificate and its key.
func (k *Kube) ClientCert(t testing.TB, user string, groups ...string) (certFile, keyFile string) {
	t.Helper()
	c := newCert(t, k.ca, func(c *x509.Certificate) {
		c.Subject = pkix.Name{CommonName: user, Organization: groups}
		c.ExtKeyUsage = []x509.ExtKeyUsage{x509.ExtKeyUsageClientAuth}
	})
	dir := t.TempDir()
	name := "client-" + strconv.FormatInt(k.seq.Add(1), 10)
	return c.write(t, dir, name), filepath.Join(dir, name+"-key.pem")
}

// ClientCA is the CA that the apiserver trusts for client certificates
// (--client-ca-file, the same as CAFile): the paths of its PEM
// certificate and key, for a test that issues certificates of its own (an
// exec credential plugin that rotates them).
func (k *Kube) ClientCA() (certFile, keyFile string) {
	return k.CAFile, filepath.Join(filepath.Dir(k.CAFile), "ca-key.pem")
}

// Kubeconfig writes a kubeconfig whose one context, named user, reaches
// the apiserver as user with its token, in namespace (empty: none), and
// returns its path.
func (k *Kube) Kubeconfig(t testing.TB, user, namespace string) string {
	t.Helper()
	return k.kubeconfig(t, k.URL, user, k.Token(user), namespace)
}

// KubeconfigVia is Kubeconfig with the apiserver reached at server
// instead, such as a Proxy in front of it: https://127.0.0.1:PORT, which
// the serving certificate covers.
func (k *Kube) KubeconfigVia(t testing.TB, server, user, namespace string) string {
	t.Helper()
	return k.kubeconfig(t, server, user, k.Token(user), namespace)
}

// KubeconfigToken is Kubeconfig for any bearer token (a service
// account's, from ServiceAccountToken); the context is named name.
func (k *Kube) KubeconfigToken(t testing.TB, name, token, namespace string) string {
	t.Helper()
	return k.kubeconfig(t, k.URL, name, token, namespace)
}

func (k *Kube) kubeconfig(t testing.TB, server, user, token, namespace string) string {
	t.Helper()
	ns := ""
	if namespace != "" {
		ns = "\n    namespace: " + namespace
	}
	cfg := fmt.Sprintf(`apiVersion: v1
kind: Config
clusters:
- name: test
  cluster:
    server: %s
    certificate-authority: %s
users:
- name: %s
  user:
    token: %s
contexts:
- name: %s
  context:
    cluster: test
    user: %s%s
current-context: %s
`, server, k.CAFile, user, token, user, user, ns, user)
	path := filepath.Join(t.TempDir(), "kubeconfig")
	writeFile(t, path, []byte(cfg))
	return path
}

func writeFile(t scope, path string, data []byte) {
	t.Helper()
	if err := os.WriteFile(path, data, 0o600); err != nil {
		t.Fatalf("%v", err)
	}
}

func randomToken(t scope) string {
	t.Helper()
	b := make([]byte, 16)
	if _, err := rand.Read(b); err != nil {
		t.Fatalf("%v", err)
	}
	return hex.EncodeToString(b)
}

// procScope is the scope of servers shared by all the tests of a process:
// its temporary directories and clean-ups last until close.
type procScope struct {
	dir      string
	n        int
	cleanups []func()
}

func newProcScope() *procScope { return &procScope{} }

// scopeFailure is how Fatalf ends a start-up in a procScope; recover turns
// it back into a message.
type scopeFailure string

func (p *procScope) Helper() {}

func (p *procScope) TempDir() string {
	if p.dir == "" {
		dir, err := os.MkdirTemp("", "leaderrun-shared-")
		if err != nil {
			panic(scopeFailure(err.Error()))
		}
		p.dir = dir
	}
	p.n++
	dir := filepath.Join(p.dir, strconv.Itoa(p.n))
	if err := os.Mkdir(dir, 0o700); err != nil {
		panic(scopeFailure(err.Error()))
	}
	return dir
}

func (p *procScope) Fatalf(format string, args ...any) {
	panic(scopeFailure(fmt.Sprintf(format, args...)))
}

func (p *procScope) Cleanup(f func()) { p.cleanups = append(p.cleanups, f) }

// recover stores the message of a Fatalf during start-up in msg, after
// stopping whatever had started.
func (p *procScope) recover(msg *string) {
	r := recover()
	if r == nil {
		return
	}
	f, ok := r.(scopeFailure)
	if !ok {
		panic(r)
	}
	*msg = string(f)
	p.close()
}

// close runs the clean-ups, last first, and removes the directories.
func (p *procScope) close() {
	for i := len(p.cleanups) - 1; i >= 0; i-- {
		p.cleanups[i]()
	}
	p.cleanups = nil
	if p.dir != "" {
		_ = os.RemoveAll(p.dir)
		p.dir = ""
	}
}

var elector struct {
	once sync.Once
	path string
	err  error
}

// K8sElector returns the client-go LeaderElector program of
// internal/testenv/k8selector (a module of its own, so that its typed
// clients and leaderelection, and the kubernetes/scheme they register,
// stay out of leaderrun's packages): $LEADERRUN_K8SELECTOR_BIN if set (what
// scripts/test.sh builds before the tests), else built once per test
// process into the cache the install scripts use. A cold build downloads
// and compiles client-go: minutes; later ones come from Go's build cache.
func K8sElector(t testing.TB) string {
	t.Helper()
	if p := os.Getenv("LEADERRUN_K8SELECTOR_BIN"); p != "" {
		return p
	}
	elector.once.Do(func() {
		dir := filepath.Join(cacheDir(), "k8selector")
		if err := os.MkdirAll(dir, 0o755); err != nil {
			elector.err = err
			return
		}
		// Built beside and renamed into place: another test process may be
		// running the previous build.
		tmp := filepath.Join(dir, fmt.Sprintf("k8selector.%d", os.Getpid()))
		_, file, _, _ := runtime.Caller(0)
		cmd := exec.Command("go", "build", "-o", tmp, ".")
		cmd.Dir = filepath.Join(filepath.Dir(file), "k8selector")
		cmd.Env = append(os.Environ(), "GOWORK=off")
		if out, err := cmd.CombinedOutput(); err != nil {
			elector.err = fmt.Errorf("build the client-go elector: %w\n%s", err, out)
			return
		}
		elector.path = filepath.Join(dir, "k8selector")
		elector.err = os.Rename(tmp, elector.path)
	})
	if elector.err != nil {
		t.Fatal(elector.err)
	}
	return elector.path
}
