package kubernetes

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"net/url"
	"strings"
	"time"
)

// requestTimeout bounds every request that is not a watch, unless the
// caller's context ends sooner, so that a connection that stalls without
// closing cannot hang a campaign.
const requestTimeout = 10 * time.Second

// maxBody bounds what is read of an answer: a Lease is at most a few
// hundred KiB (its annotations are capped at 256 KiB).
const maxBody = 4 << 20

// client speaks the Kubernetes REST API for one Lease resource, with JSON:
// the handful of requests this backend needs do not justify client-go's
// generated clients and the start-up cost of their type registry (see the
// package doc).
type client struct {
	server *url.URL     // the apiserver, maybe with a path prefix (a proxy's)
	host   string       // the server as messages name it, without credentials
	http   *http.Client // authenticates every request (see newTransport)
}

// apiError is an answer other than 2xx, with what the apiserver's Status
// said about it.
type apiError struct {
	Code    int
	Reason  string // the Status reason: Forbidden, Conflict, NotFound, Expired, ...
	Message string // the Status message, which names the verb and resource of a refusal
}

func (e *apiError) Error() string {
	if e.Message != "" {
		return e.Message
	}
	return fmt.Sprintf("%d %s", e.Code, http.StatusText(e.Code))
}

// statusOf reads an error answer: the apiserver sends a Status object;
// anything in front of it (a proxy) may send anything.
func statusOf(code int, body []byte) *apiError {
	e := &apiError{Code: code}
	var st struct {
		Reason  string `json:"reason"`
		Message string `json:"message"`
		Code    int    `json:"code"`
	}
	if json.Unmarshal(body, &st) == nil && (st.Message != "" || st.Reason != "") {
		e.Reason, e.Message = st.Reason, st.Message
		return e
	}
	if s := strings.TrimSpace(string(body)); s != "" && len(s) < 300 {
		e.Message = fmt.Sprintf("%d %s: %s", code, http.StatusText(code), s)
	}
	return e
}

// codeOf is the HTTP status of an apiError, 0 for any other error.
func codeOf(err error) int {
	var ae *apiError
	if errors.As(err, &ae) {
		return ae.Code
	}
	return 0
}

func isNotFound(err error) bool { return codeOf(err) == http.StatusNotFound }
func isConflict(err error) bool { return codeOf(err) == http.StatusConflict }

// isRefusal reports whether the apiserver refused who we are or what we
// asked: final in every mode, as a retry would be refused again.
// Unauthorized (401) comes after the credentials were refreshed once (see
// authTransport), Forbidden (403) names the verb RBAC denied, Invalid (422)
// and BadRequest (400) a Lease the server will not take.
func isRefusal(err error) bool {
	switch codeOf(err) {
	case http.StatusUnauthorized, http.StatusForbidden, http.StatusBadRequest,
		http.StatusUnprocessableEntity, http.StatusRequestEntityTooLarge, http.StatusMethodNotAllowed:
		return true
	}
	return false
}

// transient reports whether a failed request may succeed if sent again: no
// answer at all, a server error, or throttling. A Conflict or NotFound is
// an answer about the Lease and handled where it is met.
func transient(err error) bool {
	switch code := codeOf(err); {
	case code == 0:
		return !errors.Is(err, errNotNumeric)
	case code >= 500, code == http.StatusTooManyRequests:
		return true
	}
	return false
}

// errNotNumeric is a Lease whose resourceVersion this backend cannot use.
var errNotNumeric = errors.New("kubernetes: resourceVersion is not a number")

func (c *client) leasesPath(namespace string) string {
	return "/apis/coordination.k8s.io/v1/namespaces/" + url.PathEscape(namespace) + "/leases"
}

// do sends one request and returns the body of a 2xx answer, or an
// apiError.
func (c *client) do(ctx context.Context, method, path string, query url.Values, body []byte) ([]byte, error) {
	ctx, cancel := context.WithTimeout(ctx, requestTimeout)
	defer cancel()
	resp, err := c.send(ctx, method, path, query, body)
	if err != nil {
		return nil, err
	}
	defer resp.Body.Close()
	data, err := io.ReadAll(io.LimitReader(resp.Body, maxBody))
	if err != nil {
		return nil, err
	}
	if resp.StatusCode/100 != 2 {
		return nil, statusOf(resp.StatusCode, data)
	}
	return data, nil
}

// send sends a request and returns the answer, whatever its status, with
// the body to be read and closed by the caller.
func (c *client) send(ctx context.Context, method, path string, query url.Values, body []byte) (*http.Response, error) {
	u := *c.server
	u.Path = strings.TrimSuffix(u.Path, "/") + path
	u.RawPath = ""
	u.RawQuery = query.Encode()
	var rd io.Reader
	if body != nil {
		rd = bytes.NewReader(body)
	}
	req, err := http.NewRequestWithContext(ctx, method, u.String(), rd)
	if err != nil {
		return nil, err
	}
	req.Header.Set("Accept", "application/json")
	if body != nil {
		req.Header.Set("Content-Type", "application/json")
	}
	req.Header.Set("User-Agent", "leaderrun")
	resp, err := c.http.Do(req)
	if err != nil {
		// url.Error repeats the whole URL; the caller names the server.
		var ue *url.Error
		if errors.As(err, &ue) {
			err = ue.Err
		}
		return nil, err
	}
	return resp, nil
}

// getLease reads the Lease; an apiError with code 404 if there is none.
func (c *client) getLease(ctx context.Context, namespace, name string) (*leaseObject, error) {
	data, err := c.do(ctx, http.MethodGet, c.leasesPath(namespace)+"/"+url.PathEscape(name), nil, nil)
	if err != nil {
		return nil, err
	}
	return parseLease(data)
}

// createLease creates o; an apiError with code 409 if it exists already.
func (c *client) createLease(ctx context.Context, namespace string, o *leaseObject) (*leaseObject, error) {
	body, err := o.marshal()
	if err != nil {
		return nil, err
	}
	data, err := c.do(ctx, http.MethodPost, c.leasesPath(namespace), nil, body)
	if err != nil {
		return nil, err
	}
	return parseLease(data)
}

// updateLease replaces the Lease with o if it is still at o's
// resourceVersion; an apiError with code 409 if it is not, 404 if it is
// gone.
func (c *client) updateLease(ctx context.Context, namespace string, o *leaseObject) (*leaseObject, error) {
	body, err := o.marshal()
	if err != nil {
		return nil, err
	}
	data, err := c.do(ctx, http.MethodPut, c.leasesPath(namespace)+"/"+url.PathEscape(o.name), nil, body)
	if err != nil {
		return nil, err
	}
	return parseLease(data)
}
