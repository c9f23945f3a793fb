package pgwire

import (
	"bufio"
	"context"
	"crypto/hmac"
	"crypto/md5"
	"crypto/pbkdf2"
	"crypto/rand"
	"crypto/sha256"
	"crypto/tls"
	"crypto/x509"
	"encoding/base64"
	"encoding/binary"
	"encoding/hex"
	"errors"
	"fmt"
	"io"
	"net"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"time"
)

// PgError is an error the server answered with.
type PgError struct {
	Severity string
	Code     string // SQLSTATE
	Message  string
	Detail   string
	Hint     string
}

func (e *PgError) Error() string {
	s := e.Severity + ": " + e.Message + " (SQLSTATE " + e.Code + ")"
	if e.Detail != "" {
		s += ": " + e.Detail
	}
	return s
}

// ConnectError is a failure to establish a connection to any host: the
// last host's reason, with every host tried.
type ConnectError struct {
	Hosts string
	Err   error
}

func (e *ConnectError) Error() string { return "connect to " + e.Hosts + ": " + e.Err.Error() }
func (e *ConnectError) Unwrap() error { return e.Err }

// ErrClosed is the error of a connection that was closed, by Close or
// because a statement failed in a way that left it unusable.
var ErrClosed = errors.New("pgwire: connection closed")

// Notification is a NOTIFY received on a connection that LISTENs.
type Notification struct {
	PID     uint32
	Channel string
	Payload string
}

// Conn is one connection. Its methods must not be called concurrently,
// except Close.
type Conn struct {
	nc       net.Conn
	r        *bufio.Reader
	w        []byte // the message being built
	cfg      *Config
	password string // for the host it is connected to
	txStatus byte   // of the last ReadyForQuery: I (idle), T (in a transaction), E (failed one)

	mu     sync.Mutex
	closed bool

	// OnNotification, if set, receives every notification, on the
	// goroutine of the call that read it.
	OnNotification func(*Notification)
}

// Connect tries cfg's hosts in order and returns the first connection that
// completes authentication (and is writable, with read-write target
// session attributes).
func Connect(ctx context.Context, cfg *Config) (*Conn, error) {
	if len(cfg.Hosts) == 0 {
		return nil, errNoHosts
	}
	var names, reasons []string
	var last error
	for _, h := range cfg.Hosts {
		names = append(names, h.String())
		hctx, cancel := ctx, context.CancelFunc(func() {})
		if cfg.ConnectTimeout > 0 {
			hctx, cancel = context.WithTimeout(ctx, cfg.ConnectTimeout)
		}
		c, err := connectHost(hctx, cfg, h)
		cancel()
		if err == nil {
			return c, nil
		}
		last = err
		reasons = append(reasons, h.String()+": "+err.Error())
		if ctx.Err() != nil {
			break
		}
	}
	if len(reasons) > 1 {
		last = &joined{msg: strings.Join(reasons, "; "), last: last}
	}
	return nil, &ConnectError{Hosts: strings.Join(names, ","), Err: last}
}

// joined is every host's reason, unwrapping to the last host's.
type joined struct {
	msg  string
	last error
}

func (j *joined) Error() string { return j.msg }
func (j *joined) Unwrap() error { return j.last }

func connectHost(ctx context.Context, cfg *Config, h Host) (*Conn, error) {
	modes := []bool{false} // plaintext
	switch cfg.SSLMode {
	case "allow":
		modes = []bool{false, true}
	case "prefer":
		modes = []bool{true, false}
	case "require", "verify-ca", "verify-full":
		modes = []bool{true}
	}
	if h.isSocket() {
		modes = []bool{false} // as libpq: no TLS over a unix socket
	}
	var err error
	for _, useTLS := range modes {
		var c *Conn
		c, err = startup(ctx, cfg, h, useTLS)
		if err == nil {
			return c, nil
		}
		var pgErr *PgError
		var refusedTLS *tlsRefused
		// Another mode is worth trying when the server refused this one:
		// no TLS where we asked (prefer), or no plaintext (allow: the
		// server's hba rejected it).
		if !errors.As(err, &refusedTLS) && !(errors.As(err, &pgErr) && pgErr.Code == "28000") {
			break
		}
	}
	return nil, err
}

