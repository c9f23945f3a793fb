// Package consulapi is the part of Consul's HTTP API that leaderrun uses,
// with the names, configuration and behaviour of Consul's Go client
// (github.com/hashicorp/consul/api): its configuration from the same
// environment variables, the same token precedence, the same answers for
// missing keys and sessions, the same errors. It exists because that
// client, with the logging, metrics and mapping libraries it brings, was
// the largest dependency left in every leaderrun binary, whatever the
// store (docs/performance.md); this is net/http and encoding/json only.
//
// Only what backends/consul and cmd call is here.
package consulapi

import (
	"bytes"
	"context"
	"crypto/tls"
	"crypto/x509"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/url"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"time"
)

// The environment variables that DefaultConfig reads, as the consul CLI.
const (
	HTTPAddrEnvName      = "CONSUL_HTTP_ADDR"
	HTTPTokenEnvName     = "CONSUL_HTTP_TOKEN"
	HTTPTokenFileEnvName = "CONSUL_HTTP_TOKEN_FILE"
	HTTPAuthEnvName      = "CONSUL_HTTP_AUTH"
	HTTPSSLEnvName       = "CONSUL_HTTP_SSL"
	HTTPCAFile           = "CONSUL_CACERT"
	HTTPCAPath           = "CONSUL_CAPATH"
	HTTPClientCert       = "CONSUL_CLIENT_CERT"
	HTTPClientKey        = "CONSUL_CLIENT_KEY"
	HTTPTLSServerName    = "CONSUL_TLS_SERVER_NAME"
	HTTPSSLVerifyEnvName = "CONSUL_HTTP_SSL_VERIFY"
	HTTPNamespaceEnvName = "CONSUL_NAMESPACE"
	HTTPPartitionEnvName = "CONSUL_PARTITION"
)

// Config says how to reach an agent. The zero value of each field takes
// DefaultConfig's in NewClient.
type Config struct {
	// Address is host:port, or a URL: http://host:port[/prefix],
	// https://host:port[/prefix] or unix:///path/to/socket.
	Address string
	// Scheme is http or https.
	Scheme string
	// PathPrefix is prepended to every request path (a reverse proxy's).
	PathPrefix string
	// Token is the ACL token; TokenFile a file holding it (see NewClient
	// for which wins).
	Token, TokenFile string
	// HttpAuth is HTTP basic authentication, nil for none.
	HttpAuth *HttpBasicAuth
	// TLSConfig configures https.
	TLSConfig TLSConfig
	// Namespace and Partition are Consul Enterprise's; empty for none.
	Namespace, Partition string
	// HttpClient is the client used; NewClient builds it.
	HttpClient *http.Client
}

// HttpBasicAuth is a user name and password.
type HttpBasicAuth struct {
	Username, Password string
}

// TLSConfig names the files of a TLS client configuration.
type TLSConfig struct {
	// Address is the server name to verify, host or host:port.
	Address string
	// CAFile is a PEM bundle of CA certificates; CAPath a directory of
	// them. Neither: the system's roots.
	CAFile, CAPath string
	// CertFile and KeyFile are the client certificate and its key.
	CertFile, KeyFile string
	// InsecureSkipVerify accepts any server certificate.
	InsecureSkipVerify bool
}

// DefaultConfig is localhost:8500 over http, with what the environment
// variables above say.
func DefaultConfig() *Config {
	c := &Config{Address: "localhost:8500", Scheme: "http"}
	if v := os.Getenv(HTTPAddrEnvName); v != "" {
		c.Address = v
	}
	if v := os.Getenv(HTTPTokenFileEnvName); v != "" {
		c.TokenFile = v
	}
	if v := os.Getenv(HTTPTokenEnvName); v != "" {
		c.Token = v
	}
	if v := os.Getenv(HTTPAuthEnvName); v != "" {
		user, pass, _ := strings.Cut(v, ":")
		c.HttpAuth = &HttpBasicAuth{Username: user, Password: pass}
	}
	if v := os.Getenv(HTTPSSLEnvName); v != "" {
		if on, _ := strconv.ParseBool(v); on {
			c.Scheme = "https"
		}
	}
	c.TLSConfig.Address = os.Getenv(HTTPTLSServerName)
	c.TLSConfig.CAFile = os.Getenv(HTTPCAFile)
	c.TLSConfig.CAPath = os.Getenv(HTTPCAPath)
	c.TLSConfig.CertFile = os.Getenv(HTTPClientCert)
	c.TLSConfig.KeyFile = os.Getenv(HTTPClientKey)
	if v := os.Getenv(HTTPSSLVerifyEnvName); v != "" {
		if verify, err := strconv.ParseBool(v); err == nil && !verify {
			c.TLSConfig.InsecureSkipVerify = true
		}
	}
	c.Namespace = os.Getenv(HTTPNamespaceEnvName)
	c.Partition = os.Getenv(HTTPPartitionEnvName)
	return c
}

