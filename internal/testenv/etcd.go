package testenv

import (
	"context"
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/tls"
	"crypto/x509"
	"encoding/pem"
	"errors"
	"fmt"
	"io"
	"math/big"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"go.etcd.io/etcd/api/v3/v3rpc/rpctypes"
	"go.etcd.io/etcd/client/pkg/v3/transport"
	clientv3 "go.etcd.io/etcd/client/v3"
	"go.uber.org/zap"
)

// EtcdBinary finds etcd: $LEADERRUN_ETCD_BIN, the cache that
// scripts/install-etcd.sh fills, or PATH.
func EtcdBinary(t testing.TB) string {
	t.Helper()
	return Binary(t, "LEADERRUN_ETCD_BIN", "etcd-v3.6.16/bin/etcd", "etcd")
}

// EtcdctlBinary finds etcdctl the same way ($LEADERRUN_ETCDCTL_BIN).
func EtcdctlBinary(t testing.TB) string {
	t.Helper()
	return Binary(t, "LEADERRUN_ETCDCTL_BIN", "etcd-v3.6.16/bin/etcdctl", "etcdctl")
}

// Etcdctl runs etcdctl against endpoints and returns its combined output.
func Etcdctl(t testing.TB, endpoints []string, args ...string) (string, error) {
	t.Helper()
	cmd := exec.Command(EtcdctlBinary(t), append([]string{"--endpoints", strings.Join(endpoints, ",")}, args...)...)
	out, err := cmd.CombinedOutput()
	return string(out), err
}

// Etcd is a real etcd cluster of one or three members on 127.0.0.1, with
// data in the test's temporary directory. It is stopped when the test ends.
type Etcd struct {
	Members []*EtcdMember
	// TLS is set for a cluster started by StartEtcdTLS.
	TLS *EtcdTLS

	bin     string
	token   string // the cluster's initial token
	sockets bool
}

// EtcdTLS are the PEM files of a TLS cluster: the CA that signed the
// server's and the client's certificates, and the client's certificate and
// key. The server requires a client certificate.
type EtcdTLS struct {
	CACert, Cert, Key string

	serverCert, serverKey string
}

// EtcdMember is one etcd process. Stop, Start and Restart keep its name,
// ports and data, as an operator's restart would.
type EtcdMember struct {
	Name      string
	ClientURL string
	PeerURL   string
	// SocketURL is the member's unix socket (unix:///path, or
	// unixs:///path with TLS) when the cluster was started with
	// EtcdOptions.Sockets; "" otherwise.
	SocketURL string
	// Learner is set for a member added by AddLearner.
	Learner bool
	// removed is set once Remove took the member out of the cluster.
	removed bool

	dir  string       // data, log and socket
	http *http.Client // for /health
	srv  *Server
}

// etcdStartTimeout bounds the wait for a new cluster to be healthy.
const etcdStartTimeout = 30 * time.Second

// StartEtcd starts a cluster of members (1 or 3) and waits until every
// member reports itself healthy. Ports are chosen free just before etcd
// binds them; if another process takes one in between, the cluster is
// started again on other ports.
func StartEtcd(t testing.TB, members int) *Etcd {
	t.Helper()
	return startEtcd(t, EtcdBinary(t), members, nil)
}

// StartEtcdTLS starts one member that serves clients over TLS only
// (https:// client URL) and requires a client certificate signed by a CA
// made for the test; Etcd.TLS names the files a client needs.
func StartEtcdTLS(t testing.TB) *Etcd {
	t.Helper()
	return startEtcd(t, EtcdBinary(t), 1, newEtcdTLS(t))
}

// EtcdOptions shape a cluster started by StartEtcdWith.
type EtcdOptions struct {
	// Members is the number of voting members, 1 or 3.
	Members int
	// TLS: clients are served over TLS only, as by StartEtcdTLS.
	TLS bool
	// Sockets: every member also serves clients on a unix socket named
	// etcd.sock (EtcdMember.SocketURL), over TLS with TLS; the server's
	// certificate names etcd.sock, as etcd's client checks it.
	Sockets bool
}

