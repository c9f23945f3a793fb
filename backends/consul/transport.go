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

// Bounds on what leaderrun reads from the agent, so that a broken or
// hostile server gets an error and never our memory.
const (
	// maxAnswer caps the body of every answer. The largest leaderrun
	// reads is a list under the lock's prefix: the queue (about 200
	// bytes of JSON per waiter: 10,000 waiters fit), the history (about
	// 110 terms), the markers; a single key's value is at most 512 KiB by
	// Consul's default kv_max_value_size (about 700 KiB in base64). The
	// JSON decoder buffers one answer whole, doubling its buffer as it
	// grows, so an answer of maxAnswer costs up to about 3 times that
	// while it is read; a renewal reads up to three answers at once: well
	// within the 64 MiB that a leaderrun may use.
	maxAnswer = 2 << 20
	// maxHeader caps an answer's header; Consul's are a few hundred bytes.
	maxHeader = 64 << 10
)

// errTooLarge is an answer longer than maxAnswer.
var errTooLarge = fmt.Errorf("consul: answer longer than the %d MiB leaderrun reads", maxAnswer>>20)

// errRedirect is a redirect from the agent. None is followed: the
// request carries the ACL token, which must go to the configured agent
// only, and Consul's HTTP API never redirects.
var errRedirect = errors.New("consul: the agent answered with a redirect, which leaderrun never follows")

// CheckAddress refuses an agent address with user information
// (http://user:password@host): Consul's client would put it in the host
// name and repeat it in every error. The error names the address
// redacted. New checks it too.
func CheckAddress(addr string) error {
	// Found by backends.Redact's rule, not by a parser's: a password
	// holding "/" ends the host part for a parser, which would then find
	// no user information.
	if backends.Redact(addr) != addr {
		return fmt.Errorf("address %s: user information in the address is not supported; give the ACL token with --consul-token-file or CONSUL_HTTP_TOKEN, HTTP basic authentication with CONSUL_HTTP_AUTH",
			backends.Redact(addr))
	}
	return nil
}

// newClient builds Consul's client for cfg on an HTTP client of its own,
// bounded: every answer is capped at maxAnswer and its header at
// maxHeader, every request without a deadline gets requestTimeout, and no
// redirect is followed. cfg is changed (its Transport and HttpClient are
// the new client's).
func newClient(cfg *api.Config) (*api.Client, *http.Client, error) {
	if cfg.Transport == nil {
		cfg.Transport = cleanhttp.DefaultPooledTransport()
	} else {
		cfg.Transport = cfg.Transport.Clone()
	}
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
	hc.Transport = &boundedTransport{base: hc.Transport, limit: maxAnswer, timeout: requestTimeout}
	hc.CheckRedirect = func(req *http.Request, _ []*http.Request) error {
		return fmt.Errorf("%w (to %s://%s)", errRedirect, req.URL.Scheme, req.URL.Host)
	}
	return client, hc, nil
}

// boundedTransport caps answers at limit bytes and gives a request
// without a deadline one of timeout.
type boundedTransport struct {
	base    http.RoundTripper
	limit   int64
	timeout time.Duration
}

// RoundTrip implements http.RoundTripper.
func (t *boundedTransport) RoundTrip(req *http.Request) (*http.Response, error) {
	cancel := context.CancelFunc(func() {})
	if _, ok := req.Context().Deadline(); !ok {
		var ctx context.Context
		ctx, cancel = context.WithTimeout(req.Context(), t.timeout)
		req = req.WithContext(ctx)
	}
	resp, err := t.base.RoundTrip(req)
	if err != nil {
		cancel()
		return nil, err
	}
	if resp.ContentLength > t.limit {
		resp.Body.Close()
		cancel()
		return nil, fmt.Errorf("%w: %s %s: %d bytes", errTooLarge, req.Method, req.URL.Path, resp.ContentLength)
	}
	resp.Body = &cappedBody{body: resp.Body, left: t.limit, cancel: cancel}
	return resp, nil
}

// cappedBody reads an answer's body up to a limit; one byte more is
// errTooLarge, never an end of the answer.
type cappedBody struct {
	body   io.ReadCloser
	left   int64 // bytes still allowed; -1 once the limit was passed
	cancel context.CancelFunc
}

func (b *cappedBody) Read(p []byte) (int, error) {
	if b.left < 0 {
		return 0, errTooLarge
	}
	// Ask for one byte past the limit, to tell an answer that ends at
	// the limit from one that goes on.
	if int64(len(p)) > b.left+1 {
		p = p[:b.left+1]
	}
	n, err := b.body.Read(p)
	if int64(n) > b.left {
		n, b.left = int(b.left), -1
		return n, errTooLarge
	}
	b.left -= int64(n)
	return n, err
}

func (b *cappedBody) Close() error {
	defer b.cancel()
	return b.body.Close()
}
