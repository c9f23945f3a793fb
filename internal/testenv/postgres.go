package testenv

import (
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/rsa"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/hex"
	"encoding/pem"
	"errors"
	"fmt"
	"math/big"
	"net"
	"net/url"
	"os"
	"os/exec"
	"os/user"
	"path/filepath"
	"sort"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgproto3"
)

// PostgresBinDir finds the directory holding initdb, postgres and psql:
// $LEADERRUN_POSTGRES_BIN, else Debian's /usr/lib/postgresql/N/bin (newest
// N), else the directory of the initdb in PATH. scripts/install-postgres.sh
// installs them. It skips the test if none is found, or fails it under
// CI=true.
func PostgresBinDir(t testing.TB) string {
	t.Helper()
	var dirs []string
	if d := os.Getenv("LEADERRUN_POSTGRES_BIN"); d != "" {
		dirs = []string{d} // as told, or nothing
	} else {
		debian, _ := filepath.Glob("/usr/lib/postgresql/*/bin")
		sort.Slice(debian, func(i, j int) bool { return pgMajor(debian[i]) > pgMajor(debian[j]) })
		dirs = debian
		if p, err := exec.LookPath("initdb"); err == nil {
			if p, err = filepath.EvalSymlinks(p); err == nil {
				dirs = append(dirs, filepath.Dir(p))
			}
		}
	}
	for _, d := range dirs {
		if isExecutable(filepath.Join(d, "initdb")) && isExecutable(filepath.Join(d, "postgres")) &&
			isExecutable(filepath.Join(d, "psql")) {
			return d
		}
	}
	Missing(t, "PostgreSQL (initdb, postgres, psql) not found: set LEADERRUN_POSTGRES_BIN or run scripts/install-postgres.sh")
	return ""
}

// pgMajor is N in /usr/lib/postgresql/N/bin, 0 if it is not a number.
func pgMajor(dir string) int {
	n, _ := strconv.Atoi(filepath.Base(filepath.Dir(dir)))
	return n
}

// PgBouncerBinary finds pgbouncer: $LEADERRUN_PGBOUNCER_BIN, PATH, or
// Debian's /usr/sbin/pgbouncer (not in a non-root PATH). It skips the test
// if none is found, or fails it under CI=true.
func PgBouncerBinary(t testing.TB) string {
	t.Helper()
	return packaged(t, "LEADERRUN_PGBOUNCER_BIN", "pgbouncer", "/usr/sbin/pgbouncer", "install-postgres.sh")
}

// PostgresSuperuser is the name of the superuser of a cluster started by
// StartPostgres.
const PostgresSuperuser = "postgres"

// Postgres is a throwaway PostgreSQL cluster on 127.0.0.1 and a free port,
// with its data in a temporary directory. Every role, the superuser
// included, logs in with a password (scram-sha-256; md5 and cleartext for
// LegacyAuthRoles), over TCP with or without TLS (CAFile), or its unix
// socket. It is stopped and its directory removed when the test ends.
//
// PostgreSQL refuses to run as root: when the tests run as root the
// cluster runs as the "postgres" user that Debian's package creates (or a
// "leaderrun-pg" user made for the purpose), in a directory under
// os.TempDir that it owns, since a test's own temp dirs are root's, 0700.
//
// initdb costs about 2 s on a busy 2-core machine: start one cluster per
// test package and give each test its own lock names and tables.
type Postgres struct {
	// Password is the superuser's password, random for each cluster.
	Password string

	t    testing.TB
	bin  string
	dir  string // owned by the server's user
	data string
	log  string
	port int
	cred *syscall.Credential // nil unless the tests run as root

	maxConns int
	caFile   string // the CA that signed the server's certificate
	ca       *x509.Certificate
	caKey    *ecdsa.PrivateKey

	srv *Server
}

// PostgresOptions are the settings of a cluster started by
// StartPostgresWith. The zero value of each field is noted.
type PostgresOptions struct {
	// MaxConnections is the server's max_connections, for a test that
	// runs hundreds of clients at once (each leaderrun holds up to three
	// connections). Zero value: 200.
	MaxConnections int
}