type tlsRefused struct{}

func (*tlsRefused) Error() string { return "the server does not accept TLS" }

func startup(ctx context.Context, cfg *Config, h Host, useTLS bool) (*Conn, error) {
	network, addr := h.dial()
	var d net.Dialer
	nc, err := d.DialContext(ctx, network, addr)
	if err != nil {
		return nil, err
	}
	c := &Conn{nc: nc, cfg: cfg, password: cfg.PasswordFor(h)}
	fired := interrupt(ctx, nc)
	fail := func(err error) (*Conn, error) {
		fired()
		nc.Close()
		if ctx.Err() != nil {
			return nil, fmt.Errorf("%w (%v)", ctx.Err(), err)
		}
		return nil, err
	}
	if useTLS {
		// SSLRequest: length 8, code 80877103.
		if _, err := nc.Write([]byte{0, 0, 0, 8, 0x04, 0xd2, 0x16, 0x2f}); err != nil {
			return fail(err)
		}
		var answer [1]byte
		if _, err := io.ReadFull(nc, answer[:]); err != nil {
			return fail(err)
		}
		switch answer[0] {
		case 'S':
			tc, err := tlsConfig(cfg, h)
			if err != nil {
				return fail(err)
			}
			tlsConn := tls.Client(nc, tc)
			if err := tlsConn.HandshakeContext(ctx); err != nil {
				return fail(fmt.Errorf("TLS: %w", err))
			}
			c.nc = tlsConn
		case 'N':
			fired()
			nc.Close()
			if cfg.SSLMode == "prefer" || cfg.SSLMode == "allow" {
				return nil, &tlsRefused{}
			}
			return nil, fmt.Errorf("sslmode=%s, and the server does not accept TLS", cfg.SSLMode)
		default:
			return fail(fmt.Errorf("unexpected answer %q to the TLS request", answer[0]))
		}
	}
	c.r = bufio.NewReaderSize(c.nc, 8192)
	// StartupMessage: protocol 3.0, then name/value pairs.
	c.w = append(c.w[:0], 0, 0, 0, 0, 0, 3, 0, 0)
	c.w = appendCString(appendCString(c.w, "user"), cfg.User)
	c.w = appendCString(appendCString(c.w, "database"), cfg.Database)
	for k, v := range cfg.Params {
		c.w = appendCString(appendCString(c.w, k), v)
	}
	// Timestamps are read in ISO form. A startup parameter outranks a
	// role's or the server's setting and -c in options.
	c.w = appendCString(appendCString(c.w, "DateStyle"), "ISO, YMD")
	c.w = append(c.w, 0)
	binary.BigEndian.PutUint32(c.w, uint32(len(c.w)))
	if err := c.flush(); err != nil {
		return fail(err)
	}
	if err := c.authenticate(); err != nil {
		return fail(err)
	}
	for { // until ReadyForQuery
		t, body, err := c.receive()
		if err != nil {
			return fail(err)
		}
		if t == 'E' {
			return fail(parseError(body))
		}
		if t == 'Z' {
			c.readyStatus(body)
			break
		}
	}
	if cfg.TargetSessionAttrs == "read-write" {
		res, err := c.query("SHOW transaction_read_only", nil)
		if err != nil {
			return fail(err)
		}
		if len(res) == 0 || len(res[0]) == 0 || string(res[0][0]) != "off" {
			return fail(errors.New("the server is read-only, and target_session_attrs=read-write"))
		}
	}
	if fired() {
		nc.Close()
		return nil, ctx.Err()
	}
	return c, nil
}

// interrupt makes nc's reads and writes fail, pending ones included, once
// ctx ends. The function it returns undoes that and reports whether ctx
// ended first: nc's deadline is then in the past. It may be called more
// than once.
func interrupt(ctx context.Context, nc net.Conn) func() bool {
	done := make(chan struct{})
	stop := context.AfterFunc(ctx, func() {
		_ = nc.SetDeadline(time.Unix(1, 0))
		close(done)
	})
	var once sync.Once
	var fired bool
	return func() bool {
		once.Do(func() {
			if fired = !stop(); fired {
				<-done
			}
		})
		return fired
	}
}