// StartEtcdWith starts a cluster shaped by o and waits until every member
// reports itself healthy.
func StartEtcdWith(t testing.TB, o EtcdOptions) *Etcd {
	t.Helper()
	var tlsFiles *EtcdTLS
	if o.TLS {
		tlsFiles = newEtcdTLS(t)
	}
	return startEtcdWith(t, EtcdBinary(t), o, tlsFiles)
}

// startEtcd starts a cluster that t stops when it ends; t is a test, or the
// process for a server that a package's tests share (see SharedKube).
func startEtcd(t scope, bin string, members int, tlsFiles *EtcdTLS) *Etcd {
	t.Helper()
	return startEtcdWith(t, bin, EtcdOptions{Members: members, TLS: tlsFiles != nil}, tlsFiles)
}

func startEtcdWith(t scope, bin string, o EtcdOptions, tlsFiles *EtcdTLS) *Etcd {
	t.Helper()
	if o.Members != 1 && o.Members != 3 {
		t.Fatalf("StartEtcd: %d members; want 1 or 3", o.Members)
	}
	var lastErr error
	for try := 0; try < 3; try++ {
		e := newEtcd(t, bin, o, try, tlsFiles)
		if lastErr = e.start(); lastErr == nil {
			t.Cleanup(e.stop)
			return e
		}
		e.stop()
	}
	t.Fatalf("start etcd: %v", lastErr)
	return nil
}

func newEtcd(t scope, bin string, o EtcdOptions, try int, tlsFiles *EtcdTLS) *Etcd {
	e := &Etcd{TLS: tlsFiles, bin: bin, sockets: o.Sockets, token: fmt.Sprintf("leaderrun-test-%d-%d-%d", os.Getpid(), time.Now().UnixNano(), try)}
	var cluster []string
	for i := range o.Members {
		m := e.newMember(t, fmt.Sprintf("m%d", i+1))
		cluster = append(cluster, m.Name+"="+m.PeerURL)
		e.Members = append(e.Members, m)
	}
	for _, m := range e.Members {
		m.setArgs(e, cluster, "new")
	}
	return e
}

// newMember names a member and chooses its ports, and its socket's path.
func (e *Etcd) newMember(t scope, name string) *EtcdMember {
	scheme, hc := "http", &http.Client{Timeout: time.Second}
	if e.TLS != nil {
		scheme, hc = "https", e.TLS.httpClient(t)
	}
	m := &EtcdMember{
		Name:      name,
		ClientURL: fmt.Sprintf("%s://127.0.0.1:%d", scheme, freePort(t, "127.0.0.1")),
		PeerURL:   fmt.Sprintf("http://127.0.0.1:%d", freePort(t, "127.0.0.1")),
		http:      hc,
		dir:       t.TempDir(),
	}
	if e.sockets {
		m.SocketURL = "unix://" + filepath.Join(m.dir, "etcd.sock")
		if e.TLS != nil {
			m.SocketURL = "unixs://" + filepath.Join(m.dir, "etcd.sock")
		}
	}
	m.srv = &Server{Name: "etcd member " + name, Log: filepath.Join(m.dir, "etcd.log"), Ready: m.healthy}
	return m
}

// setArgs sets the member's command line, for a cluster of the members
// named in cluster (name=peerURL) in state "new" or "existing".
func (m *EtcdMember) setArgs(e *Etcd, cluster []string, state string) {
	listen := m.ClientURL
	if m.SocketURL != "" {
		listen += "," + m.SocketURL
	}
	m.srv.Argv = []string{e.bin,
		"--name", m.Name,
		"--data-dir", filepath.Join(m.dir, "data"),
		"--listen-client-urls", listen, "--advertise-client-urls", m.ClientURL,
		"--listen-peer-urls", m.PeerURL, "--initial-advertise-peer-urls", m.PeerURL,
		"--initial-cluster", strings.Join(cluster, ","),
		"--initial-cluster-state", state, "--initial-cluster-token", e.token,
		"--heartbeat-interval", "100", "--election-timeout", "1000",
		"--log-level", "warn",
	}
	if e.TLS != nil {
		m.srv.Argv = append(m.srv.Argv, "--cert-file", e.TLS.serverCert, "--key-file", e.TLS.serverKey,
			"--client-cert-auth", "--trusted-ca-file", e.TLS.CACert)
	}
}