// StartPostgres creates a cluster with initdb, starts it and waits until it
// accepts connections.
func StartPostgres(t testing.TB) *Postgres {
	t.Helper()
	return StartPostgresWith(t, PostgresOptions{})
}

// StartPostgresWith is StartPostgres with opts.
func StartPostgresWith(t testing.TB, opts PostgresOptions) *Postgres {
	t.Helper()
	bin := PostgresBinDir(t)
	p := &Postgres{t: t, bin: bin, Password: randomHex(12), maxConns: opts.MaxConnections}
	if p.maxConns <= 0 {
		p.maxConns = 200
	}
	p.dir, p.cred = serverDir(t, "leaderrun-pg-")
	p.data = filepath.Join(p.dir, "data")
	p.log = filepath.Join(p.dir, "postgres.log")
	p.srv = p.server()
	t.Cleanup(func() {
		p.srv.Terminate(syscall.SIGQUIT, 10*time.Second) // immediate shutdown: the data is thrown away
		os.RemoveAll(p.dir)
	})
	pwfile := filepath.Join(p.dir, "pwfile")
	p.writeFile(pwfile, p.Password+"\n")
	initdb := p.command(filepath.Join(bin, "initdb"), "-D", p.data, "-U", PostgresSuperuser, "--pwfile", pwfile,
		"--auth", "scram-sha-256", "--encoding", "UTF8", "--locale", "C", "--no-sync")
	if out, err := initdb.CombinedOutput(); err != nil {
		t.Fatalf("initdb: %v\n%s", err, out)
	}
	os.Remove(pwfile)
	p.setUpTLS()
	p.setUpLegacyAuth()
	var err error
	for try := 0; try < 3; try++ {
		p.port = FreePort(t, "127.0.0.1")
		if err = p.startServer(); err == nil {
			break
		}
	}
	if err != nil {
		t.Fatal(err)
	}
	// PostgreSQL 15 no longer lets every role create in schema public;
	// older servers do. Make them alike, so that a role made by
	// CreateRole cannot create tables on any version.
	p.Psql(t, "REVOKE CREATE ON SCHEMA public FROM PUBLIC")
	return p
}

// setUpTLS writes a CA and a certificate it signed for 127.0.0.1 (and no
// name), so that the server accepts TLS as well as plaintext: sslmode
// verify-full holds for host 127.0.0.1 and fails for localhost.
func (p *Postgres) setUpTLS() {
	p.t.Helper()
	caKey, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		p.t.Fatal(err)
	}
	now := time.Now()
	ca := &x509.Certificate{SerialNumber: big.NewInt(1), Subject: pkix.Name{CommonName: "leaderrun test CA"},
		NotBefore: now.Add(-time.Hour), NotAfter: now.Add(24 * time.Hour), IsCA: true, BasicConstraintsValid: true,
		KeyUsage: x509.KeyUsageCertSign}
	caDER, err := x509.CreateCertificate(rand.Reader, ca, ca, &caKey.PublicKey, caKey)
	if err != nil {
		p.t.Fatal(err)
	}
	caCert, _ := x509.ParseCertificate(caDER)
	p.ca, p.caKey = caCert, caKey
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		p.t.Fatal(err)
	}
	leaf := &x509.Certificate{SerialNumber: big.NewInt(2), Subject: pkix.Name{CommonName: "127.0.0.1"},
		NotBefore: now.Add(-time.Hour), NotAfter: now.Add(24 * time.Hour), IPAddresses: []net.IP{net.IPv4(127, 0, 0, 1)},
		KeyUsage: x509.KeyUsageDigitalSignature, ExtKeyUsage: []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth}}
	leafDER, err := x509.CreateCertificate(rand.Reader, leaf, caCert, &key.PublicKey, caKey)
	if err != nil {
		p.t.Fatal(err)
	}
	keyDER, err := x509.MarshalPKCS8PrivateKey(key)
	if err != nil {
		p.t.Fatal(err)
	}
	p.writeFile(filepath.Join(p.dir, "server.crt"), string(pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: leafDER})))
	p.writeFile(filepath.Join(p.dir, "server.key"), string(pem.EncodeToMemory(&pem.Block{Type: "PRIVATE KEY", Bytes: keyDER})))
	p.caFile = filepath.Join(p.dir, "ca.crt")
	if err := os.WriteFile(p.caFile, pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: caDER}), 0o644); err != nil {
		p.t.Fatal(err)
	}
}

