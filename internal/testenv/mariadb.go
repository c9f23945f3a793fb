package testenv

import (
	"context"
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/sha256"
	"crypto/x509"
	"crypto/x509/pkix"
	"database/sql"
	"encoding/hex"
	"encoding/pem"
	"fmt"
	"math/big"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	// The driver registers "mysql" with database/sql.
	_ "github.com/go-sql-driver/mysql"
)

// mariadbStartTimeout bounds the wait for a new server to accept
// connections: seconds, with InnoDB's recovery after a kill.
const mariadbStartTimeout = 60 * time.Second

// MariaDBBinary finds mariadbd: $LEADERRUN_MARIADB_BIN (what
// scripts/install-mariadb.sh prints), then PATH, then Debian's
// /usr/sbin/mariadbd (not in every PATH). It skips the test if none is
// found, or fails it under CI=true.
func MariaDBBinary(t testing.TB) string {
	t.Helper()
	return packaged(t, "LEADERRUN_MARIADB_BIN", "mariadbd", "/usr/sbin/mariadbd", "install-mariadb.sh")
}

// mariadbInstallDB finds mariadb-install-db (or mysql_install_db) beside
// the server, in ../bin or ../scripts, then in PATH.
func mariadbInstallDB(t testing.TB, server string) string {
	t.Helper()
	dir := filepath.Dir(server)
	for _, name := range []string{"mariadb-install-db", "mysql_install_db"} {
		for _, d := range []string{dir, filepath.Join(dir, "..", "bin"), filepath.Join(dir, "..", "scripts")} {
			if p := filepath.Join(d, name); isExecutable(p) {
				return p
			}
		}
		if p, err := exec.LookPath(name); err == nil {
			return p
		}
	}
	Missing(t, "mariadb-install-db not found beside "+server+" or in PATH: run scripts/install-mariadb.sh")
	return ""
}

// MariaDBOptions are the settings of a server started by StartMariaDB.
// The zero value of each field is noted.
type MariaDBOptions struct {
	// MaxConnections is the server's max_connections: each waiting
	// leaderrun keeps a connection. Zero: 1000.
	MaxConnections int
	// TLS gives the server a certificate for 127.0.0.1 signed by a CA the
	// test makes (CAFile). Zero: no TLS.
	TLS bool
}

// MariaDB is a throwaway MariaDB server on 127.0.0.1 and a free port, and
// a unix socket, with its data directory (made by mariadb-install-db) in a
// temporary directory. It has a database "leaderrun" and the root user,
// who logs in with RootPassword. It is stopped when the test ends. As
// root, the server runs as root (--user=root).
type MariaDB struct {
	// RootPassword is root's password, random for each server.
	RootPassword string

	opts   MariaDBOptions
	bin    string
	dir    string
	port   int
	caFile string
	srv    *Server
}

// StartMariaDB creates a data directory, starts a server on it and waits
// until it accepts connections.
func StartMariaDB(t testing.TB, opts MariaDBOptions) *MariaDB {
	t.Helper()
	m := &MariaDB{opts: opts, bin: MariaDBBinary(t), dir: t.TempDir(), RootPassword: mariadbSecret()}
	if m.opts.MaxConnections <= 0 {
		m.opts.MaxConnections = 1000
	}
	if err := os.Mkdir(m.tmp(), 0o700); err != nil {
		t.Fatal(err)
	}
	install := exec.Command(mariadbInstallDB(t, m.bin), append([]string{"--no-defaults", "--datadir=" + m.data(),
		"--tmpdir=" + m.tmp(), "--auth-root-authentication-method=normal", "--skip-test-db", "--skip-name-resolve"},
		asRoot()...)...)
	if out, err := install.CombinedOutput(); err != nil {
		t.Fatalf("mariadb-install-db: %v\n%s", err, out)
	}
	if opts.TLS {
		m.makeCertificates(t)
	}
	var err error
	for try := 0; try < 3; try++ {
		m.port = FreePort(t, "127.0.0.1")
		m.srv = &Server{Name: fmt.Sprintf("mariadbd on port %d", m.port), Argv: append([]string{m.bin}, m.args()...),
			Dir: m.dir, Log: filepath.Join(m.dir, "mariadb.out"), StopGrace: 60 * time.Second,
			Ready: m.answers, StartTimeout: mariadbStartTimeout}
		if err = m.srv.Start(); err == nil {
			t.Cleanup(m.srv.Kill)
			break
		}
	}
	if err != nil {
		t.Fatal(err)
	}
	// Through the socket, as the installer's root (no password yet).
	db := m.open(t, "root@unix("+m.SocketPath()+")/")
	for _, q := range []string{
		"ALTER USER root@localhost IDENTIFIED BY '" + m.RootPassword + "'",
		"CREATE USER IF NOT EXISTS root@'127.0.0.1'",
		"ALTER USER root@'127.0.0.1' IDENTIFIED BY '" + m.RootPassword + "'",
		"GRANT ALL ON *.* TO root@'127.0.0.1' WITH GRANT OPTION",
		"CREATE DATABASE leaderrun",
	} {
		if _, err := db.Exec(q); err != nil {
			t.Fatalf("%s: %v", q, err)
		}
	}
	return m
}

