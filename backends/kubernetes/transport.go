package kubernetes

import (
	"crypto/tls"
	"crypto/x509"
	"errors"
	"fmt"
	"net"
	"net/http"
	"net/url"
	"os"
	"strings"
	"sync"
	"time"
)

// Connection settings. client-go uses 30 s for the dial, keep-alive and
// idle pings; leaderrun's timings are seconds, so notice a dead link sooner.
const (
	dialTimeout      = 5 * time.Second
	tcpKeepAlive     = 15 * time.Second
	handshakeTimeout = 10 * time.Second
	// An HTTP/2 connection that received nothing for pingAfter is pinged,
	// and closed if no answer comes within pingTimeout; requests then go
	// over a new one. A watch is silent between changes, so this is what
	// notices a connection that died without a reset.
	pingAfter   = 10 * time.Second
	pingTimeout = 5 * time.Second
)

// newClient builds the REST client for cfg: TLS, proxy and credentials.
func newClient(cfg *APIConfig) (*client, error) {
	server := cfg.Server
	if !strings.Contains(server, "://") {
		server = "https://" + server // kubectl takes a bare host:port as https
	}
	u, err := url.Parse(server)
	if err != nil || u.Host == "" || (u.Scheme != "https" && u.Scheme != "http") {
		return nil, fmt.Errorf("kubernetes: server %q of %s: want https://host:port", redactURL(cfg.Server), cfg.Source)
	}
	u.User = nil // never sent, never shown
	tlsConf, err := tlsConfig(cfg)
	if err != nil {
		return nil, err
	}
	creds, err := newCredentials(cfg)
	if err != nil {
		return nil, err
	}
	if creds.certs != nil {
		tlsConf.GetClientCertificate = creds.certs.get
	}
	proxy := http.ProxyFromEnvironment
	if cfg.ProxyURL != "" {
		p, err := url.Parse(cfg.ProxyURL)
		if err != nil || p.Host == "" {
			return nil, fmt.Errorf("kubernetes: proxy-url %q of %s: want scheme://host:port", redactURL(cfg.ProxyURL), cfg.Source)
		}
		proxy = http.ProxyURL(p)
	}
	base := &http.Transport{
		Proxy:               proxy,
		DialContext:         (&net.Dialer{Timeout: dialTimeout, KeepAlive: tcpKeepAlive}).DialContext,
		TLSClientConfig:     tlsConf,
		TLSHandshakeTimeout: handshakeTimeout,
		ForceAttemptHTTP2:   true,
		MaxIdleConnsPerHost: 4,
		IdleConnTimeout:     90 * time.Second,
		HTTP2:               &http.HTTP2Config{SendPingTimeout: pingAfter, PingTimeout: pingTimeout},
	}
	return &client{
		server: u,
		host:   u.Scheme + "://" + u.Host + strings.TrimSuffix(u.Path, "/"),
		http:   &http.Client{Transport: &authTransport{base: base, creds: creds}},
	}, nil
}

// redactURL drops user information from a URL for messages.
func redactURL(s string) string {
	u, err := url.Parse(s)
	if err != nil || u.User == nil {
		return s
	}
	u.User = nil
	return u.String()
}

func tlsConfig(cfg *APIConfig) (*tls.Config, error) {
	conf := &tls.Config{ServerName: cfg.TLSServerName, InsecureSkipVerify: cfg.Insecure, MinVersion: tls.VersionTLS12}
	ca := cfg.CAData
	if cfg.CAFile != "" {
		data, err := os.ReadFile(cfg.CAFile)
		if err != nil {
			return nil, fmt.Errorf("kubernetes: certificate-authority of %s: %w", cfg.Source, err)
		}
		ca = append(append([]byte{}, ca...), data...)
	}
	if len(ca) == 0 {
		return conf, nil
	}
	if cfg.Insecure {
		// kubectl refuses the combination too: which of the two was meant?
		return nil, fmt.Errorf("kubernetes: %s sets both a certificate authority and insecure-skip-tls-verify", cfg.Source)
	}
	pool := x509.NewCertPool()
	if !pool.AppendCertsFromPEM(ca) {
		return nil, fmt.Errorf("kubernetes: certificate authority of %s holds no PEM certificate", cfg.Source)
	}
	conf.RootCAs = pool
	return conf, nil
}