// CAFile is the CA certificate that signed the server's, for sslrootcert.
func (p *Postgres) CAFile() string { return p.caFile }

// Roles that log in with the older methods: LegacyAuthRoles["md5"] with
// md5, ["password"] with a cleartext password; CreateRole makes them.
var LegacyAuthRoles = map[string]string{"md5": "md5_login", "password": "cleartext_login"}

// CertAuthRole logs in with a client certificate (ClientCert), over TLS
// only; CreateRole makes it.
const CertAuthRole = "cert_login"

// setUpLegacyAuth puts lines for LegacyAuthRoles and CertAuthRole first
// in pg_hba.conf, ahead of initdb's scram-sha-256 for all.
func (p *Postgres) setUpLegacyAuth() {
	p.t.Helper()
	hba := filepath.Join(p.data, "pg_hba.conf")
	old, err := os.ReadFile(hba)
	if err != nil {
		p.t.Fatal(err)
	}
	lines := "hostssl all " + CertAuthRole + " 127.0.0.1/32 cert\n"
	for method, role := range LegacyAuthRoles {
		lines += "host all " + role + " 127.0.0.1/32 " + method + "\n"
	}
	p.writeFile(hba, lines+string(old))
}

// serverDir makes a directory for a server process that must not run as
// root, owned by the user it will run as, removed when the test ends by
// the caller. Not as root: a temp dir of the test, and no credential.
func serverDir(t testing.TB, pattern string) (string, *syscall.Credential) {
	t.Helper()
	if os.Geteuid() != 0 {
		return t.TempDir(), nil
	}
	uid, gid := serverUser(t)
	dir, err := os.MkdirTemp("", pattern)
	if err != nil {
		t.Fatal(err)
	}
	if err := os.Chown(dir, uid, gid); err != nil {
		os.RemoveAll(dir)
		t.Fatal(err)
	}
	return dir, &syscall.Credential{Uid: uint32(uid), Gid: uint32(gid), NoSetGroups: true}
}

var serverAccount struct {
	once     sync.Once
	uid, gid int
	err      error
}

// serverUser is the unprivileged account that servers refusing root run
// as: "postgres" if it exists, else "leaderrun-pg", created on first use.
func serverUser(t testing.TB) (uid, gid int) {
	t.Helper()
	a := &serverAccount
	a.once.Do(func() {
		u, err := user.Lookup("postgres")
		if err != nil {
			u, err = user.Lookup("leaderrun-pg")
		}
		if err != nil {
			out, aerr := exec.Command("useradd", "--system", "--no-create-home", "--home-dir", "/nonexistent",
				"--shell", "/usr/sbin/nologin", "leaderrun-pg").CombinedOutput()
			if aerr != nil {
				a.err = fmt.Errorf("no postgres user, and useradd leaderrun-pg failed: %v: %s", aerr, out)
				return
			}
			if u, err = user.Lookup("leaderrun-pg"); err != nil {
				a.err = err
				return
			}
		}
		a.uid, _ = strconv.Atoi(u.Uid)
		a.gid, _ = strconv.Atoi(u.Gid)
	})
	if a.err != nil {
		t.Fatal(a.err)
	}
	return a.uid, a.gid
}

func randomHex(n int) string {
	b := make([]byte, n)
	_, _ = rand.Read(b)
	return hex.EncodeToString(b)
}

// command is a command run as the server's user, in its directory.
func (p *Postgres) command(name string, args ...string) *exec.Cmd {
	cmd := exec.Command(name, args...)
	cmd.Dir = p.dir
	cmd.SysProcAttr = &syscall.SysProcAttr{Credential: p.cred}
	return cmd
}

