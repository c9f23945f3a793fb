package consulapi

import (
	"context"
	"encoding/pem"
	"errors"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"strings"
	"testing"
)

// TestTokenPrecedence: the consul CLI's order: a token file given in the
// config, then a token given in the config, then CONSUL_HTTP_TOKEN_FILE,
// then CONSUL_HTTP_TOKEN.
func TestTokenPrecedence(t *testing.T) {
	dir := t.TempDir()
	write := func(name, token string) string {
		p := filepath.Join(dir, name)
		if err := os.WriteFile(p, []byte(token+"\n"), 0o600); err != nil {
			t.Fatal(err)
		}
		return p
	}
	flagFile, envFile := write("flag", "from-flag-file"), write("env", "from-env-file")
	tests := []struct {
		name             string
		env              map[string]string
		token, tokenFile string
		want             string
	}{
		{"flag file wins", map[string]string{HTTPTokenEnvName: "from-env", HTTPTokenFileEnvName: envFile}, "from-flag", flagFile, "from-flag-file"},
		{"flag token over env file", map[string]string{HTTPTokenEnvName: "from-env", HTTPTokenFileEnvName: envFile}, "from-flag", "", "from-flag"},
		{"env file over env token", map[string]string{HTTPTokenEnvName: "from-env", HTTPTokenFileEnvName: envFile}, "", "", "from-env-file"},
		{"env token", map[string]string{HTTPTokenEnvName: "from-env"}, "", "", "from-env"},
		{"none", nil, "", "", ""},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			for _, v := range []string{HTTPTokenEnvName, HTTPTokenFileEnvName} {
				t.Setenv(v, tt.env[v])
			}
			c, err := NewClient(&Config{Token: tt.token, TokenFile: tt.tokenFile})
			if err != nil {
				t.Fatal(err)
			}
			if c.config.Token != tt.want {
				t.Errorf("token %q, want %q", c.config.Token, tt.want)
			}
		})
	}
}

// TestAddress: host:port, URLs with a scheme and a path prefix, and a
// scheme Consul's client does not know.
func TestAddress(t *testing.T) {
	tests := []struct {
		name, addr                   string
		scheme, host, prefix, errSub string
	}{
		{"host:port", "10.0.0.1:8500", "http", "10.0.0.1:8500", "", ""},
		{"http", "http://h:1", "http", "h:1", "", ""},
		{"https", "https://h:1", "https", "h:1", "", ""},
		{"prefix", "https://h:1/consul", "https", "h:1", "/consul", ""},
		{"unix", "unix:///run/consul.sock", "http", "/run/consul.sock", "", ""},
		{"bad scheme", "ftp://h:1", "", "", "", "Unknown protocol scheme: ftp"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			cfg := &Config{Address: tt.addr}
			_, err := NewClient(cfg)
			if tt.errSub != "" {
				if err == nil || !strings.Contains(err.Error(), tt.errSub) {
					t.Fatalf("error %v, want %q", err, tt.errSub)
				}
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			if cfg.Scheme != tt.scheme || cfg.Address != tt.host || cfg.PathPrefix != tt.prefix {
				t.Errorf("scheme %q address %q prefix %q", cfg.Scheme, cfg.Address, cfg.PathPrefix)
			}
		})
	}
}

// TestRequests: every request carries the token and basic auth; a missing
// key is nil without an error, a missing session's renewal too; other
// statuses are StatusErrors with the body; the answer of a blocking query
// gives its index.
func TestRequests(t *testing.T) {
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.Header.Get("X-Consul-Token") != "tok" {
			http.Error(w, "no token", http.StatusForbidden)
			return
		}
		if u, p, _ := r.BasicAuth(); u != "user" || p != "pw" {
			http.Error(w, "no auth", http.StatusUnauthorized)
			return
		}
		switch {
		case r.URL.Path == "/v1/kv/missing":
			w.WriteHeader(http.StatusNotFound)
		case r.URL.Path == "/v1/kv/k" && r.URL.Query().Get("index") == "7":
			w.Header().Set("X-Consul-Index", "9")
			_, _ = w.Write([]byte(`[{"Key":"k","ModifyIndex":9,"Value":"aWQ=","Session":"s1"}]`))
		case r.URL.Path == "/v1/session/renew/gone":
			w.WriteHeader(http.StatusNotFound)
		default:
			http.Error(w, "Permission denied", http.StatusForbidden)
		}
	}))
	defer srv.Close()
	t.Setenv(HTTPAuthEnvName, "user:pw")
	c, err := NewClient(&Config{Address: srv.URL, Token: "tok"})
	if err != nil {
		t.Fatal(err)
	}
	ctx := context.Background()
	if p, _, err := c.KV().Get("missing", (&QueryOptions{}).WithContext(ctx)); p != nil || err != nil {
		t.Errorf("missing key: %v, %v; want nil, nil", p, err)
	}
	p, meta, err := c.KV().Get("k", (&QueryOptions{WaitIndex: 7}).WithContext(ctx))
	if err != nil || p == nil || string(p.Value) != "id" || p.Session != "s1" || p.ModifyIndex != 9 || meta.LastIndex != 9 {
		t.Errorf("blocking get: %+v, %+v, %v", p, meta, err)
	}
	if e, _, err := c.Session().Renew("gone", nil); e != nil || err != nil {
		t.Errorf("renew of a missing session: %v, %v; want nil, nil", e, err)
	}
	_, _, err = c.KV().Acquire(&KVPair{Key: "x", Session: "s"}, nil)
	var se StatusError
	if !errors.As(err, &se) || se.Code != 403 || se.Error() != "Unexpected response code: 403 (Permission denied)" {
		t.Errorf("refused acquire: %v", err)
	}
}

// TestTLS: CONSUL_CACERT (a file) or CONSUL_CAPATH (a directory) verify
// the agent's certificate; without them an unknown CA is refused, and
// CONSUL_HTTP_SSL_VERIFY=false accepts it.
func TestTLS(t *testing.T) {
	srv := httptest.NewTLSServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		_, _ = w.Write([]byte(`[]`))
	}))
	defer srv.Close()
	dir := t.TempDir()
	ca := filepath.Join(dir, "ca.pem")
	if err := os.WriteFile(ca, pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: srv.Certificate().Raw}), 0o600); err != nil {
		t.Fatal(err)
	}
	tests := []struct {
		name string
		env  map[string]string
		ok   bool
	}{
		{"CA file", map[string]string{HTTPCAFile: ca}, true},
		{"CA path", map[string]string{HTTPCAPath: dir}, true},
		{"unknown CA", nil, false},
		{"no verification", map[string]string{HTTPSSLVerifyEnvName: "false"}, true},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			for _, v := range []string{HTTPCAFile, HTTPCAPath, HTTPSSLVerifyEnvName} {
				t.Setenv(v, tt.env[v])
			}
			c, err := NewClient(&Config{Address: srv.URL})
			if err != nil {
				t.Fatal(err)
			}
			_, _, err = c.Session().List(nil)
			if (err == nil) != tt.ok {
				t.Errorf("list over TLS: %v, want ok=%v", err, tt.ok)
			}
		})
	}
}