func (e *Etcd) start() error {
	for _, m := range e.Members {
		if err := m.srv.Spawn(); err != nil {
			return err
		}
	}
	return e.waitHealthy(etcdStartTimeout)
}

func (e *Etcd) stop() {
	for _, m := range e.Members {
		m.srv.Stop()
	}
}

// Endpoints are the members' client URLs.
func (e *Etcd) Endpoints() []string {
	eps := make([]string, len(e.Members))
	for i, m := range e.Members {
		eps[i] = m.ClientURL
	}
	return eps
}

// WaitHealthy waits until every running member reports itself healthy
// (connected to a quorum with a leader).
func (e *Etcd) WaitHealthy(t testing.TB) {
	t.Helper()
	if err := e.waitHealthy(etcdStartTimeout); err != nil {
		t.Fatalf("%v", err)
	}
}

func (e *Etcd) waitHealthy(timeout time.Duration) error {
	deadline := time.Now().Add(timeout)
	for _, m := range e.Members {
		if m.removed {
			continue
		}
		if err := m.srv.WaitReady(deadline); err != nil {
			return err
		}
	}
	return nil
}

// client is an etcd client, for membership changes, of the running
// voters other than except (nil for all of them).
func (e *Etcd) client(t testing.TB, except *EtcdMember) *clientv3.Client {
	t.Helper()
	var eps []string
	for _, m := range e.Members {
		if !m.Learner && m.Pid() != 0 && m != except {
			eps = append(eps, m.ClientURL)
		}
	}
	cfg := clientv3.Config{Endpoints: eps, DialTimeout: 5 * time.Second, Logger: zap.NewNop()}
	if e.TLS != nil {
		tlsCfg, err := (transport.TLSInfo{TrustedCAFile: e.TLS.CACert, CertFile: e.TLS.Cert, KeyFile: e.TLS.Key}).ClientConfig()
		if err != nil {
			t.Fatal(err)
		}
		cfg.TLS = tlsCfg
	}
	cli, err := clientv3.New(cfg)
	if err != nil {
		t.Fatal(err)
	}
	return cli
}

// AddLearner adds a member to the cluster as a learner (as `etcdctl member
// add --learner` does), starts it and waits until it is healthy. It is
// appended to Members with Learner set.
func (e *Etcd) AddLearner(t testing.TB) *EtcdMember {
	t.Helper()
	cli := e.client(t, nil)
	defer cli.Close()
	m := e.newMember(t, fmt.Sprintf("m%d", len(e.Members)+1))
	m.Learner = true
	ctx, cancel := context.WithTimeout(context.Background(), etcdStartTimeout)
	defer cancel()
	// etcd refuses a new member until every member has been connected
	// for a while (its strict reconfiguration check): ask again until
	// then.
	for {
		_, err := cli.MemberAddAsLearner(ctx, []string{m.PeerURL})
		if err == nil {
			break
		}
		if !errors.Is(err, rpctypes.ErrUnhealthy) || ctx.Err() != nil {
			t.Fatalf("add learner %s: %v", m.Name, err)
		}
		time.Sleep(100 * time.Millisecond)
	}
	cluster := []string{m.Name + "=" + m.PeerURL}
	for _, o := range e.Members {
		cluster = append(cluster, o.Name+"="+o.PeerURL)
	}
	m.setArgs(e, cluster, "existing")
	e.Members = append(e.Members, m)
	m.Start(t)
	return m
}