// credentials are who the client is: at most one of a bearer token (static,
// from a file, or from an exec plugin) and basic authentication, plus a
// client certificate, plus impersonation.
type credentials struct {
	token     string
	tokenFile *fileToken
	exec      *execPlugin
	basic     *url.Userinfo
	certs     *certSource

	impersonate, impersonateUID string
	impersonateGroups           []string
}

func newCredentials(cfg *APIConfig) (*credentials, error) {
	c := &credentials{
		token:          cfg.Token,
		impersonate:    cfg.Impersonate,
		impersonateUID: cfg.ImpersonateUID, impersonateGroups: cfg.ImpersonateGroups,
	}
	if cfg.TokenFile != "" {
		c.tokenFile = &fileToken{path: cfg.TokenFile}
		if _, err := c.tokenFile.get(); err != nil {
			return nil, fmt.Errorf("kubernetes: tokenFile of %s: %w", cfg.Source, err)
		}
	}
	if cfg.Username != "" || cfg.Password != "" {
		c.basic = url.UserPassword(cfg.Username, cfg.Password)
	}
	hasToken := cfg.Token != "" || cfg.TokenFile != ""
	if hasToken && c.basic != nil {
		return nil, fmt.Errorf("kubernetes: %s sets both a token and a username/password; want one", cfg.Source)
	}
	hasCert := len(cfg.CertData) > 0 || cfg.CertFile != ""
	hasKey := len(cfg.KeyData) > 0 || cfg.KeyFile != ""
	if hasCert != hasKey {
		return nil, fmt.Errorf("kubernetes: %s sets a client certificate without its key, or a key without its certificate", cfg.Source)
	}
	if cfg.Exec != nil {
		if hasToken || c.basic != nil || hasCert {
			return nil, fmt.Errorf("kubernetes: %s sets an exec plugin and also a token, password or client certificate; want one", cfg.Source)
		}
		p, err := newExecPlugin(cfg)
		if err != nil {
			return nil, err
		}
		c.exec = p
		c.certs = &certSource{exec: p}
	}
	if hasCert {
		cs := &certSource{certFile: cfg.CertFile, keyFile: cfg.KeyFile, certData: cfg.CertData, keyData: cfg.KeyData}
		if _, err := cs.load(); err != nil {
			return nil, fmt.Errorf("kubernetes: client certificate of %s: %w", cfg.Source, err)
		}
		c.certs = cs
	}
	return c, nil
}

// authTransport adds the credentials to every request. On 401 it refreshes
// a credential that can change (an exec plugin's, a token file's) and
// sends the request once more, as client-go does: a token may be revoked
// or rotated before the time it said it would expire.
type authTransport struct {
	base  http.RoundTripper
	creds *credentials
}

func (t *authTransport) RoundTrip(req *http.Request) (*http.Response, error) {
	token, err := t.creds.bearer(req)
	if err != nil {
		return nil, err
	}
	resp, err := t.base.RoundTrip(t.creds.authorize(req, token))
	if err != nil || resp.StatusCode != http.StatusUnauthorized || (req.Body != nil && req.GetBody == nil) {
		return resp, err
	}
	if !t.creds.invalidate(token) {
		return resp, nil
	}
	retry := req
	if req.GetBody != nil {
		body, err := req.GetBody()
		if err != nil {
			return resp, nil
		}
		retry = req.Clone(req.Context())
		retry.Body = body
	}
	token, err = t.creds.bearer(req)
	if err != nil {
		return resp, nil
	}
	resp.Body.Close()
	return t.base.RoundTrip(t.creds.authorize(retry, token))
}

// bearer is the token to send, "" for none.
func (c *credentials) bearer(req *http.Request) (string, error) {
	switch {
	case c.exec != nil:
		cred, err := c.exec.get(req.Context())
		if err != nil {
			return "", err
		}
		return cred.token, nil
	case c.tokenFile != nil:
		return c.tokenFile.get()
	}
	return c.token, nil
}

// authorize is a copy of req with the credentials' headers.
func (c *credentials) authorize(req *http.Request, token string) *http.Request {
	r := req.Clone(req.Context())
	switch {
	case token != "":
		r.Header.Set("Authorization", "Bearer "+token)
	case c.basic != nil:
		pw, _ := c.basic.Password()
		r.SetBasicAuth(c.basic.Username(), pw)
	}
	if c.impersonate != "" {
		r.Header.Set("Impersonate-User", c.impersonate)
		if c.impersonateUID != "" {
			r.Header.Set("Impersonate-Uid", c.impersonateUID)
		}
		for _, g := range c.impersonateGroups {
			r.Header.Add("Impersonate-Group", g)
		}
	}
	return r
}

