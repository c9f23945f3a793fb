package testenv

import (
	"context"
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/tls"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/pem"
	"fmt"
	"math/big"
	"net"
	"net/url"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"
)

// redisStartTimeout bounds the wait for a new redis-server or Sentinel to
// answer; one starts in milliseconds, with an append-only file to load
// in about as long.
const redisStartTimeout = 30 * time.Second

// RedisBinary finds redis-server: $LEADERRUN_REDIS_BIN (what
// scripts/install-redis.sh prints), then PATH, then Debian's
// /usr/bin/redis-server (not in every PATH). It skips the test if none is
// found, or fails it under CI=true. Sentinel is the same binary, run with
// --sentinel.
func RedisBinary(t testing.TB) string {
	t.Helper()
	return packaged(t, "LEADERRUN_REDIS_BIN", "redis-server", "/usr/bin/redis-server", "install-redis.sh")
}

// RedisOptions are the settings of a server started by StartRedis. The
// zero value of each field is noted.
type RedisOptions struct {
	// Password is the default user's password (requirepass). Zero: none.
	Password string
	// TLS makes the server also listen with TLS, on TLSAddr, with a
	// certificate for 127.0.0.1 signed by a CA the test makes (CAFile);
	// client certificates are optional, and verified when given
	// (ClientCertFile, ClientKeyFile hold one). Zero: plain TCP only.
	TLS bool
	// AOF turns the append-only file on with appendfsync always: every
	// write is on disk before the server answers it. Zero: no
	// persistence at all (no AOF, no snapshots).
	AOF bool
	// ReplicaOf makes the server a replica of that one. Zero: a primary.
	ReplicaOf *Redis
}

// Redis is a throwaway redis-server on 127.0.0.1 and a free port (and its
// unix socket), with its files in a temporary directory. It is stopped
// when the test ends. Redis runs as root without complaint, so the
// server runs as the test's user.
type Redis struct {
	opts    RedisOptions
	bin     string
	dir     string
	port    int
	tlsPort int

	caFile, clientCert, clientKey string

	srv *Server
}

// StartRedis starts a server and waits until it answers PING.
func StartRedis(t testing.TB, opts RedisOptions) *Redis {
	t.Helper()
	r := &Redis{opts: opts, bin: RedisBinary(t), dir: t.TempDir()}
	r.srv = &Server{Name: "redis-server", Dir: r.dir, Log: filepath.Join(r.dir, "redis.out"), StopGrace: 30 * time.Second,
		StartTimeout: redisStartTimeout, Ready: func() error { return pingRedis(r.Addr(), r.opts.Password) }}
	if opts.TLS {
		r.makeCertificates(t)
	}
	t.Cleanup(r.srv.Kill)
	var err error
	for try := 0; try < 3; try++ {
		r.port = FreePort(t, "127.0.0.1")
		if opts.TLS {
			r.tlsPort = FreePort(t, "127.0.0.1")
		}
		if err = r.start(); err == nil {
			return r
		}
	}
	t.Fatal(err)
	return nil
}

// args are the server's settings, on its command line.
func (r *Redis) args() []string {
	a := []string{"--port", strconv.Itoa(r.port), "--bind", "127.0.0.1", "--dir", r.dir,
		"--unixsocket", r.SocketPath(), "--unixsocketperm", "700",
		"--daemonize", "no", "--logfile", filepath.Join(r.dir, "redis.log"), "--loglevel", "notice",
		"--save", "", "--appendonly", "no"}
	if r.opts.AOF {
		a = append(a, "--appendonly", "yes", "--appendfsync", "always")
	}
	if r.opts.Password != "" {
		a = append(a, "--requirepass", r.opts.Password)
	}
	if p := r.opts.ReplicaOf; p != nil {
		a = append(a, "--replicaof", "127.0.0.1", strconv.Itoa(p.port))
		if p.opts.Password != "" {
			a = append(a, "--masterauth", p.opts.Password)
		}
	}
	if r.opts.TLS {
		a = append(a, "--tls-port", strconv.Itoa(r.tlsPort),
			"--tls-cert-file", filepath.Join(r.dir, "server.crt"), "--tls-key-file", filepath.Join(r.dir, "server.key"),
			"--tls-ca-cert-file", r.caFile, "--tls-auth-clients", "optional")
	}
	return a
}