// tlsConfig is what sslmode asks of the server's certificate: nothing
// (require, without a root certificate), a chain to the root certificate
// (verify-ca, and require with one), or that and the host name
// (verify-full). sslrootcert=system is the system's roots.
func tlsConfig(cfg *Config, h Host) (*tls.Config, error) {
	tc := &tls.Config{ServerName: h.Host, MinVersion: cfg.TLSMin, MaxVersion: cfg.TLSMax}
	home, _ := os.UserHomeDir()
	rootFile := cfg.SSLRootCert
	if rootFile == "" && home != "" {
		if _, err := os.Stat(filepath.Join(home, ".postgresql", "root.crt")); err == nil {
			rootFile = filepath.Join(home, ".postgresql", "root.crt")
		}
	}
	mode := cfg.SSLMode
	if mode == "require" && rootFile != "" {
		mode = "verify-ca" // as libpq
	}
	if mode == "verify-ca" || mode == "verify-full" {
		var roots *x509.CertPool
		switch rootFile {
		case "system":
			var err error
			if roots, err = x509.SystemCertPool(); err != nil {
				return nil, fmt.Errorf("sslrootcert=system: %w", err)
			}
		case "":
			return nil, fmt.Errorf("sslmode=%s needs a root certificate: sslrootcert, or ~/.postgresql/root.crt", cfg.SSLMode)
		default:
			pem, err := os.ReadFile(rootFile)
			if err != nil {
				return nil, fmt.Errorf("sslrootcert: %w", err)
			}
			roots = x509.NewCertPool()
			if !roots.AppendCertsFromPEM(pem) {
				return nil, fmt.Errorf("sslrootcert %s: no PEM certificate in it", rootFile)
			}
		}
		tc.RootCAs = roots
		if mode == "verify-ca" {
			// The chain only: Go verifies the name too unless told not
			// to, and then verifies nothing; do the chain by hand.
			tc.InsecureSkipVerify = true
			tc.VerifyPeerCertificate = func(raw [][]byte, _ [][]*x509.Certificate) error {
				certs := make([]*x509.Certificate, len(raw))
				for i, r := range raw {
					c, err := x509.ParseCertificate(r)
					if err != nil {
						return err
					}
					certs[i] = c
				}
				if len(certs) == 0 {
					return errors.New("the server sent no certificate")
				}
				opts := x509.VerifyOptions{Roots: roots, Intermediates: x509.NewCertPool()}
				for _, c := range certs[1:] {
					opts.Intermediates.AddCert(c)
				}
				_, err := certs[0].Verify(opts)
				return err
			}
		}
	} else {
		tc.InsecureSkipVerify = true // prefer, allow, require: encryption, no verification
	}
	certFile, keyFile := cfg.SSLCert, cfg.SSLKey
	if certFile == "" && home != "" {
		certFile = filepath.Join(home, ".postgresql", "postgresql.crt")
	}
	if keyFile == "" && home != "" {
		keyFile = filepath.Join(home, ".postgresql", "postgresql.key")
	}
	if _, err := os.Stat(certFile); err == nil {
		pair, err := tls.LoadX509KeyPair(certFile, keyFile)
		if err != nil {
			return nil, fmt.Errorf("client certificate %s: %w", certFile, err)
		}
		tc.Certificates = []tls.Certificate{pair}
	} else if cfg.SSLCert != "" {
		return nil, fmt.Errorf("sslcert: %w", err)
	}
	return tc, nil
}