// writeFile writes a file the server's user owns and alone can read.
func (p *Postgres) writeFile(path, content string) {
	p.t.Helper()
	if err := writeOwned(path, content, p.cred); err != nil {
		p.t.Fatal(err)
	}
}

func writeOwned(path, content string, cred *syscall.Credential) error {
	if err := os.WriteFile(path, []byte(content), 0o600); err != nil {
		return err
	}
	if cred != nil {
		return os.Chown(path, int(cred.Uid), int(cred.Gid))
	}
	return nil
}

// server is the postgres process, not started: run as the server's
// user, in its directory; stopped in fast mode (SIGINT: clients are
// disconnected, data is kept), as `pg_ctl stop` does; shut down at once
// (SIGQUIT) if the test process dies first.
func (p *Postgres) server() *Server {
	return &Server{Name: "postgres", Dir: p.dir, Log: p.log, Cred: p.cred,
		StopSignal: syscall.SIGINT, StopGrace: 30 * time.Second, DeathSignal: syscall.SIGQUIT, Ready: p.ready}
}

// startServer runs postgres in the foreground, as a child of the test,
// on p.port, and waits until it is ready.
func (p *Postgres) startServer() error {
	p.srv.Argv = []string{filepath.Join(p.bin, "postgres"), "-D", p.data,
		"-c", "listen_addresses=127.0.0.1",
		"-c", "port=" + strconv.Itoa(p.port),
		"-c", "unix_socket_directories=" + p.dir,
		// Throwaway data: durability buys nothing and costs time.
		"-c", "fsync=off", "-c", "synchronous_commit=off", "-c", "full_page_writes=off",
		"-c", "shared_buffers=16MB", "-c", "max_connections=" + strconv.Itoa(p.maxConns),
		"-c", "logging_collector=off", "-c", "log_min_messages=warning",
		"-c", "ssl=on", "-c", "ssl_cert_file=" + filepath.Join(p.dir, "server.crt"), "-c", "ssl_ca_file=" + p.caFile,
		"-c", "ssl_key_file=" + filepath.Join(p.dir, "server.key"),
		// The role in every line, so that a test can count a role's
		// statements (ALTER ROLE ... SET log_statement = 'all').
		"-c", "log_line_prefix=%m [%p] %q%u@%d "}
	if err := p.srv.Start(); err != nil {
		return fmt.Errorf("postgres on port %d: %w", p.port, err)
	}
	return nil
}

// ready reads the server's status line in postmaster.pid: "ready", which
// is what pg_ctl -w waits for too, or "standby" (a hot standby that
// accepts read-only connections).
func (p *Postgres) ready() error {
	data, _ := os.ReadFile(filepath.Join(p.data, "postmaster.pid"))
	// Line 8 is the status: "starting", "stopping", "ready", "standby".
	lines := strings.Split(string(data), "\n")
	if len(lines) > 7 && (strings.TrimSpace(lines[7]) == "ready" || strings.TrimSpace(lines[7]) == "standby") {
		return nil
	}
	return errors.New("postmaster.pid does not say ready")
}

// Stop shuts the server down in fast mode (SIGINT: clients are
// disconnected, data is kept), as `pg_ctl stop` does, and waits until it
// is gone.
func (p *Postgres) Stop(t testing.TB) {
	t.Helper()
	p.srv.Stop()
}

// Start starts a stopped server again, on the same port, with its data.
func (p *Postgres) Start(t testing.TB) {
	t.Helper()
	if err := p.startServer(); err != nil {
		t.Fatal(err)
	}
}

// Restart is a fast restart: Stop, then Start.
func (p *Postgres) Restart(t testing.TB) {
	t.Helper()
	p.Stop(t)
	p.Start(t)
}

// Pid is the postmaster's process id, 0 if it is not running.
func (p *Postgres) Pid() int { return p.srv.Pid() }

// ServerLog is what the server logged so far.
func (p *Postgres) ServerLog() string {
	data, _ := os.ReadFile(p.log)
	return string(data)
}