// asRoot is what lets mariadbd run as root, which it refuses by default:
// the tests' own temporary directories are root's.
func asRoot() []string {
	if os.Geteuid() == 0 {
		return []string{"--user=root"}
	}
	return nil
}

// mariadbSecret is a random password.
func mariadbSecret() string {
	b := make([]byte, 12)
	_, _ = rand.Read(b)
	return hex.EncodeToString(b)
}

func (m *MariaDB) data() string { return filepath.Join(m.dir, "data") }

// tmp is the server's tmpdir, its own: a server that starts removes
// every temporary table's file (#sql*) in its tmpdir, so in a shared /tmp
// it removed those of another test's installer, whose bootstrap then
// failed ("Could not remove temporary table", "Unknown table
// 'mysql.tmp_user_sys'").
func (m *MariaDB) tmp() string { return filepath.Join(m.dir, "tmp") }

// args are the server's settings, on its command line.
func (m *MariaDB) args() []string {
	a := []string{"--no-defaults", "--datadir=" + m.data(), "--port=" + strconv.Itoa(m.port), "--bind-address=127.0.0.1",
		"--socket=" + m.SocketPath(), "--pid-file=" + filepath.Join(m.dir, "mariadb.pid"), "--tmpdir=" + m.tmp(),
		"--log-error=" + filepath.Join(m.dir, "mariadb.log"), "--skip-name-resolve", "--skip-log-bin",
		"--max-connections=" + strconv.Itoa(m.opts.MaxConnections), "--innodb-buffer-pool-size=32M",
		"--performance-schema=OFF", "--character-set-server=utf8mb4"}
	a = append(a, asRoot()...)
	if m.caFile != "" {
		a = append(a, "--ssl-ca="+m.caFile, "--ssl-cert="+filepath.Join(m.dir, "server.crt"), "--ssl-key="+filepath.Join(m.dir, "server.key"))
	}
	return a
}

// answers dials the server's socket: a server in another process offers
// nothing else to wait on.
func (m *MariaDB) answers() error {
	c, err := net.DialTimeout("unix", m.SocketPath(), time.Second)
	if err == nil {
		c.Close()
	}
	return err
}

// Stop shuts the server down as an operator does (SIGTERM: it closes
// every connection, flushes InnoDB and exits), and waits until it is gone.
func (m *MariaDB) Stop(t testing.TB) { m.srv.Stop() }

// Kill kills the server with SIGKILL and waits until it is gone: InnoDB
// recovers what its log holds at the next start.
func (m *MariaDB) Kill(t testing.TB) { m.srv.Kill() }

// Start starts a stopped server again, on the same port, with its data.
func (m *MariaDB) Start(t testing.TB) {
	t.Helper()
	if err := m.srv.Start(); err != nil {
		t.Fatalf("%v\n%s", err, m.Log())
	}
}

// Restart is Stop, then Start.
func (m *MariaDB) Restart(t testing.TB) {
	t.Helper()
	m.Stop(t)
	m.Start(t)
}

// Log is what the server logged so far.
func (m *MariaDB) Log() string {
	data, _ := os.ReadFile(filepath.Join(m.dir, "mariadb.log"))
	out, _ := os.ReadFile(filepath.Join(m.dir, "mariadb.out"))
	s := string(data) + string(out)
	if len(s) > 4000 {
		s = s[len(s)-4000:]
	}
	return s
}

// Port is the server's TCP port.
func (m *MariaDB) Port() int { return m.port }

// Addr is host:port of the server.
func (m *MariaDB) Addr() string { return net.JoinHostPort("127.0.0.1", strconv.Itoa(m.port)) }

// SocketPath is the server's unix socket.
func (m *MariaDB) SocketPath() string { return filepath.Join(m.dir, "mariadb.sock") }

// CAFile is the CA that signed the server's certificate (MariaDBOptions.TLS).
func (m *MariaDB) CAFile() string { return m.caFile }