// start runs the server in the foreground, as a child of the test, and
// waits until it answers.
func (r *Redis) start() error {
	r.srv.Argv = append([]string{r.bin}, r.args()...)
	if err := r.srv.Start(); err != nil {
		return fmt.Errorf("%w\n%s", err, r.Log())
	}
	return nil
}

// pingRedis asks the server at addr for PING (a primary that is still
// loading its append-only file answers LOADING).
func pingRedis(addr, password string) error {
	c := redis.NewClient(&redis.Options{Addr: addr, Password: password, Protocol: 2, MaxRetries: -1,
		DialTimeout: time.Second, ReadTimeout: time.Second, DisableIdentity: true})
	defer c.Close()
	ctx, cancel := context.WithTimeout(context.Background(), time.Second)
	defer cancel()
	return c.Ping(ctx).Err()
}

// Stop shuts the server down as an operator does (SIGTERM: it flushes its
// append-only file, closes every connection and exits), and waits until
// it is gone.
func (r *Redis) Stop(t testing.TB) { r.srv.Stop() }

// Kill kills the server with SIGKILL and waits until it is gone: nothing
// is flushed that was not on disk already.
func (r *Redis) Kill(t testing.TB) { r.srv.Kill() }

// Start starts a stopped server again, on the same port, with its files.
func (r *Redis) Start(t testing.TB) {
	t.Helper()
	if err := r.start(); err != nil {
		t.Fatal(err)
	}
}

// Restart is Stop, then Start.
func (r *Redis) Restart(t testing.TB) {
	t.Helper()
	r.Stop(t)
	r.Start(t)
}

// Pid is the server's process id, 0 if it is not running.
func (r *Redis) Pid() int { return r.srv.Pid() }

// Log is what the server logged so far.
func (r *Redis) Log() string {
	data, _ := os.ReadFile(filepath.Join(r.dir, "redis.log"))
	out, _ := os.ReadFile(filepath.Join(r.dir, "redis.out"))
	s := string(data) + string(out)
	if len(s) > 4000 {
		s = s[len(s)-4000:]
	}
	return s
}

// Port is the server's plain TCP port.
func (r *Redis) Port() int { return r.port }

// Addr is host:port of the server's plain TCP port.
func (r *Redis) Addr() string { return net.JoinHostPort("127.0.0.1", strconv.Itoa(r.port)) }

// TLSAddr is host:port of the server's TLS port (RedisOptions.TLS).
func (r *Redis) TLSAddr() string { return net.JoinHostPort("127.0.0.1", strconv.Itoa(r.tlsPort)) }

// SocketPath is the server's unix socket.
func (r *Redis) SocketPath() string { return filepath.Join(r.dir, "redis.sock") }

// Password is the server's password, "" for none.
func (r *Redis) Password() string { return r.opts.Password }

// URL is redis://[:password@]127.0.0.1:port, the server's plain address.
func (r *Redis) URL() string { return redisURL("redis", r.Addr(), r.opts.Password) }

// TLSURL is rediss://[:password@]127.0.0.1:tlsport.
func (r *Redis) TLSURL() string { return redisURL("rediss", r.TLSAddr(), r.opts.Password) }

func redisURL(scheme, addr, password string) string {
	u := url.URL{Scheme: scheme, Host: addr}
	if password != "" {
		u.User = url.UserPassword("", password)
	}
	return u.String()
}

// Client is a go-redis client of the server's, as an operator's
// redis-cli would be; it is closed when the test ends.
func (r *Redis) Client(t testing.TB) *redis.Client {
	t.Helper()
	c := redis.NewClient(&redis.Options{Addr: r.Addr(), Password: r.opts.Password, Protocol: 2, DisableIdentity: true,
		MaxRetries: 5, DialTimeout: 2 * time.Second, ReadTimeout: 5 * time.Second})
	t.Cleanup(func() { c.Close() })
	return c
}

// CAFile is the CA certificate that signed the server's (and the client
// certificate's), for --redis-cacert.
func (r *Redis) CAFile() string { return r.caFile }