// Host is the server's address, 127.0.0.1.
func (p *Postgres) Host() string { return "127.0.0.1" }

// Port is the server's TCP port.
func (p *Postgres) Port() int { return p.port }

// SocketDir is the directory of the server's unix socket.
func (p *Postgres) SocketDir() string { return p.dir }

// Addr is host:port of the server.
func (p *Postgres) Addr() string { return net.JoinHostPort(p.Host(), strconv.Itoa(p.port)) }

// URL is a connection URL for role and password to database postgres,
// without TLS.
func (p *Postgres) URL(role, password string) string {
	return postgresURL(p.Addr(), role, password, "postgres")
}

// SuperuserURL is URL for the superuser.
func (p *Postgres) SuperuserURL() string { return p.URL(PostgresSuperuser, p.Password) }

func postgresURL(addr, role, password, database string) string {
	u := url.URL{Scheme: "postgres", User: url.UserPassword(role, password), Host: addr, Path: "/" + database,
		RawQuery: "sslmode=disable"}
	return u.String()
}

// Psql runs SQL as the superuser with psql and returns its output (tuples
// only, unaligned); it fails the test if psql does.
func (p *Postgres) Psql(t testing.TB, sql string) string {
	t.Helper()
	cmd := exec.Command(filepath.Join(p.bin, "psql"), "-X", "-q", "-At", "-v", "ON_ERROR_STOP=1",
		"-h", p.Host(), "-p", strconv.Itoa(p.port), "-U", PostgresSuperuser, "-d", "postgres", "-c", sql)
	cmd.Env = append(os.Environ(), "PGPASSWORD="+p.Password, "PGSSLMODE=disable", "PGCONNECT_TIMEOUT=10")
	out, err := cmd.CombinedOutput()
	if err != nil {
		t.Fatalf("psql %q: %v\n%s", sql, err, out)
	}
	return strings.TrimSpace(string(out))
}

// RoleOptions are the privileges of a role made by CreateRole.
type RoleOptions struct {
	// Create grants CREATE on schema public, so that the role can create
	// tables. Zero value: it can use tables others grant it access to,
	// but create none.
	Create bool
}

// CreateRole creates a role that logs in with password.
func (p *Postgres) CreateRole(t testing.TB, role, password string, opts RoleOptions) {
	t.Helper()
	sql := fmt.Sprintf("CREATE ROLE %s LOGIN PASSWORD %s", quoteIdent(role), quoteLiteral(password))
	if opts.Create {
		sql += fmt.Sprintf("; GRANT CREATE ON SCHEMA public TO %s", quoteIdent(role))
	}
	p.Psql(t, sql)
}

func quoteIdent(s string) string   { return `"` + strings.ReplaceAll(s, `"`, `""`) + `"` }
func quoteLiteral(s string) string { return `'` + strings.ReplaceAll(s, `'`, `''`) + `'` }

// PgBouncer is a PgBouncer in front of a Postgres started by
// StartPgBouncer, on 127.0.0.1 and a free port. It is stopped when the
// test ends.
type PgBouncer struct {
	port int
	log  string
	srv  *Server
}