// Remove removes the member from the cluster (as `etcdctl member remove`
// does) and waits until its process, which stops when it learns of its
// removal, is gone.
func (e *Etcd) Remove(t testing.TB, m *EtcdMember) {
	t.Helper()
	// Asked of m itself, the removal can fail with "server stopped" once m
	// has applied it and shut down before answering.
	cli := e.client(t, m)
	defer cli.Close()
	ctx, cancel := context.WithTimeout(context.Background(), etcdStartTimeout)
	defer cancel()
	id := e.memberID(ctx, t, cli, m)
	if _, err := cli.MemberRemove(ctx, id); err != nil {
		t.Fatalf("remove member %s: %v", m.Name, err)
	}
	m.removed = true
	select {
	case <-m.srv.Done():
	case <-time.After(etcdStartTimeout):
		t.Fatalf("removed member %s still running after %v", m.Name, etcdStartTimeout)
	}
	m.srv.Kill()
}

func (e *Etcd) memberID(ctx context.Context, t testing.TB, cli *clientv3.Client, m *EtcdMember) uint64 {
	t.Helper()
	resp, err := cli.MemberList(ctx)
	if err != nil {
		t.Fatalf("member list: %v", err)
	}
	for _, mm := range resp.Members {
		if mm.Name == m.Name {
			return mm.ID
		}
	}
	t.Fatalf("member %s is not in the member list", m.Name)
	return 0
}

// RaftLeader is the member that leads the cluster's raft group now.
func (e *Etcd) RaftLeader(t testing.TB) *EtcdMember {
	t.Helper()
	cli := e.client(t, nil)
	defer cli.Close()
	ctx, cancel := context.WithTimeout(context.Background(), etcdStartTimeout)
	defer cancel()
	for _, m := range e.Members {
		if m.Pid() == 0 || m.Learner {
			continue
		}
		st, err := cli.Status(ctx, m.ClientURL)
		if err != nil {
			t.Fatalf("status of %s: %v", m.Name, err)
		}
		if st.Leader != 0 && st.Leader == st.Header.MemberId {
			return m
		}
	}
	t.Fatalf("no member leads")
	return nil
}

// Stop stops the member with SIGTERM, as a service manager would, and
// waits until it is gone.
func (m *EtcdMember) Stop(t testing.TB) {
	t.Helper()
	m.srv.Stop()
}

// Kill stops the member with SIGKILL and waits until it is gone.
func (m *EtcdMember) Kill(t testing.TB) {
	t.Helper()
	m.srv.Kill()
}

// Start starts a stopped member again, with its data, and waits until it
// is healthy.
func (m *EtcdMember) Start(t testing.TB) {
	t.Helper()
	m.srv.StartTimeout = etcdStartTimeout
	if err := m.srv.Start(); err != nil {
		t.Fatalf("%v", err)
	}
}

// Restart is Stop then Start.
func (m *EtcdMember) Restart(t testing.TB) {
	t.Helper()
	m.Stop(t)
	m.Start(t)
}

// Pid is the member's process id, 0 if it is not running.
func (m *EtcdMember) Pid() int { return m.srv.Pid() }

// healthy asks the member's /health whether it is connected to a quorum
// with a leader.
func (m *EtcdMember) healthy() error {
	ctx, cancel := context.WithTimeout(context.Background(), time.Second)
	defer cancel()
	req, _ := http.NewRequestWithContext(ctx, http.MethodGet, m.ClientURL+"/health", nil)
	resp, err := m.http.Do(req)
	if err != nil {
		return err
	}
	body, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	if !strings.Contains(string(body), `"health":"true"`) {
		return fmt.Errorf("/health: %s", strings.TrimSpace(string(body)))
	}
	return nil
}

