package testenv

import (
	"context"
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/tls"
	"crypto/x509"
	"encoding/pem"
	"fmt"
	"io"
	"math/big"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"
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
	args      []string
	log       string
	http      *http.Client // for /health
	// shared: the member belongs to the process, not to a test (see
	// dieWithParent).
	shared bool

	mu   sync.Mutex
	cmd  *exec.Cmd
	done chan struct{} // closed when cmd has been reaped
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

// startEtcd starts a cluster that t stops when it ends; t is a test, or the
// process for a server that a package's tests share (see SharedKube).
func startEtcd(t scope, bin string, members int, tlsFiles *EtcdTLS) *Etcd {
	t.Helper()
	if members != 1 && members != 3 {
		t.Fatalf("StartEtcd: %d members; want 1 or 3", members)
	}
	var lastErr error
	for try := 0; try < 3; try++ {
		e := newEtcd(t, bin, members, try, tlsFiles)
		if lastErr = e.start(); lastErr == nil {
			t.Cleanup(e.stop)
			return e
		}
		e.stop()
	}
	t.Fatalf("start etcd: %v", lastErr)
	return nil
}

func newEtcd(t scope, bin string, members, try int, tlsFiles *EtcdTLS) *Etcd {
	e := &Etcd{TLS: tlsFiles}
	scheme, hc := "http", &http.Client{Timeout: time.Second}
	if tlsFiles != nil {
		scheme, hc = "https", tlsFiles.httpClient(t)
	}
	_, shared := t.(*procScope)
	var cluster []string
	for i := range members {
		m := &EtcdMember{
			shared:    shared,
			Name:      fmt.Sprintf("m%d", i+1),
			ClientURL: fmt.Sprintf("%s://127.0.0.1:%d", scheme, freePort(t, "127.0.0.1")),
			PeerURL:   fmt.Sprintf("http://127.0.0.1:%d", freePort(t, "127.0.0.1")),
			http:      hc,
		}
		cluster = append(cluster, m.Name+"="+m.PeerURL)
		e.Members = append(e.Members, m)
	}
	token := fmt.Sprintf("leaderrun-test-%d-%d-%d", os.Getpid(), time.Now().UnixNano(), try)
	for _, m := range e.Members {
		dir := t.TempDir()
		m.log = filepath.Join(dir, "etcd.log")
		m.args = []string{bin,
			"--name", m.Name,
			"--data-dir", filepath.Join(dir, "data"),
			"--listen-client-urls", m.ClientURL, "--advertise-client-urls", m.ClientURL,
			"--listen-peer-urls", m.PeerURL, "--initial-advertise-peer-urls", m.PeerURL,
			"--initial-cluster", strings.Join(cluster, ","),
			"--initial-cluster-state", "new", "--initial-cluster-token", token,
			"--heartbeat-interval", "100", "--election-timeout", "1000",
			"--log-level", "warn",
		}
		if tlsFiles != nil {
			m.args = append(m.args, "--cert-file", tlsFiles.serverCert, "--key-file", tlsFiles.serverKey,
				"--client-cert-auth", "--trusted-ca-file", tlsFiles.CACert)
		}
	}
	return e
}

func (e *Etcd) start() error {
	for _, m := range e.Members {
		if err := m.spawn(); err != nil {
			return err
		}
	}
	return e.waitHealthy(etcdStartTimeout)
}

func (e *Etcd) stop() {
	for _, m := range e.Members {
		m.terminate(syscall.SIGTERM, 10*time.Second)
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
		if err := m.waitHealthy(deadline); err != nil {
			return err
		}
	}
	return nil
}

// Stop stops the member with SIGTERM, as a service manager would, and
// waits until it is gone.
func (m *EtcdMember) Stop(t testing.TB) {
	t.Helper()
	m.terminate(syscall.SIGTERM, 10*time.Second)
}

// Kill stops the member with SIGKILL and waits until it is gone.
func (m *EtcdMember) Kill(t testing.TB) {
	t.Helper()
	m.terminate(syscall.SIGKILL, 10*time.Second)
}

// Start starts a stopped member again, with its data, and waits until it
// is healthy.
func (m *EtcdMember) Start(t testing.TB) {
	t.Helper()
	if err := m.spawn(); err != nil {
		t.Fatalf("%v", err)
	}
	if err := m.waitHealthy(time.Now().Add(etcdStartTimeout)); err != nil {
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
func (m *EtcdMember) Pid() int {
	m.mu.Lock()
	defer m.mu.Unlock()
	if m.cmd == nil {
		return 0
	}
	return m.cmd.Process.Pid
}

func (m *EtcdMember) spawn() error {
	m.mu.Lock()
	defer m.mu.Unlock()
	if m.cmd != nil {
		return fmt.Errorf("etcd member %s is already running", m.Name)
	}
	logf, err := os.OpenFile(m.log, os.O_WRONLY|os.O_CREATE|os.O_APPEND, 0o600)
	if err != nil {
		return err
	}
	defer logf.Close()
	cmd := exec.Command(m.args[0], m.args[1:]...)
	cmd.Stdout, cmd.Stderr = logf, logf
	if m.shared {
		cmd.SysProcAttr = dieWithParent()
	}
	if err := cmd.Start(); err != nil {
		return fmt.Errorf("start etcd member %s: %w", m.Name, err)
	}
	done := make(chan struct{})
	go func() {
		defer close(done)
		_ = cmd.Wait()
	}()
	m.cmd, m.done = cmd, done
	return nil
}

// terminate signals the member, waits up to grace for it to exit, then
// kills it.
func (m *EtcdMember) terminate(sig syscall.Signal, grace time.Duration) {
	m.mu.Lock()
	cmd, done := m.cmd, m.done
	m.cmd, m.done = nil, nil
	m.mu.Unlock()
	if cmd == nil {
		return
	}
	_ = cmd.Process.Signal(sig)
	select {
	case <-done:
		return
	case <-time.After(grace):
	}
	_ = cmd.Process.Kill()
	<-done
}

// waitHealthy polls the member's /health until it answers true. A server
// in another process offers nothing else to wait on.
func (m *EtcdMember) waitHealthy(deadline time.Time) error {
	m.mu.Lock()
	done := m.done
	m.mu.Unlock()
	for {
		if done == nil {
			return fmt.Errorf("etcd member %s is not running", m.Name)
		}
		select {
		case <-done:
			return fmt.Errorf("etcd member %s exited before it was healthy:\n%s", m.Name, m.tail())
		default:
		}
		ctx, cancel := context.WithDeadline(context.Background(), deadline)
		req, _ := http.NewRequestWithContext(ctx, http.MethodGet, m.ClientURL+"/health", nil)
		resp, err := m.http.Do(req)
		if err == nil {
			body, _ := io.ReadAll(resp.Body)
			resp.Body.Close()
			if strings.Contains(string(body), `"health":"true"`) {
				cancel()
				return nil
			}
		}
		cancel()
		if time.Now().After(deadline) {
			return fmt.Errorf("etcd member %s not healthy in time (last: %v):\n%s", m.Name, err, m.tail())
		}
		time.Sleep(20 * time.Millisecond)
	}
}

// tail is the end of the member's log, for failure messages.
func (m *EtcdMember) tail() string {
	data, _ := os.ReadFile(m.log)
	if len(data) > 4000 {
		data = data[len(data)-4000:]
	}
	return string(data)
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