// Client talks to one agent.
type Client struct {
	config Config
}

// NewClient fills what config leaves empty from DefaultConfig and builds
// the HTTP client. The token's precedence is the consul CLI's: a token
// file given in config (not the variable's), then a token given in config
// (not the variable's), then CONSUL_HTTP_TOKEN_FILE, then
// CONSUL_HTTP_TOKEN.
func NewClient(config *Config) (*Client, error) {
	def := DefaultConfig()
	if config.Address == "" {
		config.Address = def.Address
	}
	if config.Scheme == "" {
		config.Scheme = def.Scheme
	}
	if config.HttpAuth == nil {
		config.HttpAuth = def.HttpAuth
	}
	t, d := &config.TLSConfig, def.TLSConfig
	for _, f := range []struct {
		v *string
		d string
	}{
		{&t.Address, d.Address}, {&t.CAFile, d.CAFile}, {&t.CAPath, d.CAPath}, {&t.CertFile, d.CertFile}, {&t.KeyFile, d.KeyFile},
	} {
		if *f.v == "" {
			*f.v = f.d
		}
	}
	t.InsecureSkipVerify = t.InsecureSkipVerify || d.InsecureSkipVerify
	if config.Namespace == "" {
		config.Namespace = def.Namespace
	}
	if config.Partition == "" {
		config.Partition = def.Partition
	}
	var unixPath string
	if scheme, rest, ok := strings.Cut(config.Address, "://"); ok {
		switch scheme {
		case "http":
		case "https":
			config.Scheme = "https"
		case "unix":
			unixPath = rest
		default:
			return nil, fmt.Errorf("Unknown protocol scheme: %s", scheme)
		}
		config.Address = rest
		if scheme == "http" || scheme == "https" {
			if host, prefix, ok := strings.Cut(rest, "/"); ok {
				config.Address, config.PathPrefix = host, "/"+prefix
			}
		}
	}
	if config.HttpClient == nil {
		tlsCfg, err := setupTLS(&config.TLSConfig)
		if err != nil {
			return nil, err
		}
		dialer := &net.Dialer{Timeout: 30 * time.Second, KeepAlive: 30 * time.Second}
		tr := &http.Transport{
			Proxy:               http.ProxyFromEnvironment,
			DialContext:         dialer.DialContext,
			TLSClientConfig:     tlsCfg,
			TLSHandshakeTimeout: 10 * time.Second,
			IdleConnTimeout:     90 * time.Second,
			MaxIdleConnsPerHost: 4,
			ForceAttemptHTTP2:   true,
		}
		if unixPath != "" {
			tr.Proxy = nil
			tr.DialContext = func(ctx context.Context, _, _ string) (net.Conn, error) {
				return dialer.DialContext(ctx, "unix", unixPath)
			}
		}
		config.HttpClient = &http.Client{Transport: tr}
	}
	switch {
	case config.TokenFile != "" && config.TokenFile != def.TokenFile:
		token, err := readToken(config.TokenFile)
		if err != nil {
			return nil, err
		}
		if token != "" {
			config.Token = token
		}
	case config.Token != "" && config.Token != def.Token:
	case def.TokenFile != "":
		token, err := readToken(def.TokenFile)
		if err != nil {
			return nil, err
		}
		if token != "" {
			config.Token, config.TokenFile = token, def.TokenFile
		}
	default:
		config.Token = def.Token
	}
	return &Client{config: *config}, nil
}

func readToken(file string) (string, error) {
	data, err := os.ReadFile(file)
	if err != nil {
		return "", fmt.Errorf("Error loading token file %s : %s", file, err)
	}
	return strings.TrimSpace(string(data)), nil
}