// ClientCertFile and ClientKeyFile are a client certificate and its key,
// signed by CAFile's CA.
func (r *Redis) ClientCertFile() string { return r.clientCert }

// ClientKeyFile: see ClientCertFile.
func (r *Redis) ClientKeyFile() string { return r.clientKey }

// makeCertificates writes a CA, a server certificate it signed for
// 127.0.0.1 (and no name: verification holds for 127.0.0.1 and fails for
// localhost), and a client certificate.
func (r *Redis) makeCertificates(t testing.TB) {
	t.Helper()
	now := time.Now()
	caKey, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		t.Fatal(err)
	}
	ca := &x509.Certificate{SerialNumber: big.NewInt(1), Subject: pkix.Name{CommonName: "leaderrun test CA"},
		NotBefore: now.Add(-time.Hour), NotAfter: now.Add(24 * time.Hour), IsCA: true, BasicConstraintsValid: true,
		KeyUsage: x509.KeyUsageCertSign}
	caDER, err := x509.CreateCertificate(rand.Reader, ca, ca, &caKey.PublicKey, caKey)
	if err != nil {
		t.Fatal(err)
	}
	caCert, _ := x509.ParseCertificate(caDER)
	r.caFile = filepath.Join(r.dir, "ca.crt")
	writePEM(t, r.caFile, "CERTIFICATE", caDER)
	leaf := func(serial int64, name string, usage x509.ExtKeyUsage, ips []net.IP, crt, key string) {
		k, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
		if err != nil {
			t.Fatal(err)
		}
		tmpl := &x509.Certificate{SerialNumber: big.NewInt(serial), Subject: pkix.Name{CommonName: name},
			NotBefore: now.Add(-time.Hour), NotAfter: now.Add(24 * time.Hour), IPAddresses: ips,
			KeyUsage: x509.KeyUsageDigitalSignature, ExtKeyUsage: []x509.ExtKeyUsage{usage}}
		der, err := x509.CreateCertificate(rand.Reader, tmpl, caCert, &k.PublicKey, caKey)
		if err != nil {
			t.Fatal(err)
		}
		keyDER, err := x509.MarshalPKCS8PrivateKey(k)
		if err != nil {
			t.Fatal(err)
		}
		writePEM(t, crt, "CERTIFICATE", der)
		writePEM(t, key, "PRIVATE KEY", keyDER)
	}
	leaf(2, "127.0.0.1", x509.ExtKeyUsageServerAuth, []net.IP{net.IPv4(127, 0, 0, 1)},
		filepath.Join(r.dir, "server.crt"), filepath.Join(r.dir, "server.key"))
	r.clientCert, r.clientKey = filepath.Join(r.dir, "client.crt"), filepath.Join(r.dir, "client.key")
	leaf(3, "leaderrun test client", x509.ExtKeyUsageClientAuth, nil, r.clientCert, r.clientKey)
}

func writePEM(t testing.TB, path, typ string, der []byte) {
	t.Helper()
	if err := os.WriteFile(path, pem.EncodeToMemory(&pem.Block{Type: typ, Bytes: der}), 0o600); err != nil {
		t.Fatal(err)
	}
}

// TLSConfig is a client TLS configuration that trusts the server's CA.
func (r *Redis) TLSConfig(t testing.TB) *tls.Config {
	t.Helper()
	pem, err := os.ReadFile(r.caFile)
	if err != nil {
		t.Fatal(err)
	}
	pool := x509.NewCertPool()
	pool.AppendCertsFromPEM(pem)
	return &tls.Config{RootCAs: pool, MinVersion: tls.VersionTLS12}
}

// Sentinel is one Redis Sentinel on 127.0.0.1 and a free port, watching
// one primary under a master name. It is stopped when the test ends.
type Sentinel struct {
	port int
	dir  string
	srv  *Server
}

// RedisSentinelDownAfter is how long the test Sentinels wait before they
// call a silent primary down (down-after-milliseconds), and so the least a
// failover takes.
const RedisSentinelDownAfter = time.Second

