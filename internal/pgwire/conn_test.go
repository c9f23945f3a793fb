package pgwire

import (
	"bufio"
	"context"
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/base64"
	"encoding/binary"
	"encoding/pem"
	"errors"
	"fmt"
	"io"
	"math/big"
	"net"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/leaderrun/leaderrun/internal/testenv"
)

// TestServer runs the client against a real PostgreSQL: every
// authentication method it speaks, TLS in every sslmode, the unix socket,
// several hosts, types both ways, notifications and cancellation.
func TestServer(t *testing.T) {
	pg := testenv.StartPostgres(t)
	connect := func(t *testing.T, s string) (*Conn, error) {
		t.Helper()
		cfg, err := ParseConfig(s, vars(nil))
		if err != nil {
			t.Fatal(err)
		}
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		defer cancel()
		c, err := Connect(ctx, cfg)
		if c != nil {
			t.Cleanup(c.Close)
		}
		return c, err
	}
	base := fmt.Sprintf("host=%s port=%d dbname=postgres", pg.Host(), pg.Port())
	super := base + " user=" + testenv.PostgresSuperuser + " password=" + pg.Password
	one := func(t *testing.T, c *Conn, sql string, args ...any) [][]byte {
		t.Helper()
		rows, err := c.Query(context.Background(), sql, args...)
		if err != nil {
			t.Fatalf("%s: %v", sql, err)
		}
		if len(rows) != 1 {
			t.Fatalf("%s: %d rows, want 1", sql, len(rows))
		}
		return rows[0]
	}

	t.Run("Authentication", func(t *testing.T) {
		pg.Psql(t, "SET password_encryption = 'md5'; CREATE ROLE "+testenv.LegacyAuthRoles["md5"]+" LOGIN PASSWORD 'md5-pw'")
		pg.Psql(t, "CREATE ROLE "+testenv.LegacyAuthRoles["password"]+" LOGIN PASSWORD 'clear-pw'")
		pg.Psql(t, "CREATE ROLE scram_login LOGIN PASSWORD 'scram-pw'")
		for _, tc := range []struct{ user, password, method string }{
			{testenv.LegacyAuthRoles["md5"], "md5-pw", "md5"},
			{testenv.LegacyAuthRoles["password"], "clear-pw", "password"},
			{"scram_login", "scram-pw", "scram-sha-256"},
		} {
			c, err := connect(t, base+" sslmode=disable user="+tc.user+" password="+tc.password)
			if err != nil {
				t.Errorf("%s with %s: %v", tc.user, tc.method, err)
				continue
			}
			var who string
			if err := Scan(one(t, c, "SELECT current_user"), &who); err != nil || who != tc.user {
				t.Errorf("%s: logged in as %q (%v)", tc.method, who, err)
			}
			_, err = connect(t, base+" sslmode=disable user="+tc.user+" password=wrong-"+tc.password)
			var pgErr *PgError
			if !errors.As(err, &pgErr) || pgErr.Code != "28P01" {
				t.Errorf("%s with a wrong password: %v, want SQLSTATE 28P01", tc.method, err)
			}
			if err != nil && strings.Contains(err.Error(), "wrong-"+tc.password) {
				t.Errorf("the error shows the password: %v", err)
			}
		}
	})

	t.Run("TLS", func(t *testing.T) {
		t.Setenv("HOME", t.TempDir()) // no ~/.postgresql/root.crt
		other := foreignCA(t)
		for _, tc := range []struct {
			mode    string
			host    string
			ssl     string // "t", "f", or "" for an error containing fail
			fail    string
			rootPEM string
		}{
			{"disable", "127.0.0.1", "f", "", ""},
			{"allow", "127.0.0.1", "f", "", ""},
			{"prefer", "127.0.0.1", "t", "", ""},
			{"require", "127.0.0.1", "t", "", ""},
			{"verify-ca", "127.0.0.1", "t", "", pg.CAFile()},
			{"verify-ca", "localhost", "t", "", pg.CAFile()}, // the chain only
			{"verify-full", "127.0.0.1", "t", "", pg.CAFile()},
			{"verify-full", "localhost", "", "certificate", pg.CAFile()},
			{"verify-ca", "127.0.0.1", "", "certificate", other},
			{"require", "127.0.0.1", "", "certificate", other}, // a root given: verified
			{"verify-full", "127.0.0.1", "", "root certificate", ""},
		} {
			name := tc.mode + "/" + tc.host
			s := fmt.Sprintf("host=%s port=%d dbname=postgres user=%s password=%s sslmode=%s", tc.host, pg.Port(),
				testenv.PostgresSuperuser, pg.Password, tc.mode)
			if tc.rootPEM != "" {
				s += " sslrootcert=" + tc.rootPEM
			}
			c, err := connect(t, s)
			if tc.ssl == "" {
				if err == nil || !strings.Contains(err.Error(), tc.fail) {
					t.Errorf("%s: %v, want an error about the %s", name, err, tc.fail)
				}
				continue
			}
			if err != nil {
				t.Errorf("%s: %v", name, err)
				continue
			}
			var ssl string
			if err := Scan(one(t, c, "SELECT ssl::text FROM pg_stat_ssl WHERE pid = pg_backend_pid()"), &ssl); err != nil {
				t.Fatal(err)
			}
			if want := map[string]string{"t": "true", "f": "false"}[tc.ssl]; ssl != want {
				t.Errorf("%s: TLS in use %s, want %s", name, ssl, want)
			}
		}
	})

	t.Run("SocketAndHosts", func(t *testing.T) {
		c, err := connect(t, fmt.Sprintf("host=%s port=%d dbname=postgres user=%s password=%s", pg.SocketDir(), pg.Port(),
			testenv.PostgresSuperuser, pg.Password))
		if err != nil {
			t.Fatalf("unix socket: %v", err)
		}
		var addr string
		if err := Scan(one(t, c, "SELECT coalesce(inet_client_addr()::text, 'socket')"), &addr); err != nil || addr != "socket" {
			t.Errorf("over the socket, the client address is %q (%v)", addr, err)
		}
		closed := testenv.FreePort(t, "127.0.0.1")
		hosts := fmt.Sprintf("postgres://%s:%s@127.0.0.1:%d,127.0.0.1:%d/postgres?sslmode=disable&connect_timeout=2",
			testenv.PostgresSuperuser, pg.Password, closed, pg.Port())
		if _, err := connect(t, hosts); err != nil {
			t.Errorf("the second host should serve when the first refuses: %v", err)
		}
		_, err = connect(t, fmt.Sprintf("postgres://u:secret@127.0.0.1:%d,127.0.0.1:%d/postgres?sslmode=disable", closed, closed))
		var ce *ConnectError
		if !errors.As(err, &ce) || !strings.Contains(err.Error(), fmt.Sprintf("127.0.0.1:%d", closed)) || strings.Contains(err.Error(), "secret") {
			t.Errorf("no host listening: %v, want a ConnectError naming the hosts and not the password", err)
		}
		_, err = connect(t, super+" sslmode=disable target_session_attrs=read-write options='-c default_transaction_read_only=on'")
		if err == nil || !strings.Contains(err.Error(), "read-only") {
			t.Errorf("a read-only session with target_session_attrs=read-write: %v, want refused", err)
		}
	})

	t.Run("Types", func(t *testing.T) {
		// A DateStyle other than ISO, as a role or a server may set it:
		// timestamps are still read.
		pg.Psql(t, "ALTER ROLE "+testenv.PostgresSuperuser+" SET DateStyle = 'SQL, DMY'")
		defer pg.Psql(t, "ALTER ROLE "+testenv.PostgresSuperuser+" RESET DateStyle")
		c, err := connect(t, super+" sslmode=disable options='-c TimeZone=Asia/Kolkata -c DateStyle=German'")
		if err != nil {
			t.Fatal(err)
		}
		at := time.Date(2026, 12, 2, 0, 51, 2, 123456000, time.UTC)
		row := one(t, c, "SELECT $1::text, $2, $3, $4, $5::timestamptz, $6::timestamptz, $2 + 1, $4::text",
			"it's \"quoted\" ü", int64(-1<<62), true, at, NullTime{}, NullTime{Time: at, Valid: true})
		var (
			s            string
			n, m         int64
			b            bool
			ts           time.Time
			null, valid  NullTime
			printedAtIST string
		)
		if err := Scan(row, &s, &n, &b, &ts, &null, &valid, &m, &printedAtIST); err != nil {
			t.Fatal(err)
		}
		if s != "it's \"quoted\" ü" || n != -1<<62 || !b || !ts.Equal(at) || null.Valid || !valid.Time.Equal(at) || m != -1<<62+1 {
			t.Errorf("round trip: %q %d %v %v %+v %+v %d", s, n, b, ts, null, valid, m)
		}
		if !strings.HasSuffix(printedAtIST, "+05:30") {
			t.Errorf("the session's time zone is not in effect: %s", printedAtIST)
		}
		_, err = c.Query(context.Background(), "SELECT 1/0")
		var pgErr *PgError
		if !errors.As(err, &pgErr) || pgErr.Code != "22012" {
			t.Errorf("1/0: %v, want SQLSTATE 22012", err)
		}
		if c.IsClosed() {
			t.Fatal("an error from the server closed the connection")
		}
		var now time.Time
		if err := Scan(one(t, c, "SELECT now()"), &now); err != nil || time.Since(now).Abs() > time.Minute {
			t.Errorf("now() = %v, %v", now, err)
		}
		results, err := c.Exec(context.Background(), "CREATE TEMP TABLE x (a int); INSERT INTO x VALUES (1), (2); SELECT a FROM x ORDER BY a")
		if err != nil || len(results) != 3 || len(results[2]) != 2 || string(results[2][1][0]) != "2" {
			t.Errorf("several statements: %v, %q", err, results)
		}
	})

	t.Run("Terminated", func(t *testing.T) {
		c, err := connect(t, super+" sslmode=disable")
		if err != nil {
			t.Fatal(err)
		}
		_, err = c.Query(context.Background(), "SELECT pg_terminate_backend(pg_backend_pid())")
		var pgErr *PgError
		if !errors.As(err, &pgErr) || pgErr.Code != "57P01" || !c.IsClosed() {
			t.Errorf("terminated by an administrator: %v (closed %v), want FATAL 57P01 and the connection closed", err, c.IsClosed())
		}
	})

	t.Run("Notifications", func(t *testing.T) {
		listener, err := connect(t, super+" sslmode=require")
		if err != nil {
			t.Fatal(err)
		}
		var got []*Notification
		listener.OnNotification = func(n *Notification) { got = append(got, n) }
		if _, err := listener.Exec(context.Background(), `LISTEN "chan nel"`); err != nil {
			t.Fatal(err)
		}
		ctx, cancel := context.WithTimeout(context.Background(), 50*time.Millisecond)
		err = listener.WaitForNotification(ctx)
		cancel()
		if !errors.Is(err, context.DeadlineExceeded) || listener.IsClosed() {
			t.Fatalf("waiting with nothing to come: %v (closed %v), want the deadline and a usable connection", err, listener.IsClosed())
		}
		if err := listener.Ping(context.Background()); err != nil {
			t.Fatalf("ping after a wait that timed out: %v", err)
		}
		sender, err := connect(t, super+" sslmode=disable")
		if err != nil {
			t.Fatal(err)
		}
		if _, err := sender.Query(context.Background(), "SELECT pg_notify($1, $2)", "chan nel", "payload ☃"); err != nil {
			t.Fatal(err)
		}
		ctx, cancel = context.WithTimeout(context.Background(), 10*time.Second)
		defer cancel()
		if err := listener.WaitForNotification(ctx); err != nil {
			t.Fatal(err)
		}
		if len(got) != 1 || got[0].Channel != "chan nel" || got[0].Payload != "payload ☃" {
			t.Errorf("notifications %+v, want one on \"chan nel\" with the payload", got)
		}
	})

	t.Run("Cancellation", func(t *testing.T) {
		c, err := connect(t, super+" sslmode=disable")
		if err != nil {
			t.Fatal(err)
		}
		ctx, cancel := context.WithTimeout(context.Background(), 100*time.Millisecond)
		defer cancel()
		start := time.Now()
		_, err = c.Query(ctx, "SELECT pg_sleep(30)")
		if !errors.Is(err, context.DeadlineExceeded) || time.Since(start) > 2*time.Second {
			t.Errorf("a statement past its deadline: %v after %v, want DeadlineExceeded at once", err, time.Since(start))
		}
		if !c.IsClosed() {
			t.Error("the connection is still open after a statement was interrupted")
		}
		if _, err := c.Query(context.Background(), "SELECT 1"); !errors.Is(err, ErrClosed) {
			t.Errorf("a statement on the closed connection: %v, want ErrClosed", err)
		}
		// A server that accepts and never answers: the connect timeout.
		ln, err := net.Listen("tcp", "127.0.0.1:0")
		if err != nil {
			t.Fatal(err)
		}
		defer ln.Close()
		start = time.Now()
		_, err = connect(t, "postgres://u@"+ln.Addr().String()+"/d?sslmode=disable&connect_timeout=2")
		if err == nil || time.Since(start) > 5*time.Second {
			t.Errorf("a silent server: %v after %v, want an error after the 2 s connect timeout", err, time.Since(start))
		}
	})
}

