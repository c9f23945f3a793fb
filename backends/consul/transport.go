package consul

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net/http"
	"time"

	"github.com/hashicorp/consul/api"
	"github.com/hashicorp/go-cleanhttp"

	"github.com/leaderrun/leaderrun/backends"
)

// Bounds on what leaderrun reads from the agent. maxAnswer caps every
// answer's body: the largest leaderrun reads is a lock's queue (200 bytes
// per waiter: 10,000 fit) or a document (170 KiB in base64); decoding
// costs up to 3 times that, well within the 64 MiB a leaderrun may use.
// maxHeader caps an answer's header; Consul's are a few hundred bytes.
const (
	maxAnswer = 2 << 20
	maxHeader = 64 << 10
)

var errTooLarge = fmt.Errorf("consul: answer longer than the %d MiB leaderrun reads", maxAnswer>>20)

// errRedirect: none is followed, since the request carries the ACL token,
// and Consul's HTTP API never redirects.
var errRedirect = errors.New("consul: the agent answered with a redirect, which leaderrun never follows")

// CheckAddress refuses an agent address with user information
// (http://user:password@host), which Consul's client would repeat in every
// error. It is found by backends.Redact's rule, not by a parser's, which a
// password holding "/" would mislead.
func CheckAddress(addr string) error {
	if r := backends.Redact(addr); r != addr {
		return fmt.Errorf("address %s: user information in the address is not supported; give the ACL token with --consul-token-file or CONSUL_HTTP_TOKEN, HTTP basic authentication with CONSUL_HTTP_AUTH", r)
	}
	return nil
}

// newClient builds Consul's client for cfg (which it changes) on an HTTP
// client of its own: every answer capped at maxAnswer and its header at
// maxHeader, every request with a deadline, no redirect followed.
func newClient(cfg *api.Config) (*api.Client, *http.Client, error) {
	if cfg.Transport == nil {
		cfg.Transport = cleanhttp.DefaultPooledTransport()
	}
	cfg.Transport = cfg.Transport.Clone()
	cfg.HttpClient = nil
	client, err := api.NewClient(cfg)
	if err != nil {
		return nil, nil, err
	}
	// NewClient built cfg.HttpClient, on cfg.Transport or, for a unix
	// socket, on a transport of its own; client shares the pointer.
	hc := cfg.HttpClient
	if tr, ok := hc.Transport.(*http.Transport); ok {
		tr.MaxResponseHeaderBytes = maxHeader
	}
	hc.Transport = &boundedTransport{base: hc.Transport}
	hc.CheckRedirect = func(req *http.Request, _ []*http.Request) error {
		return fmt.Errorf("%w (to %s://%s)", errRedirect, req.URL.Scheme, req.URL.Host)
	}
	return client, hc, nil
}

// boundedTransport caps answers at maxAnswer, and gives every request
// requestTimeout at most, a blocking query its wait more.
type boundedTransport struct{ base http.RoundTripper }

func (t *boundedTransport) RoundTrip(req *http.Request) (*http.Response, error) {
	timeout := requestTimeout
	if wait, err := time.ParseDuration(req.URL.Query().Get("wait")); err == nil {
		timeout += wait
	}
	ctx, cancel := context.WithTimeout(req.Context(), timeout)
	resp, err := t.base.RoundTrip(req.WithContext(ctx))
	if err != nil {
		cancel()
		return nil, err
	}
	resp.Body = cappedBody{http.MaxBytesReader(nil, resp.Body, maxAnswer), cancel}
	return resp, nil
}

// cappedBody is an answer's body up to maxAnswer: one byte more is
// errTooLarge, never the end of the answer. Closing it ends its deadline.
type cappedBody struct {
	io.ReadCloser
	cancel context.CancelFunc
}

func (b cappedBody) Read(p []byte) (int, error) {
	n, err := b.ReadCloser.Read(p)
	if mb := (*http.MaxBytesError)(nil); errors.As(err, &mb) {
		err = errTooLarge
	}
	return n, err
}

func (b cappedBody) Close() error {
	defer b.cancel()
	return b.ReadCloser.Close()
}