// invalidate forgets token if it came from a source that may now have a
// newer one, and reports whether a retry could send something else.
func (c *credentials) invalidate(token string) bool {
	switch {
	case c.exec != nil:
		return c.exec.invalidate(token)
	case c.tokenFile != nil:
		fresh, err := c.tokenFile.reload()
		return err == nil && fresh != token
	}
	return false
}

// fileToken is a bearer token read from a file, and read again whenever
// the file changes: the kubelet rotates a projected service-account token
// by swapping a symlink, which a stat sees as another file.
type fileToken struct {
	path string

	mu    sync.Mutex
	token string
	stat  os.FileInfo
}

// get returns the file's token, reading it again if the file changed. If
// the file cannot be read any more, the last token read is used, as
// client-go does, so that a rotation caught half-way does not fail a
// renewal.
func (f *fileToken) get() (string, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	fi, err := os.Stat(f.path)
	if err == nil && f.stat != nil && os.SameFile(fi, f.stat) && fi.ModTime().Equal(f.stat.ModTime()) && fi.Size() == f.stat.Size() {
		return f.token, nil
	}
	if err == nil {
		err = f.read(fi)
	}
	if err != nil && f.token == "" {
		return "", err
	}
	return f.token, nil
}

// reload reads the file now.
func (f *fileToken) reload() (string, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	fi, err := os.Stat(f.path)
	if err == nil {
		err = f.read(fi)
	}
	return f.token, err
}

func (f *fileToken) read(fi os.FileInfo) error {
	data, err := os.ReadFile(f.path)
	if err != nil {
		return err
	}
	token := strings.TrimSpace(string(data))
	if token == "" {
		return fmt.Errorf("token file %s is empty", f.path)
	}
	f.token, f.stat = token, fi
	return nil
}

// certSource is the client certificate presented in each TLS handshake:
// from data, from files read again when they change, or from an exec
// plugin.
type certSource struct {
	certFile, keyFile string
	certData, keyData []byte
	exec              *execPlugin

	mu       sync.Mutex
	cert     *tls.Certificate
	certStat os.FileInfo
	keyStat  os.FileInfo
}

func (s *certSource) get(info *tls.CertificateRequestInfo) (*tls.Certificate, error) {
	if s.exec != nil {
		cred, err := s.exec.get(info.Context())
		if err != nil {
			return nil, err
		}
		if cred.cert == nil {
			return &tls.Certificate{}, nil // a token plugin: no certificate
		}
		return cred.cert, nil
	}
	return s.load()
}

// load returns the certificate, reading the files again if they changed.
func (s *certSource) load() (*tls.Certificate, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	certPEM, keyPEM := s.certData, s.keyData
	if s.certFile != "" || s.keyFile != "" {
		cs, cerr := statIfSet(s.certFile)
		ks, kerr := statIfSet(s.keyFile)
		if err := errors.Join(cerr, kerr); err != nil {
			if s.cert != nil {
				return s.cert, nil
			}
			return nil, err
		}
		if s.cert != nil && sameStat(cs, s.certStat) && sameStat(ks, s.keyStat) {
			return s.cert, nil
		}
		var err error
		if s.certFile != "" {
			if certPEM, err = os.ReadFile(s.certFile); err != nil {
				return nil, err
			}
		}
		if s.keyFile != "" {
			if keyPEM, err = os.ReadFile(s.keyFile); err != nil {
				return nil, err
			}
		}
		s.certStat, s.keyStat = cs, ks
	} else if s.cert != nil {
		return s.cert, nil
	}
	cert, err := tls.X509KeyPair(certPEM, keyPEM)
	if err != nil {
		return nil, err
	}
	s.cert = &cert
	return s.cert, nil
}

func statIfSet(p string) (os.FileInfo, error) {
	if p == "" {
		return nil, nil
	}
	return os.Stat(p)
}

func sameStat(a, b os.FileInfo) bool {
	if a == nil || b == nil {
		return a == nil && b == nil
	}
	return os.SameFile(a, b) && a.ModTime().Equal(b.ModTime()) && a.Size() == b.Size()
}