// StartPgBouncer starts PgBouncer in pool mode ("session", "transaction"
// or "statement") in front of pg, for every database, and waits until it
// accepts connections. users maps each role that may log in through it to
// its password, which PgBouncer also uses to log in to PostgreSQL
// (scram-sha-256 on both sides). PgBouncer refuses to run as root: as root
// it runs as the same user as the cluster.
func StartPgBouncer(t testing.TB, pg *Postgres, mode string, users map[string]string) *PgBouncer {
	t.Helper()
	bin := PgBouncerBinary(t)
	dir, cred := serverDir(t, "leaderrun-pgbouncer-")
	t.Cleanup(func() { os.RemoveAll(dir) })
	var userlist strings.Builder
	for u, pw := range users {
		fmt.Fprintf(&userlist, "%q %q\n", u, pw)
	}
	if err := writeOwned(filepath.Join(dir, "userlist.txt"), userlist.String(), cred); err != nil {
		t.Fatal(err)
	}
	b := &PgBouncer{log: filepath.Join(dir, "pgbouncer.log")}
	var err error
	for try := 0; try < 3; try++ {
		b.port = FreePort(t, "127.0.0.1")
		ini := fmt.Sprintf(`[databases]
* = host=%s port=%d

[pgbouncer]
listen_addr = 127.0.0.1
listen_port = %d
unix_socket_dir =
auth_type = scram-sha-256
auth_file = %s
pool_mode = %s
max_client_conn = 500
default_pool_size = 20
logfile = %s
log_connections = 0
log_disconnections = 0
`, pg.Host(), pg.Port(), b.port, filepath.Join(dir, "userlist.txt"), mode, b.log)
		if err = writeOwned(filepath.Join(dir, "pgbouncer.ini"), ini, cred); err != nil {
			t.Fatal(err)
		}
		if err = b.start(bin, dir, cred); err == nil {
			t.Cleanup(b.stop)
			return b
		}
	}
	t.Fatal(err)
	return nil
}

func (b *PgBouncer) start(bin, dir string, cred *syscall.Credential) error {
	// SIGINT closes every connection at once.
	b.srv = &Server{Name: "pgbouncer", Argv: []string{bin, filepath.Join(dir, "pgbouncer.ini")}, Dir: dir, Cred: cred,
		Log: filepath.Join(dir, "pgbouncer.out"), StopSignal: syscall.SIGINT, DeathSignal: syscall.SIGTERM, StartTimeout: 30 * time.Second,
		Ready: func() error {
			c, err := net.DialTimeout("tcp", b.Addr(), time.Second)
			if err == nil {
				c.Close()
			}
			return err
		}}
	if err := b.srv.Start(); err != nil {
		logData, _ := os.ReadFile(b.log)
		return fmt.Errorf("pgbouncer on port %d: %w%s", b.port, err, logData)
	}
	return nil
}

func (b *PgBouncer) stop() { b.srv.Stop() }

// Addr is host:port of PgBouncer.
func (b *PgBouncer) Addr() string { return net.JoinHostPort("127.0.0.1", strconv.Itoa(b.port)) }

// URL is a connection URL through PgBouncer for role and password to
// database postgres.
func (b *PgBouncer) URL(role, password string) string {
	return postgresURL(b.Addr(), role, password, "postgres")
}

// StartStandby makes a hot standby of p, as an operator would: a base
// backup taken with pg_basebackup -R (which writes standby.signal and the
// primary's connection settings), started on a free port, streaming from
// p (after a fast checkpoint: a spread one can take minutes). It waits
// until the standby accepts read-only connections, and stops
// and removes it when the test ends. Its Password is p's.
func (p *Postgres) StartStandby(t testing.TB) *Postgres {
	t.Helper()
	s := &Postgres{t: t, bin: p.bin, Password: p.Password, maxConns: p.maxConns, caFile: p.caFile, ca: p.ca, caKey: p.caKey}
	s.dir, s.cred = serverDir(t, "leaderrun-pg-standby-")
	s.data = filepath.Join(s.dir, "data")
	s.log = filepath.Join(s.dir, "postgres.log")
	s.srv = s.server()
	t.Cleanup(func() {
		s.srv.Terminate(syscall.SIGQUIT, 10*time.Second)
		os.RemoveAll(s.dir)
	})
	for _, f := range []string{"server.crt", "server.key"} {
		data, err := os.ReadFile(filepath.Join(p.dir, f))
		if err != nil {
			t.Fatal(err)
		}
		s.writeFile(filepath.Join(s.dir, f), string(data))
	}
	backup := s.command(filepath.Join(p.bin, "pg_basebackup"), "-D", s.data, "-h", p.Host(), "-p", strconv.Itoa(p.port),
		"-U", PostgresSuperuser, "-R", "-X", "stream", "--checkpoint=fast", "--no-sync")
	backup.Env = append(os.Environ(), "PGPASSWORD="+p.Password, "PGSSLMODE=disable", "PGCONNECT_TIMEOUT=10")
	if out, err := backup.CombinedOutput(); err != nil {
		t.Fatalf("pg_basebackup: %v\n%s", err, out)
	}
	var err error
	for try := 0; try < 3; try++ {
		s.port = FreePort(t, "127.0.0.1")
		if err = s.startServer(); err == nil {
			break
		}
	}
	if err != nil {
		t.Fatal(err)
	}
	if got := s.Psql(t, "SELECT pg_is_in_recovery()"); got != "t" {
		t.Fatalf("the standby is not in recovery: pg_is_in_recovery() = %q", got)
	}
	return s
}