// setupTLS builds the TLS client configuration: the server name from
// Address, the client certificate, the CAs of CAFile or every PEM file in
// CAPath.
func setupTLS(t *TLSConfig) (*tls.Config, error) {
	cfg := &tls.Config{InsecureSkipVerify: t.InsecureSkipVerify}
	if server := t.Address; server != "" {
		if strings.LastIndex(server, ":") > strings.LastIndex(server, "]") {
			host, _, err := net.SplitHostPort(server)
			if err != nil {
				return nil, err
			}
			server = host
		}
		cfg.ServerName = server
	}
	switch {
	case t.CertFile != "" && t.KeyFile != "":
		cert, err := tls.LoadX509KeyPair(t.CertFile, t.KeyFile)
		if err != nil {
			return nil, err
		}
		cfg.Certificates = []tls.Certificate{cert}
	case t.CertFile != "" || t.KeyFile != "":
		return nil, errors.New("both client cert and client key must be provided")
	}
	if t.CAFile == "" && t.CAPath == "" {
		return cfg, nil
	}
	pool := x509.NewCertPool()
	files := []string{t.CAFile}
	if t.CAFile == "" {
		err := filepath.WalkDir(t.CAPath, func(path string, d os.DirEntry, err error) error {
			if err == nil && !d.IsDir() {
				files = append(files, path)
			}
			return err
		})
		if err != nil {
			return nil, err
		}
		files = files[1:]
	}
	for _, f := range files {
		pem, err := os.ReadFile(f)
		if err != nil {
			return nil, fmt.Errorf("Error loading %s: %s", f, err)
		}
		if !pool.AppendCertsFromPEM(pem) {
			return nil, fmt.Errorf("Error loading CA File: Couldn't parse PEM in: %s", f)
		}
	}
	cfg.RootCAs = pool
	return cfg, nil
}

// HTTPClient is the client's HTTP client (to close its idle connections).
func (c *Client) HTTPClient() *http.Client { return c.config.HttpClient }

// StatusError is an answer with an unexpected HTTP status.
type StatusError struct {
	Code int
	Body string
}

func (e StatusError) Error() string {
	return fmt.Sprintf("Unexpected response code: %d (%s)", e.Code, e.Body)
}

// QueryOptions tune a read.
type QueryOptions struct {
	// RequireConsistent asks for a read through the Raft leader.
	RequireConsistent bool
	// WaitIndex and WaitTime make a blocking query: it returns once the
	// index passes WaitIndex, or after WaitTime.
	WaitIndex uint64
	WaitTime  time.Duration
	ctx       context.Context
}

// WithContext returns a copy of q whose requests end with ctx.
func (q *QueryOptions) WithContext(ctx context.Context) *QueryOptions {
	c := *q
	c.ctx = ctx
	return &c
}

// WriteOptions tune a write.
type WriteOptions struct {
	ctx context.Context
}

// WithContext returns a copy of w whose requests end with ctx.
func (w *WriteOptions) WithContext(ctx context.Context) *WriteOptions {
	c := *w
	c.ctx = ctx
	return &c
}

// QueryMeta is what a read's answer says besides its body.
type QueryMeta struct {
	// LastIndex is X-Consul-Index, for the next blocking query.
	LastIndex uint64
	// ResultsFilteredByACLs says that the token's ACLs left some out.
	ResultsFilteredByACLs bool
}

// WriteMeta is what a write's answer says besides its body.
type WriteMeta struct{}

// request is one HTTP request to the agent.
type request struct {
	method, path string
	params       url.Values
	body         io.Reader
	contentType  string
	ctx          context.Context
}

func (c *Client) newRequest(method, path string) *request {
	r := &request{method: method, path: path, params: url.Values{}, ctx: context.Background()}
	if c.config.Namespace != "" {
		r.params.Set("ns", c.config.Namespace)
	}
	if c.config.Partition != "" {
		r.params.Set("partition", c.config.Partition)
	}
	return r
}

func (r *request) query(q *QueryOptions) *request {
	if q == nil {
		return r
	}
	if q.RequireConsistent {
		r.params.Set("consistent", "")
	}
	if q.WaitIndex != 0 {
		r.params.Set("index", strconv.FormatUint(q.WaitIndex, 10))
	}
	if q.WaitTime != 0 {
		r.params.Set("wait", fmt.Sprintf("%dms", max(q.WaitTime.Milliseconds(), 1)))
	}
	if q.ctx != nil {
		r.ctx = q.ctx
	}
	return r
}