// authenticate answers the server's authentication requests until
// AuthenticationOk.
func (c *Conn) authenticate() error {
	var scram *scramClient
	scramDone := false
	for {
		t, body, err := c.receive()
		if err != nil {
			return err
		}
		switch t {
		case 'E':
			return parseError(body)
		case 'R':
		default:
			return fmt.Errorf("unexpected message %q during authentication", t)
		}
		if len(body) < 4 {
			return errors.New("short authentication request")
		}
		kind, data := binary.BigEndian.Uint32(body), body[4:]
		switch kind {
		case 0: // AuthenticationOk
			if scram != nil && !scramDone {
				// The server never proved that it knows the password.
				return errors.New("SCRAM: the server ended the exchange without its signature")
			}
			return nil
		case 3: // cleartext
			if err := c.sendPassword(c.password); err != nil {
				return err
			}
		case 5: // md5(md5(password + user) + salt)
			if len(data) < 4 {
				return errors.New("short md5 salt")
			}
			inner := md5.Sum([]byte(c.password + c.cfg.User))
			outer := md5.Sum(append([]byte(hex.EncodeToString(inner[:])), data[:4]...))
			if err := c.sendPassword("md5" + hex.EncodeToString(outer[:])); err != nil {
				return err
			}
		case 10: // SASL: the mechanisms, NUL-terminated
			if !strings.Contains("\x00"+string(data), "\x00SCRAM-SHA-256\x00") {
				return fmt.Errorf("the server offers SASL mechanisms %q, and only SCRAM-SHA-256 is supported", strings.Trim(string(data), "\x00"))
			}
			if scram != nil {
				return errors.New("SCRAM: a second SASL start")
			}
			scram = newScram(c.password)
			first := scram.first()
			c.w = c.startMessage('p')
			c.w = appendCString(c.w, "SCRAM-SHA-256")
			c.w = binary.BigEndian.AppendUint32(c.w, uint32(len(first)))
			c.w = append(c.w, first...)
			if err := c.send(); err != nil {
				return err
			}
		case 11: // SASLContinue
			if scram == nil || scram.serverSig != nil {
				return errors.New("SASL continuation out of order")
			}
			final, err := scram.final(data)
			if err != nil {
				return err
			}
			c.w = append(c.startMessage('p'), final...)
			if err := c.send(); err != nil {
				return err
			}
		case 12: // SASLFinal
			if scram == nil || scram.serverSig == nil || scramDone {
				return errors.New("SASL final out of order")
			}
			if err := scram.verify(data); err != nil {
				return err
			}
			scramDone = true
		case 2, 7, 8, 9:
			return fmt.Errorf("the server asks for Kerberos, GSSAPI or SSPI authentication (request %d), which is not supported", kind)
		default:
			return fmt.Errorf("unknown authentication request %d", kind)
		}
	}
}

func (c *Conn) sendPassword(p string) error {
	c.w = appendCString(c.startMessage('p'), p)
	return c.send()
}

// scramClient is SCRAM-SHA-256 (RFC 7677, RFC 5802) without channel binding.
type scramClient struct {
	password    []byte
	nonce       string
	clientFirst string // without the GS2 header
	serverSig   []byte
}

func newScram(password string) *scramClient {
	b := make([]byte, 18)
	_, _ = rand.Read(b)
	return &scramClient{password: []byte(password), nonce: base64.RawStdEncoding.EncodeToString(b)}
}

func (s *scramClient) first() string {
	s.clientFirst = "n=,r=" + s.nonce // the user name is the startup message's
	return "n,," + s.clientFirst
}