// ClientCert writes a client certificate for role, signed by the CA that
// the server trusts (CAFile), and its key, and returns their paths. With
// a passphrase, the key is RSA in PKCS #1, encrypted as OpenSSL's
// traditional PEM format does it (what libpq's sslpassword decrypts, and
// pgx with it); without, an unencrypted EC key.
func (p *Postgres) ClientCert(t testing.TB, role, passphrase string) (certFile, keyFile string) {
	t.Helper()
	var pub any
	var keyPEM *pem.Block
	if passphrase != "" {
		key, err := rsa.GenerateKey(rand.Reader, 2048)
		if err != nil {
			t.Fatal(err)
		}
		// Deprecated in crypto/x509 (the format is weak), but it is the
		// one that sslpassword decrypts.
		//lint:ignore SA1019 the legacy PEM encryption is what the test needs
		keyPEM, err = x509.EncryptPEMBlock(rand.Reader, "RSA PRIVATE KEY", x509.MarshalPKCS1PrivateKey(key),
			[]byte(passphrase), x509.PEMCipherAES256)
		if err != nil {
			t.Fatal(err)
		}
		pub = &key.PublicKey
	} else {
		key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
		if err != nil {
			t.Fatal(err)
		}
		der, err := x509.MarshalPKCS8PrivateKey(key)
		if err != nil {
			t.Fatal(err)
		}
		keyPEM, pub = &pem.Block{Type: "PRIVATE KEY", Bytes: der}, &key.PublicKey
	}
	now := time.Now()
	leaf := &x509.Certificate{SerialNumber: big.NewInt(now.UnixNano()), Subject: pkix.Name{CommonName: role},
		NotBefore: now.Add(-time.Hour), NotAfter: now.Add(24 * time.Hour),
		KeyUsage: x509.KeyUsageDigitalSignature, ExtKeyUsage: []x509.ExtKeyUsage{x509.ExtKeyUsageClientAuth}}
	der, err := x509.CreateCertificate(rand.Reader, leaf, p.ca, pub, p.caKey)
	if err != nil {
		t.Fatal(err)
	}
	dir := t.TempDir()
	certFile, keyFile = filepath.Join(dir, role+".crt"), filepath.Join(dir, role+".key")
	if err := os.WriteFile(certFile, pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: der}), 0o600); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(keyFile, pem.EncodeToMemory(keyPEM), 0o600); err != nil {
		t.Fatal(err)
	}
	return certFile, keyFile
}

// HostileAnswer is how a HostilePostgres answers.
type HostileAnswer int

const (
	// EndlessRows answers the first statement of each connection with a
	// row description and then data rows, without end.
	EndlessRows HostileAnswer = iota
	// HugeRow answers it with one data row that says it is 1 GiB long,
	// and then its bytes, without end.
	HugeRow
	// EndlessParameters answers the start-up with parameter statuses,
	// each of another name, without end, and is never ready.
	EndlessParameters
)

// HostilePostgres is a fake PostgreSQL server on 127.0.0.1 and a free
// port, written with pgx's pgproto3: it refuses TLS, trusts every user
// and answers as its HostileAnswer says, for as long as the client reads.
// It stops when the test ends.
type HostilePostgres struct {
	ln     net.Listener
	answer HostileAnswer
	wg     sync.WaitGroup

	mu    sync.Mutex
	conns map[net.Conn]bool
}