// foreignCA writes a CA certificate that signed nothing of the server's.
func foreignCA(t *testing.T) string {
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		t.Fatal(err)
	}
	ca := &x509.Certificate{SerialNumber: big.NewInt(1), Subject: pkix.Name{CommonName: "another CA"},
		NotBefore: time.Now().Add(-time.Hour), NotAfter: time.Now().Add(time.Hour), IsCA: true, BasicConstraintsValid: true,
		KeyUsage: x509.KeyUsageCertSign}
	der, err := x509.CreateCertificate(rand.Reader, ca, ca, &key.PublicKey, key)
	if err != nil {
		t.Fatal(err)
	}
	path := filepath.Join(t.TempDir(), "other-ca.crt")
	if err := os.WriteFile(path, pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: der}), 0o644); err != nil {
		t.Fatal(err)
	}
	return path
}

// TestScramServerMustSign: a server that ends SCRAM without proving it
// knows the password (no server signature) is refused, as is one that
// asks for more iterations than a connection may spend.
func TestScramServerMustSign(t *testing.T) {
	for _, tc := range []struct {
		name       string
		iterations int
		skipFinal  bool
		want       string
	}{
		{"no signature", 4096, true, "without its signature"},
		{"too many iterations", 1 << 30, false, "iterations"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			ln, err := net.Listen("tcp", "127.0.0.1:0")
			if err != nil {
				t.Fatal(err)
			}
			defer ln.Close()
			go fakeScramServer(ln, tc.iterations)
			cfg, err := ParseConfig("postgres://u:pw@"+ln.Addr().String()+"/d?sslmode=disable", vars(nil))
			if err != nil {
				t.Fatal(err)
			}
			ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
			defer cancel()
			c, err := Connect(ctx, cfg)
			if err == nil {
				c.Close()
			}
			if err == nil || !strings.Contains(err.Error(), tc.want) {
				t.Errorf("Connect = %v, want an error about %s", err, tc.want)
			}
		})
	}
}