func (s *scramClient) final(serverFirst []byte) (string, error) {
	var nonce, salt string
	iters := 0
	for _, attr := range strings.Split(string(serverFirst), ",") {
		k, v, _ := strings.Cut(attr, "=")
		switch k {
		case "r":
			nonce = v
		case "s":
			salt = v
		case "i":
			iters, _ = strconv.Atoi(v)
		case "m":
			return "", errors.New("SCRAM: the server asks for an extension (m=), which is not supported")
		}
	}
	if iters > maxScramIterations {
		// PostgreSQL's default is 4096; a hostile server could ask for
		// minutes of CPU, which no deadline interrupts.
		return "", fmt.Errorf("SCRAM: the server asks for %d iterations, more than %d", iters, maxScramIterations)
	}
	saltBytes, err := base64.StdEncoding.DecodeString(salt)
	if err != nil || !strings.HasPrefix(nonce, s.nonce) || len(nonce) == len(s.nonce) || iters < 1 {
		return "", errors.New("SCRAM: the server's first message is not valid")
	}
	salted, err := pbkdf2.Key(sha256.New, string(s.password), saltBytes, iters, sha256.Size)
	if err != nil {
		return "", fmt.Errorf("SCRAM: %w", err)
	}
	clientKey := hmacSHA256(salted, "Client Key")
	storedKey := sha256.Sum256(clientKey)
	withoutProof := "c=biws,r=" + nonce
	authMessage := s.clientFirst + "," + string(serverFirst) + "," + withoutProof
	sig := hmacSHA256(storedKey[:], authMessage)
	proof := make([]byte, len(clientKey))
	for i := range clientKey {
		proof[i] = clientKey[i] ^ sig[i]
	}
	s.serverSig = hmacSHA256(hmacSHA256(salted, "Server Key"), authMessage)
	return withoutProof + ",p=" + base64.StdEncoding.EncodeToString(proof), nil
}

// maxScramIterations bounds the PBKDF2 work a server may ask for: about
// a second of CPU.
const maxScramIterations = 1 << 20

func (s *scramClient) verify(serverFinal []byte) error {
	v, ok := strings.CutPrefix(string(serverFinal), "v=")
	if !ok {
		return fmt.Errorf("SCRAM: the server's final message is not valid: %q", serverFinal)
	}
	sig, err := base64.StdEncoding.DecodeString(v)
	if err != nil || !hmac.Equal(sig, s.serverSig) {
		return errors.New("SCRAM: the server's signature does not match: it does not know the password")
	}
	return nil
}

func hmacSHA256(key []byte, msg string) []byte {
	m := hmac.New(sha256.New, key)
	m.Write([]byte(msg))
	return m.Sum(nil)
}

// Rows is the result of a statement: its rows' columns as text, nil for
// NULL.
type Rows [][][]byte

// Query runs one statement with the extended protocol: parameters $1, $2,
// ... are args, sent as text, typed text, int8, bool or timestamptz after
// their Go types (nil: left to the server). ctx ending closes the
// connection.
func (c *Conn) Query(ctx context.Context, sql string, args ...any) (Rows, error) {
	return c.do(ctx, func() (Rows, error) { return c.query(sql, args) })
}

// Exec runs sql, which may hold several statements, with the simple
// protocol, and returns the rows of each statement that has any.
func (c *Conn) Exec(ctx context.Context, sql string) ([]Rows, error) {
	var all []Rows
	_, err := c.do(ctx, func() (Rows, error) {
		var err error
		all, err = c.simple(sql)
		return nil, err
	})
	return all, err
}

// Ping is an empty statement.
func (c *Conn) Ping(ctx context.Context) error {
	_, err := c.Exec(ctx, "-- ping")
	return err
}

// WaitForNotification reads until a notification arrives (and is given to
// OnNotification) or ctx ends. A ctx that ends while nothing was being
// read leaves the connection usable.
func (c *Conn) WaitForNotification(ctx context.Context) error {
	if c.IsClosed() {
		return ErrClosed
	}
	fired := interrupt(ctx, c.nc)
	defer func() {
		if fired() && !c.IsClosed() {
			_ = c.nc.SetDeadline(time.Time{})
		}
	}()
	for {
		if _, err := c.r.Peek(1); err != nil {
			if ctx.Err() != nil && isTimeout(err) {
				return ctx.Err() // nothing consumed: still usable
			}
			c.Close()
			return err
		}
		t, body, err := c.receive()
		if err != nil {
			c.Close()
			if ctx.Err() != nil {
				return ctx.Err()
			}
			return err
		}
		switch t {
		case 'A':
			return nil // given to OnNotification by receive
		case 'E':
			c.Close() // FATAL: the server is closing it
			return parseError(body)
		}
	}
}

func isTimeout(err error) bool {
	var ne net.Error
	return errors.As(err, &ne) && ne.Timeout()
}

func (c *Conn) readyStatus(body []byte) {
	if len(body) > 0 {
		c.txStatus = body[0]
	}
}