// DSN is go-sql-driver's DSN for user and password (none if empty) over
// TCP to database, with params (key=value&...) if any.
func (m *MariaDB) DSN(user, password, database, params string) string {
	dsn := user
	if password != "" {
		dsn += ":" + password
	}
	dsn += "@tcp(" + m.Addr() + ")/" + database
	if params != "" {
		dsn += "?" + params
	}
	return dsn
}

// RootDSN is DSN for root, to database leaderrun.
func (m *MariaDB) RootDSN() string { return m.DSN("root", m.RootPassword, "leaderrun", "") }

func (m *MariaDB) open(t testing.TB, dsn string) *sql.DB {
	t.Helper()
	db, err := sql.Open("mysql", dsn)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { db.Close() })
	return db
}

// DB is a connection pool as root to database leaderrun, as an
// operator's client would be; it is closed when the test ends.
func (m *MariaDB) DB(t testing.TB) *sql.DB {
	t.Helper()
	return m.open(t, m.RootDSN())
}

// Exec runs statements as root in database leaderrun, and fails the test
// if one fails.
func (m *MariaDB) Exec(t testing.TB, stmts ...string) {
	t.Helper()
	db := m.DB(t)
	for _, q := range stmts {
		ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
		_, err := db.ExecContext(ctx, q)
		cancel()
		if err != nil {
			t.Fatalf("%s: %v", q, err)
		}
	}
}

// CreateUser creates user@'127.0.0.1' with password, granted privs
// (e.g. "SELECT, INSERT, UPDATE ON leaderrun.*"; none if empty).
func (m *MariaDB) CreateUser(t testing.TB, user, password, privs string) {
	t.Helper()
	stmts := []string{fmt.Sprintf("CREATE USER '%s'@'127.0.0.1' IDENTIFIED BY '%s'", user, password)}
	if privs != "" {
		stmts = append(stmts, fmt.Sprintf("GRANT %s TO '%s'@'127.0.0.1'", privs, user))
	}
	m.Exec(t, stmts...)
}

// makeCertificates writes a CA and a server certificate it signed for
// 127.0.0.1 (and no name: verification holds for 127.0.0.1 and fails for
// localhost).
func (m *MariaDB) makeCertificates(t testing.TB) {
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
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		t.Fatal(err)
	}
	leaf := &x509.Certificate{SerialNumber: big.NewInt(2), Subject: pkix.Name{CommonName: "127.0.0.1"},
		NotBefore: now.Add(-time.Hour), NotAfter: now.Add(24 * time.Hour), IPAddresses: []net.IP{net.IPv4(127, 0, 0, 1)},
		KeyUsage: x509.KeyUsageDigitalSignature, ExtKeyUsage: []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth}}
	der, err := x509.CreateCertificate(rand.Reader, leaf, caCert, &key.PublicKey, caKey)
	if err != nil {
		t.Fatal(err)
	}
	keyDER, err := x509.MarshalPKCS8PrivateKey(key)
	if err != nil {
		t.Fatal(err)
	}
	m.caFile = filepath.Join(m.dir, "ca.crt")
	for path, block := range map[string]*pem.Block{m.caFile: {Type: "CERTIFICATE", Bytes: caDER},
		filepath.Join(m.dir, "server.crt"): {Type: "CERTIFICATE", Bytes: der},
		filepath.Join(m.dir, "server.key"): {Type: "PRIVATE KEY", Bytes: keyDER}} {
		if err := os.WriteFile(path, pem.EncodeToMemory(block), 0o600); err != nil {
			t.Fatal(err)
		}
	}
}

// SessionsOf counts the server's sessions whose statement in progress
// contains text (information_schema.PROCESSLIST), as root sees them.
func (m *MariaDB) SessionsOf(t testing.TB, db *sql.DB, text string) int {
	t.Helper()
	var n int
	err := db.QueryRow("SELECT COUNT(*) FROM information_schema.PROCESSLIST WHERE INFO LIKE ? AND ID <> CONNECTION_ID()",
		"%"+strings.ReplaceAll(text, "%", `\%`)+"%").Scan(&n)
	if err != nil {
		t.Fatal(err)
	}
	return n
}

// MySQLNamedLocks are the names of the named locks that the mysql store
// (backends/mysql) takes for the lock key ("leaderrun/" + lock by default)
// kept in table of database: the queue's, held by the first waiter in
// line, and the holder's. A session waiting in GET_LOCK for one of them
// shows it in information_schema.PROCESSLIST (SessionsOf): the scenarios
// count the waiters so. backends/mysql's tests check that this rule is
// the store's.
func MySQLNamedLocks(database, table, key string) (queue, held string) {
	sum := sha256.Sum256([]byte(database + "\x00" + table + "\x00" + key))
	named := "leaderrun:" + hex.EncodeToString(sum[:16])
	return named + ":q", named + ":h"
}
