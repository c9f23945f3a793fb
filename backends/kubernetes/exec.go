package kubernetes

import (
	"bytes"
	"context"
	"crypto/tls"
	"encoding/base64"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"strings"
	"sync"
	"time"
)

// The ExecCredential versions a plugin may speak.
const (
	execV1      = "client.authentication.k8s.io/v1"
	execV1beta1 = "client.authentication.k8s.io/v1beta1"
)

const (
	// execTimeout bounds one run of a credential plugin when the request
	// that needs it has no earlier deadline.
	execTimeout = time.Minute
	// expiryMargin: a credential is refreshed this long before the time
	// it said it expires, so that no request carries one that expires on
	// the way.
	expiryMargin = 10 * time.Second
)

// execPlugin runs a kubeconfig's exec credential plugin when a credential
// is needed and the last one expired or was refused, as client-go does.
type execPlugin struct {
	cfg    ExecConfig
	source string
	info   []byte // KUBERNETES_EXEC_INFO

	mu    sync.Mutex
	cred  *execCredential
	stale bool
}

// execCredential is what one run of the plugin gave.
type execCredential struct {
	token  string
	cert   *tls.Certificate
	expiry time.Time // zero: does not expire
}

func newExecPlugin(cfg *APIConfig) (*execPlugin, error) {
	e := cfg.Exec
	if e.Command == "" {
		return nil, fmt.Errorf("kubernetes: exec plugin of %s has no command", cfg.Source)
	}
	if e.APIVersion != execV1 && e.APIVersion != execV1beta1 {
		return nil, fmt.Errorf("kubernetes: exec plugin of %s: apiVersion %q: want %s or %s", cfg.Source, e.APIVersion, execV1, execV1beta1)
	}
	switch e.InteractiveMode {
	case "", "Never", "IfAvailable":
	case "Always":
		return nil, fmt.Errorf("kubernetes: exec plugin %s of %s wants a terminal (interactiveMode: Always); leaderrun runs it without one", e.Command, cfg.Source)
	default:
		return nil, fmt.Errorf("kubernetes: exec plugin of %s: interactiveMode %q: want Never, IfAvailable or Always", cfg.Source, e.InteractiveMode)
	}
	spec := map[string]any{"interactive": false}
	if e.ProvideClusterInfo {
		cluster := map[string]any{"server": cfg.Server}
		if cfg.TLSServerName != "" {
			cluster["tls-server-name"] = cfg.TLSServerName
		}
		if cfg.Insecure {
			cluster["insecure-skip-tls-verify"] = true
		}
		if cfg.ProxyURL != "" {
			cluster["proxy-url"] = cfg.ProxyURL
		}
		ca := cfg.CAData
		if cfg.CAFile != "" {
			data, err := os.ReadFile(cfg.CAFile)
			if err != nil {
				return nil, fmt.Errorf("kubernetes: certificate-authority of %s: %w", cfg.Source, err)
			}
			ca = data
		}
		if len(ca) > 0 {
			cluster["certificate-authority-data"] = base64.StdEncoding.EncodeToString(ca)
		}
		spec["cluster"] = cluster
	}
	info, err := json.Marshal(map[string]any{"apiVersion": e.APIVersion, "kind": "ExecCredential", "spec": spec})
	if err != nil {
		return nil, err
	}
	return &execPlugin{cfg: *e, source: cfg.Source, info: info}, nil
}

// get returns the current credential, running the plugin if there is none
// yet, or it expired, or it was refused.
func (p *execPlugin) get(ctx context.Context) (*execCredential, error) {
	p.mu.Lock()
	defer p.mu.Unlock()
	if c := p.cred; c != nil && !p.stale && (c.expiry.IsZero() || time.Until(c.expiry) > expiryMargin) {
		return c, nil
	}
	c, err := p.run(ctx)
	if err != nil {
		return nil, err
	}
	p.cred, p.stale = c, false
	return c, nil
}