// Idle reports whether the connection is open and outside any
// transaction: fit to be lent again.
func (c *Conn) Idle() bool { return !c.IsClosed() && c.txStatus == 'I' }

// IsClosed reports whether the connection was closed.
func (c *Conn) IsClosed() bool {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.closed
}

// Close sends Terminate and closes the connection.
func (c *Conn) Close() {
	c.mu.Lock()
	if c.closed {
		c.mu.Unlock()
		return
	}
	c.closed = true
	c.mu.Unlock()
	_ = c.nc.SetWriteDeadline(time.Now().Add(100 * time.Millisecond))
	_, _ = c.nc.Write([]byte{'X', 0, 0, 0, 4})
	_ = c.nc.Close()
}

// do runs fn with ctx's end interrupting its reads and writes; if it
// does, or fn fails other than with the server's error, the connection is
// closed: what is left of the exchange on the wire is unknown.
func (c *Conn) do(ctx context.Context, fn func() (Rows, error)) (Rows, error) {
	if c.IsClosed() {
		return nil, ErrClosed
	}
	if err := ctx.Err(); err != nil {
		return nil, err
	}
	fired := interrupt(ctx, c.nc)
	rows, err := fn()
	if fired() {
		if err != nil {
			c.Close()
			return nil, fmt.Errorf("%w (%v)", ctx.Err(), err)
		}
		// Done before the deadline struck: the exchange is complete.
		_ = c.nc.SetDeadline(time.Time{})
	}
	// A FATAL error is the server closing the connection (a shutdown,
	// an administrator's pg_terminate_backend).
	var pgErr *PgError
	if err != nil && (!errors.As(err, &pgErr) || pgErr.Severity == "FATAL" || pgErr.Severity == "PANIC") {
		c.Close()
	}
	return rows, err
}

func (c *Conn) query(sql string, args []any) (Rows, error) {
	// Parse (unnamed statement), with the types of int64 and bool
	// parameters; Bind (unnamed portal, text); Execute; Sync.
	c.w = c.startMessage('P')
	c.w = appendCString(appendCString(c.w, ""), sql)
	c.w = binary.BigEndian.AppendUint16(c.w, uint16(len(args)))
	for _, a := range args {
		c.w = binary.BigEndian.AppendUint32(c.w, oid(a))
	}
	c.w = c.endMessage()
	c.w = c.beginMessage('B')
	c.w = append(c.w, 0, 0, 0, 0) // portal "", statement "", no parameter formats: all text
	c.w = binary.BigEndian.AppendUint16(c.w, uint16(len(args)))
	for i, a := range args {
		v, null, err := encode(a)
		if err != nil {
			return nil, fmt.Errorf("parameter $%d: %w", i+1, err)
		}
		if null {
			c.w = binary.BigEndian.AppendUint32(c.w, 0xffffffff)
			continue
		}
		c.w = binary.BigEndian.AppendUint32(c.w, uint32(len(v)))
		c.w = append(c.w, v...)
	}
	c.w = append(c.w, 0, 0) // no result formats: all text
	c.w = c.endMessage()
	c.w = c.beginMessage('E')
	c.w = append(c.w, 0, 0, 0, 0, 0) // portal "", all rows
	c.w = c.endMessage()
	c.w = c.beginMessage('S')
	if err := c.send(); err != nil {
		return nil, err
	}
	var rows Rows
	var pgErr error
	for {
		t, body, err := c.receive()
		if err != nil {
			if pgErr != nil {
				return nil, pgErr // a FATAL error, then the server closed
			}
			return nil, err
		}
		switch t {
		case 'D':
			row, err := parseRow(body)
			if err != nil {
				return nil, err
			}
			rows = append(rows, row)
		case 'E':
			pgErr = parseError(body)
		case 'Z':
			c.readyStatus(body)
			return rows, pgErr
		}
	}
}