// StartHostilePostgres starts a HostilePostgres.
func StartHostilePostgres(t testing.TB, answer HostileAnswer) *HostilePostgres {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	h := &HostilePostgres{ln: ln, answer: answer, conns: map[net.Conn]bool{}}
	h.wg.Add(1)
	go h.accept()
	t.Cleanup(func() {
		ln.Close()
		h.mu.Lock()
		for c := range h.conns {
			c.Close()
		}
		h.mu.Unlock()
		h.wg.Wait()
	})
	return h
}

// Addr is host:port of the server.
func (h *HostilePostgres) Addr() string { return h.ln.Addr().String() }

// URL is a connection URL to it, without TLS.
func (h *HostilePostgres) URL() string { return postgresURL(h.Addr(), "app", "pw", "postgres") }

func (h *HostilePostgres) accept() {
	defer h.wg.Done()
	for {
		nc, err := h.ln.Accept()
		if err != nil {
			return
		}
		h.mu.Lock()
		h.conns[nc] = true
		h.mu.Unlock()
		h.wg.Add(1)
		go func() {
			defer h.wg.Done()
			defer func() {
				h.mu.Lock()
				delete(h.conns, nc)
				h.mu.Unlock()
				nc.Close()
			}()
			_ = h.serve(nc)
		}()
	}
}

// serve answers one connection until the client goes.
func (h *HostilePostgres) serve(nc net.Conn) error {
	be := pgproto3.NewBackend(nc, nc)
	msg, err := be.ReceiveStartupMessage()
	if _, ok := msg.(*pgproto3.SSLRequest); ok && err == nil {
		if _, err := nc.Write([]byte{'N'}); err != nil {
			return err
		}
		msg, err = be.ReceiveStartupMessage()
	}
	if _, ok := msg.(*pgproto3.StartupMessage); !ok || err != nil {
		return err // a cancel request, or nothing
	}
	be.Send(&pgproto3.AuthenticationOk{})
	if h.answer == EndlessParameters {
		var batch []byte
		for i := 0; i < 1000; i++ {
			batch, _ = (&pgproto3.ParameterStatus{Name: fmt.Sprintf("p%d", i), Value: strings.Repeat("x", 1000)}).Encode(batch)
		}
		for {
			if _, err := nc.Write(batch); err != nil {
				return err
			}
		}
	}
	be.Send(&pgproto3.ParameterStatus{Name: "server_version", Value: "15.0"})
	be.Send(&pgproto3.BackendKeyData{ProcessID: 1, SecretKey: []byte{0, 0, 0, 1}})
	be.Send(&pgproto3.ReadyForQuery{TxStatus: 'I'})
	if err := be.Flush(); err != nil {
		return err
	}
	for {
		msg, err := be.Receive()
		if err != nil {
			return err
		}
		switch msg.(type) {
		case *pgproto3.Sync, *pgproto3.Query:
			return h.flood(be, nc)
		}
	}
}

// flood answers a statement as h.answer says, until a write fails.
func (h *HostilePostgres) flood(be *pgproto3.Backend, nc net.Conn) error {
	be.Send(&pgproto3.ParseComplete{})
	be.Send(&pgproto3.BindComplete{})
	var fields []pgproto3.FieldDescription
	for i := 0; i < 10; i++ {
		fields = append(fields, pgproto3.FieldDescription{Name: []byte(fmt.Sprintf("c%d", i)), DataTypeOID: 25, DataTypeSize: -1})
	}
	be.Send(&pgproto3.RowDescription{Fields: fields})
	if err := be.Flush(); err != nil {
		return err
	}
	var batch []byte
	switch h.answer {
	case HugeRow:
		batch = []byte{'D', 0x40, 0, 0, 0} // 1 GiB follows
		if _, err := nc.Write(batch); err != nil {
			return err
		}
		batch = make([]byte, 64<<10)
	default:
		values := make([][]byte, len(fields))
		for i := range values {
			values[i] = []byte("t")
		}
		for i := 0; i < 1000; i++ {
			batch, _ = (&pgproto3.DataRow{Values: values}).Encode(batch)
		}
	}
	for {
		if _, err := nc.Write(batch); err != nil {
			return err
		}
	}
}