// fakeScramServer answers one connection: SASL with SCRAM-SHA-256, a
// server-first message, then AuthenticationOk where SASLFinal belongs.
func fakeScramServer(ln net.Listener, iterations int) {
	nc, err := ln.Accept()
	if err != nil {
		return
	}
	defer nc.Close()
	r := bufio.NewReader(nc)
	readMsg := func(typed bool) []byte {
		if typed {
			if _, err := r.ReadByte(); err != nil {
				return nil
			}
		}
		var l [4]byte
		if _, err := io.ReadFull(r, l[:]); err != nil {
			return nil
		}
		body := make([]byte, binary.BigEndian.Uint32(l[:])-4)
		_, _ = io.ReadFull(r, body)
		return body
	}
	auth := func(kind uint32, data []byte) {
		msg := []byte{'R', 0, 0, 0, 0}
		msg = binary.BigEndian.AppendUint32(msg, kind)
		msg = append(msg, data...)
		binary.BigEndian.PutUint32(msg[1:], uint32(len(msg)-1))
		_, _ = nc.Write(msg)
	}
	readMsg(false) // startup
	auth(10, []byte("SCRAM-SHA-256\x00\x00"))
	first := readMsg(true) // SASLInitialResponse: mechanism, length, client-first
	_, rest, _ := strings.Cut(string(first), "\x00")
	nonce := rest[strings.Index(rest, "r=")+2:]
	auth(11, fmt.Appendf(nil, "r=%sserver,s=%s,i=%d", nonce, base64.StdEncoding.EncodeToString([]byte("salt")), iterations))
	readMsg(true) // client-final
	auth(0, nil)
	_, _ = nc.Write([]byte{'Z', 0, 0, 0, 5, 'I'})
}