func (c *Conn) simple(sql string) ([]Rows, error) {
	c.w = appendCString(c.startMessage('Q'), sql)
	if err := c.send(); err != nil {
		return nil, err
	}
	var all []Rows
	var cur Rows
	var pgErr error
	for {
		t, body, err := c.receive()
		if err != nil {
			if pgErr != nil {
				return nil, pgErr
			}
			return nil, err
		}
		switch t {
		case 'D':
			row, err := parseRow(body)
			if err != nil {
				return nil, err
			}
			cur = append(cur, row)
		case 'C', 'I':
			all, cur = append(all, cur), nil
		case 'E':
			pgErr = parseError(body)
		case 'Z':
			c.readyStatus(body)
			return all, pgErr
		}
	}
}

// oid is the type sent for a parameter, after its Go type; 0 (nil, []byte)
// leaves it to the server to infer.
func oid(a any) uint32 {
	switch a.(type) {
	case int64, int, int32, uint64:
		return 20 // int8
	case bool:
		return 16
	case string:
		return 25 // text
	case time.Time, NullTime:
		return 1184 // timestamptz
	}
	return 0
}

// encode is a parameter as text; nil, a nil *time.Time and a zero
// NullTime are NULL.
func encode(a any) (v []byte, null bool, err error) {
	switch x := a.(type) {
	case nil:
		return nil, true, nil
	case string:
		return []byte(x), false, nil
	case []byte:
		return x, x == nil, nil
	case int64:
		return strconv.AppendInt(nil, x, 10), false, nil
	case int:
		return strconv.AppendInt(nil, int64(x), 10), false, nil
	case int32:
		return strconv.AppendInt(nil, int64(x), 10), false, nil
	case uint64:
		return strconv.AppendUint(nil, x, 10), false, nil
	case bool:
		if x {
			return []byte("true"), false, nil
		}
		return []byte("false"), false, nil
	case time.Time:
		return x.UTC().AppendFormat(nil, "2006-01-02 15:04:05.999999Z07:00"), false, nil
	case NullTime:
		if !x.Valid {
			return nil, true, nil
		}
		return encode(x.Time)
	}
	return nil, false, fmt.Errorf("cannot send a %T", a)
}

// NullTime is a timestamptz that may be NULL.
type NullTime struct {
	Time  time.Time
	Valid bool
}

// Scan sets each dest from row's columns in order: *string, *int64,
// *int, *bool, *time.Time (timestamptz) and *NullTime. NULL is only
// accepted by *NullTime, and by *string (as "").
func Scan(row [][]byte, dest ...any) error {
	if len(row) != len(dest) {
		return fmt.Errorf("%d columns for %d destinations", len(row), len(dest))
	}
	for i, d := range dest {
		v := row[i]
		if v == nil {
			switch x := d.(type) {
			case *NullTime:
				*x = NullTime{}
				continue
			case *string:
				*x = ""
				continue
			}
			return fmt.Errorf("column %d is NULL", i+1)
		}
		var err error
		switch x := d.(type) {
		case *string:
			*x = string(v)
		case *int64:
			*x, err = strconv.ParseInt(string(v), 10, 64)
		case *int:
			var n int64
			n, err = strconv.ParseInt(string(v), 10, 64)
			*x = int(n)
		case *bool:
			switch string(v) {
			case "t":
				*x = true
			case "f":
				*x = false
			default:
				err = fmt.Errorf("%q is not a boolean", v)
			}
		case *time.Time:
			*x, err = parseTimestamptz(string(v))
		case *NullTime:
			var t time.Time
			t, err = parseTimestamptz(string(v))
			*x = NullTime{Time: t, Valid: err == nil}
		default:
			err = fmt.Errorf("cannot scan into %T", d)
		}
		if err != nil {
			return fmt.Errorf("column %d: %w", i+1, err)
		}
	}
	return nil
}