// invalidate marks the credential that carried token as refused, so that
// the next request runs the plugin again, unless another request refreshed
// it already. Either way a retry sends a fresh credential.
func (p *execPlugin) invalidate(token string) bool {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.cred != nil && p.cred.token == token {
		p.stale = true
	}
	return true
}

// run runs the plugin once: without a terminal, with KUBERNETES_EXEC_INFO
// in its environment, as client-go runs it non-interactively. Its standard
// output is the credential; its standard error goes into the message if it
// fails. Neither the credential nor the output appears in any error.
func (p *execPlugin) run(ctx context.Context) (*execCredential, error) {
	if _, ok := ctx.Deadline(); !ok {
		var cancel context.CancelFunc
		ctx, cancel = context.WithTimeout(ctx, execTimeout)
		defer cancel()
	}
	cmd := exec.CommandContext(ctx, p.cfg.Command, p.cfg.Args...)
	cmd.Env = os.Environ()
	for _, v := range p.cfg.Env {
		cmd.Env = append(cmd.Env, v.Name+"="+v.Value)
	}
	cmd.Env = append(cmd.Env, "KUBERNETES_EXEC_INFO="+string(p.info))
	var stdout, stderr bytes.Buffer
	cmd.Stdout, cmd.Stderr = &stdout, &stderr
	// Descendants that keep the pipes open must not hold the request up.
	cmd.WaitDelay = time.Second
	what := fmt.Sprintf("kubernetes: exec plugin %s of %s", p.cfg.Command, p.source)
	if err := cmd.Run(); err != nil {
		if errors.Is(err, exec.ErrNotFound) && p.cfg.InstallHint != "" {
			return nil, fmt.Errorf("%s: %w\n%s", what, err, p.cfg.InstallHint)
		}
		if msg := strings.TrimSpace(stderr.String()); msg != "" {
			if len(msg) > 512 {
				msg = msg[:512] + "..."
			}
			return nil, fmt.Errorf("%s: %w: %s", what, err, msg)
		}
		return nil, fmt.Errorf("%s: %w", what, err)
	}
	var out struct {
		APIVersion string `json:"apiVersion"`
		Kind       string `json:"kind"`
		Status     *struct {
			Token                 string     `json:"token"`
			ClientCertificateData string     `json:"clientCertificateData"`
			ClientKeyData         string     `json:"clientKeyData"`
			ExpirationTimestamp   *time.Time `json:"expirationTimestamp"`
		} `json:"status"`
	}
	if err := json.Unmarshal(stdout.Bytes(), &out); err != nil {
		return nil, fmt.Errorf("%s: its output is not an ExecCredential in JSON", what)
	}
	switch {
	case out.Kind != "ExecCredential":
		return nil, fmt.Errorf("%s: its output has kind %q, want ExecCredential", what, out.Kind)
	case out.APIVersion != p.cfg.APIVersion:
		return nil, fmt.Errorf("%s: its output has apiVersion %q, want %q as configured", what, out.APIVersion, p.cfg.APIVersion)
	case out.Status == nil:
		return nil, fmt.Errorf("%s: its output has no status", what)
	}
	st := out.Status
	c := &execCredential{token: st.Token}
	if st.ExpirationTimestamp != nil {
		c.expiry = *st.ExpirationTimestamp
	}
	if (st.ClientCertificateData == "") != (st.ClientKeyData == "") {
		return nil, fmt.Errorf("%s: its output has a client certificate without its key, or a key without its certificate", what)
	}
	if st.ClientCertificateData != "" {
		cert, err := tls.X509KeyPair([]byte(st.ClientCertificateData), []byte(st.ClientKeyData))
		if err != nil {
			return nil, fmt.Errorf("%s: client certificate: %w", what, err)
		}
		c.cert = &cert
	}
	if c.token == "" && c.cert == nil {
		return nil, fmt.Errorf("%s: its output has neither a token nor a client certificate", what)
	}
	return c, nil
}