// StartSentinel starts a Sentinel that monitors primary as master (quorum
// 1), and waits until it reports the primary and every replica that the
// primary reports connected.
func StartSentinel(t testing.TB, primary *Redis, master string) *Sentinel {
	t.Helper()
	bin := RedisBinary(t)
	s := &Sentinel{dir: t.TempDir()}
	var err error
	for try := 0; try < 3; try++ {
		s.port = FreePort(t, "127.0.0.1")
		conf := fmt.Sprintf("port %d\nbind 127.0.0.1\ndir %s\nlogfile %s\n"+
			"sentinel monitor %s 127.0.0.1 %d 1\nsentinel down-after-milliseconds %s %d\nsentinel failover-timeout %s 10000\n",
			s.port, s.dir, filepath.Join(s.dir, "sentinel.log"), master, primary.port, master,
			RedisSentinelDownAfter.Milliseconds(), master)
		if primary.opts.Password != "" {
			conf += fmt.Sprintf("sentinel auth-pass %s %s\n", master, primary.opts.Password)
		}
		path := filepath.Join(s.dir, "sentinel.conf")
		if err := os.WriteFile(path, []byte(conf), 0o600); err != nil {
			t.Fatal(err)
		}
		if err = s.start(bin, path); err == nil {
			break
		}
	}
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(s.stop)
	s.waitReplicas(t, master, primary)
	return s
}

func (s *Sentinel) start(bin, conf string) error {
	s.srv = &Server{Name: "redis sentinel", Argv: []string{bin, conf, "--sentinel"}, Dir: s.dir,
		Log: filepath.Join(s.dir, "sentinel.out"), StartTimeout: redisStartTimeout,
		Ready: func() error { return pingRedis(s.Addr(), "") }}
	if err := s.srv.Start(); err != nil {
		log, _ := os.ReadFile(filepath.Join(s.dir, "sentinel.log"))
		return fmt.Errorf("sentinel on port %d: %w\n%s", s.port, err, log)
	}
	return nil
}

func (s *Sentinel) stop() { s.srv.Stop() }

// waitReplicas waits until the Sentinel knows as many replicas of master
// as the primary reports connected (it learns them from the primary's
// INFO, every 10 s at first: a few seconds at most).
func (s *Sentinel) waitReplicas(t testing.TB, master string, primary *Redis) {
	t.Helper()
	c := redis.NewSentinelClient(&redis.Options{Addr: s.Addr(), Protocol: 2, DisableIdentity: true})
	defer c.Close()
	pc := primary.Client(t)
	deadline := time.Now().Add(redisStartTimeout)
	for {
		ctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
		info, err := pc.Info(ctx, "replication").Result()
		want := -1
		if err == nil {
			want = ConnectedReplicas(info)
		}
		replicas, err := c.Replicas(ctx, master).Result()
		cancel()
		if err == nil && want >= 0 && len(replicas) >= want {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("sentinel knows %d replicas of %s, the primary reports %d (last error: %v)", len(replicas), master, want, err)
		}
		time.Sleep(50 * time.Millisecond)
	}
}

// Addr is host:port of the Sentinel.
func (s *Sentinel) Addr() string { return net.JoinHostPort("127.0.0.1", strconv.Itoa(s.port)) }

// ConnectedReplicas is connected_slaves from INFO replication; -1 if the
// text has none.
func ConnectedReplicas(info string) int {
	for _, line := range strings.Split(info, "\n") {
		if v, ok := strings.CutPrefix(strings.TrimSpace(line), "connected_slaves:"); ok {
			n, err := strconv.Atoi(v)
			if err == nil {
				return n
			}
		}
	}
	return -1
}

// WaitReplicaSynced waits until replica reports its link to the primary
// up (master_link_status:up), that is, it has loaded the primary's data
// and follows its stream.
func WaitReplicaSynced(t testing.TB, replica *Redis) {
	t.Helper()
	c := replica.Client(t)
	deadline := time.Now().Add(redisStartTimeout)
	for {
		ctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
		info, err := c.Info(ctx, "replication").Result()
		cancel()
		if err == nil && strings.Contains(info, "master_link_status:up") {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("replica on port %d not in sync after %v: %v\n%s", replica.port, redisStartTimeout, err, info)
		}
		time.Sleep(20 * time.Millisecond)
	}
}