// parseTimestamptz reads timestamptz's ISO output: 2026-12-02
// 00:51:02.123456+00, the offset possibly with minutes and seconds.
func parseTimestamptz(s string) (time.Time, error) {
	i := strings.LastIndexAny(s, "+-")
	if i < len("2006-01-02 15:04:05") {
		return time.Time{}, fmt.Errorf("timestamptz %q: want DateStyle ISO", s)
	}
	t, err := time.Parse("2006-01-02 15:04:05.999999", s[:i])
	if err != nil {
		return time.Time{}, fmt.Errorf("timestamptz %q: %w", s, err)
	}
	sign := 1
	if s[i] == '-' {
		sign = -1
	}
	offset := 0
	for j, part := range strings.Split(s[i+1:], ":") {
		n, err := strconv.Atoi(part)
		if err != nil || j > 2 {
			return time.Time{}, fmt.Errorf("timestamptz %q: bad offset", s)
		}
		offset += n * []int{3600, 60, 1}[j]
	}
	return t.Add(-time.Duration(sign*offset) * time.Second).UTC(), nil
}

func parseRow(body []byte) ([][]byte, error) {
	if len(body) < 2 {
		return nil, errors.New("short data row")
	}
	n := int(binary.BigEndian.Uint16(body))
	body = body[2:]
	row := make([][]byte, n)
	for i := range row {
		if len(body) < 4 {
			return nil, errors.New("short data row")
		}
		l := int32(binary.BigEndian.Uint32(body))
		body = body[4:]
		if l < 0 {
			continue
		}
		if int(l) > len(body) {
			return nil, errors.New("short data row")
		}
		row[i] = body[:l:l]
		body = body[l:]
	}
	return row, nil
}

func parseError(body []byte) error {
	e := &PgError{}
	for len(body) > 1 {
		field := body[0]
		end := 1
		for end < len(body) && body[end] != 0 {
			end++
		}
		v := string(body[1:end])
		switch field {
		case 'V':
			e.Severity = v
		case 'S':
			if e.Severity == "" {
				e.Severity = v
			}
		case 'C':
			e.Code = v
		case 'M':
			e.Message = v
		case 'D':
			e.Detail = v
		case 'H':
			e.Hint = v
		}
		if end >= len(body) {
			break
		}
		body = body[end+1:]
	}
	return e
}

// receive reads one message; notifications go to OnNotification, notices
// and parameter statuses are dropped. The body is valid until the next
// receive.
func (c *Conn) receive() (byte, []byte, error) {
	for {
		var head [5]byte
		if _, err := io.ReadFull(c.r, head[:]); err != nil {
			return 0, nil, err
		}
		n := int(binary.BigEndian.Uint32(head[1:])) - 4
		if n < 0 || n > 64<<20 {
			return 0, nil, fmt.Errorf("message %q of %d bytes", head[0], n)
		}
		body := make([]byte, n)
		if _, err := io.ReadFull(c.r, body); err != nil {
			return 0, nil, err
		}
		switch head[0] {
		case 'N', 'S', 'K':
			continue // notice, parameter status, backend key data
		case 'A':
			if c.OnNotification != nil && len(body) >= 4 {
				channel, payload, _ := strings.Cut(string(body[4:]), "\x00")
				c.OnNotification(&Notification{PID: binary.BigEndian.Uint32(body), Channel: channel, Payload: strings.TrimSuffix(payload, "\x00")})
			}
		}
		return head[0], body, nil
	}
}

func (c *Conn) startMessage(t byte) []byte { return append(c.w[:0], t, 0, 0, 0, 0) }

// beginMessage starts another message after those already in c.w.
func (c *Conn) beginMessage(t byte) []byte { return append(c.w, t, 0, 0, 0, 0) }

// endMessage sets the length of the last message in c.w: the one that
// starts after the previous messages, found by walking them.
func (c *Conn) endMessage() []byte {
	start := 0
	for {
		if start+5 > len(c.w) {
			break
		}
		l := int(binary.BigEndian.Uint32(c.w[start+1:]))
		if l == 0 { // the open one
			binary.BigEndian.PutUint32(c.w[start+1:], uint32(len(c.w)-start-1))
			break
		}
		start += 1 + l
	}
	return c.w
}

// send closes the last message and writes all of c.w.
func (c *Conn) send() error {
	c.w = c.endMessage()
	return c.flush()
}

func (c *Conn) flush() error {
	_, err := c.nc.Write(c.w)
	return err
}

func appendCString(b []byte, s string) []byte { return append(append(b, s...), 0) }