func (r *request) write(w *WriteOptions) *request {
	if w != nil && w.ctx != nil {
		r.ctx = w.ctx
	}
	return r
}

// do sends r and returns the response, whatever its status.
func (c *Client) do(r *request) (*http.Response, error) {
	u := url.URL{Scheme: c.config.Scheme, Host: c.config.Address, Path: c.config.PathPrefix + r.path, RawQuery: r.params.Encode()}
	if strings.HasPrefix(u.Host, "/") {
		u.Host = "localhost" // a unix socket
	}
	req, err := http.NewRequestWithContext(r.ctx, r.method, u.String(), r.body)
	if err != nil {
		return nil, err
	}
	if r.body != nil {
		req.Header.Set("Content-Type", r.contentType)
	}
	if c.config.Token != "" {
		req.Header.Set("X-Consul-Token", c.config.Token)
	}
	if a := c.config.HttpAuth; a != nil {
		req.SetBasicAuth(a.Username, a.Password)
	}
	return c.config.HttpClient.Do(req)
}

// require returns a StatusError, with the body, unless resp has one of
// codes.
func require(resp *http.Response, codes ...int) error {
	for _, code := range codes {
		if resp.StatusCode == code {
			return nil
		}
	}
	data, _ := io.ReadAll(io.LimitReader(resp.Body, 64<<10))
	resp.Body.Close()
	return StatusError{Code: resp.StatusCode, Body: strings.TrimSpace(string(data))}
}

func queryMeta(resp *http.Response) *QueryMeta {
	m := &QueryMeta{ResultsFilteredByACLs: resp.Header.Get("X-Consul-Results-Filtered-By-ACLs") == "true"}
	m.LastIndex, _ = strconv.ParseUint(resp.Header.Get("X-Consul-Index"), 10, 64)
	return m
}

// get reads path into out; a 404 leaves out alone when notFoundOK.
func (c *Client) get(path string, params url.Values, q *QueryOptions, out any, notFoundOK bool) (*QueryMeta, error) {
	r := c.newRequest("GET", path).query(q)
	for k, v := range params {
		r.params[k] = v
	}
	resp, err := c.do(r)
	if err != nil {
		return nil, err
	}
	codes := []int{200}
	if notFoundOK {
		codes = append(codes, 404)
	}
	if err := require(resp, codes...); err != nil {
		return nil, err
	}
	defer resp.Body.Close()
	meta := queryMeta(resp)
	if resp.StatusCode == 404 {
		return meta, nil
	}
	if err := json.NewDecoder(resp.Body).Decode(out); err != nil {
		return nil, err
	}
	return meta, nil
}

// put writes body (JSON of in, or raw bytes) to path, requires a 200 and
// decodes the answer into out (nil: none) or returns it as text.
func (c *Client) put(method, path string, params url.Values, in any, raw []byte, w *WriteOptions, out any) (string, error) {
	r := c.newRequest(method, path).write(w)
	for k, v := range params {
		r.params[k] = v
	}
	switch {
	case raw != nil:
		r.body, r.contentType = bytes.NewReader(raw), "application/octet-stream"
	case in != nil:
		data, err := json.Marshal(in)
		if err != nil {
			return "", err
		}
		r.body, r.contentType = bytes.NewReader(data), "application/json; charset=utf-8"
	}
	resp, err := c.do(r)
	if err != nil {
		return "", err
	}
	if err := require(resp, 200); err != nil {
		return "", err
	}
	defer resp.Body.Close()
	if out != nil {
		return "", json.NewDecoder(resp.Body).Decode(out)
	}
	data, err := io.ReadAll(resp.Body)
	return string(data), err
}

// Raw gives access to arbitrary endpoints.
func (c *Client) Raw() *Raw { return &Raw{c} }

// Raw is Client.Raw.
type Raw struct{ c *Client }

// Write PUTs in, as JSON, to endpoint and decodes the answer into out.
func (r *Raw) Write(endpoint string, in, out any, w *WriteOptions) (*WriteMeta, error) {
	_, err := r.c.put("PUT", endpoint, nil, in, nil, w, out)
	if err != nil {
		return nil, err
	}
	return &WriteMeta{}, nil
}