// newEtcdTLS writes a CA, a server certificate for 127.0.0.1 and a client
// certificate, both signed by the CA, into a temporary directory.
func newEtcdTLS(t scope) *EtcdTLS {
	t.Helper()
	dir := t.TempDir()
	ca := newCert(t, nil, func(c *x509.Certificate) {
		c.Subject.CommonName = "leaderrun test CA"
		c.IsCA, c.BasicConstraintsValid = true, true
		c.KeyUsage = x509.KeyUsageCertSign | x509.KeyUsageDigitalSignature
	})
	server := newCert(t, ca, func(c *x509.Certificate) {
		c.Subject.CommonName = "etcd"
		c.ExtKeyUsage = []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth}
		c.IPAddresses = []net.IP{net.IPv4(127, 0, 0, 1)}
		// etcd's client checks a unixs:// socket's certificate for
		// the socket's file name.
		c.DNSNames = []string{"etcd.sock"}
	})
	client := newCert(t, ca, func(c *x509.Certificate) {
		c.Subject.CommonName = "leaderrun"
		c.ExtKeyUsage = []x509.ExtKeyUsage{x509.ExtKeyUsageClientAuth}
	})
	return &EtcdTLS{
		CACert:     ca.write(t, dir, "ca"),
		Cert:       client.write(t, dir, "client"),
		Key:        filepath.Join(dir, "client-key.pem"),
		serverCert: server.write(t, dir, "server"),
		serverKey:  filepath.Join(dir, "server-key.pem"),
	}
}

// httpClient trusts the test CA and presents the client certificate.
func (f *EtcdTLS) httpClient(t scope) *http.Client {
	t.Helper()
	cert, err := tls.LoadX509KeyPair(f.Cert, f.Key)
	if err != nil {
		t.Fatalf("%v", err)
	}
	caPEM, err := os.ReadFile(f.CACert)
	if err != nil {
		t.Fatalf("%v", err)
	}
	pool := x509.NewCertPool()
	pool.AppendCertsFromPEM(caPEM)
	return &http.Client{Timeout: time.Second, Transport: &http.Transport{
		TLSClientConfig: &tls.Config{RootCAs: pool, Certificates: []tls.Certificate{cert}},
	}}
}

// testCert is a certificate and its key.
type testCert struct {
	cert *x509.Certificate
	der  []byte
	key  *ecdsa.PrivateKey
}

// newCert makes a certificate valid for a day, signed by parent, or
// self-signed if parent is nil.
func newCert(t scope, parent *testCert, edit func(*x509.Certificate)) *testCert {
	t.Helper()
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		t.Fatalf("%v", err)
	}
	serial, err := rand.Int(rand.Reader, big.NewInt(1<<62))
	if err != nil {
		t.Fatalf("%v", err)
	}
	tmpl := &x509.Certificate{
		SerialNumber: serial,
		NotBefore:    time.Now().Add(-time.Hour),
		NotAfter:     time.Now().Add(24 * time.Hour),
		KeyUsage:     x509.KeyUsageDigitalSignature,
	}
	edit(tmpl)
	signer, signerKey := tmpl, key
	if parent != nil {
		signer, signerKey = parent.cert, parent.key
	}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, signer, &key.PublicKey, signerKey)
	if err != nil {
		t.Fatalf("%v", err)
	}
	cert, err := x509.ParseCertificate(der)
	if err != nil {
		t.Fatalf("%v", err)
	}
	return &testCert{cert: cert, der: der, key: key}
}

// write stores the certificate as dir/name.pem and its key as
// dir/name-key.pem, and returns the certificate's path.
func (c *testCert) write(t scope, dir, name string) string {
	t.Helper()
	keyDER, err := x509.MarshalPKCS8PrivateKey(c.key)
	if err != nil {
		t.Fatalf("%v", err)
	}
	certPath := filepath.Join(dir, name+".pem")
	for path, block := range map[string]*pem.Block{
		certPath:                            {Type: "CERTIFICATE", Bytes: c.der},
		filepath.Join(dir, name+"-key.pem"): {Type: "PRIVATE KEY", Bytes: keyDER},
	} {
		if err := os.WriteFile(path, pem.EncodeToMemory(block), 0o600); err != nil {
			t.Fatalf("%v", err)
		}
	}
	return certPath
}
