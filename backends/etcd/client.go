package etcd

import (
	"bytes"
	"context"
	"crypto/tls"
	"crypto/x509"
	"encoding/binary"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/url"
	"os"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/leaderrun/leaderrun/backends"
)

// The backend speaks etcd's v3 gRPC API itself, over net/http's HTTP/2 (h2c
// on http:// endpoints, TLS with ALPN on https://), with the protobuf
// messages encoded by hand (proto.go): the same requests on the same
// server port as etcd's Go client, for a fraction of its binary, package
// init and memory (docs/performance.md). Only what the backend uses is
// here: Range, Txn, DeleteRange, Watch, LeaseGrant, LeaseRevoke,
// LeaseKeepAlive, LeaseTimeToLive and Authenticate.
//
// etcd's JSON gateway (/v3/kv/range, ...) would have been simpler, but it
// is a gRPC client of its own member, inside the member: with
// --client-cert-auth it presents the member's server certificate (which
// then needs the client-auth usage), a client certificate's common name no
// longer names the etcd user, and it can be turned off
// (--enable-grpc-gateway=false). Speaking gRPC keeps every deployment
// that works with etcdctl working.

// gRPC status codes that etcd's errors carry.
const (
	codeInvalidArgument  = 3
	codeNotFound         = 5
	codePermissionDenied = 7
	codeUnavailable      = 14
	codeUnauthenticated  = 16
)

// apiError is an error answered by etcd: a gRPC status.
type apiError struct {
	Code    int
	Message string
}

func (e *apiError) Error() string { return e.Message }

// Messages of etcd's errors (rpctypes), for the ones the backend acts on.
const (
	msgLeaseNotFound    = "etcdserver: requested lease not found"
	msgAuthFailed       = "etcdserver: authentication failed, invalid user ID or password"
	msgUserEmpty        = "etcdserver: user name is empty"
	msgInvalidAuthToken = "etcdserver: invalid auth token"
	msgAuthOldRevision  = "etcdserver: revision of auth store is old"
)

func isAPIError(err error, code int, msg string) bool {
	var ae *apiError
	return errors.As(err, &ae) && (code == 0 || ae.Code == code) && (msg == "" || ae.Message == msg)
}

// leaseNotFound reports whether etcd said that a lease does not exist.
func leaseNotFound(err error) bool { return isAPIError(err, codeNotFound, msgLeaseNotFound) }

// endpoint is one member's client URL as the client dials it.
type endpoint struct {
	base string // scheme://host:port, for requests; "http://unix-N" for a unix socket
	unix string // the socket's path, for unix:// and unixs://
}

// client is etcd's v3 API, as much of it as the backend uses, on several
// members: a request that cannot reach one member (it refuses the
// connection) goes to the next; one that gets no answer makes the next
// request start with the next member; the member that answered last is
// asked first. With a user name, it authenticates before its first request
// and again when etcd says the token has expired, and sends the token with
// every request, as etcd's client does.
type client struct {
	eps  []endpoint
	http *http.Client
	tr   *http.Transport

	user, password string

	mu    sync.Mutex
	cur   int    // index of the member asked first
	token string // auth token, "" before authentication
}

// newClient builds the client; it contacts no member.
func newClient(endpoints []string, tlsCfg *tls.Config, user, password string, dialTimeout time.Duration) (*client, error) {
	c := &client{user: user, password: password}
	sockets := map[string]string{}
	for i, raw := range endpoints {
		ep, err := parseEndpoint(raw, tlsCfg != nil, i)
		if err != nil {
			return nil, err
		}
		if ep.unix != "" {
			sockets[strings.TrimPrefix(ep.base, "http://")+":80"] = ep.unix
		}
		c.eps = append(c.eps, ep)
	}
	dialer := &net.Dialer{Timeout: dialTimeout, KeepAlive: keepaliveTime}
	var protocols http.Protocols
	protocols.SetHTTP2(true)
	protocols.SetUnencryptedHTTP2(true) // gRPC on http:// is HTTP/2 with prior knowledge
	c.tr = &http.Transport{
		DialContext: func(ctx context.Context, network, addr string) (net.Conn, error) {
			if path, ok := sockets[addr]; ok {
				return dialer.DialContext(ctx, "unix", path)
			}
			return dialer.DialContext(ctx, network, addr)
		},
		TLSClientConfig:     tlsCfg,
		TLSHandshakeTimeout: dialTimeout,
		Protocols:           &protocols,
		HTTP2: &http.HTTP2Config{
			// As etcd's client: ping a connection that has been silent
			// for keepaliveTime, and drop it if the ping is not answered
			// within the dial timeout, so that a black-holed member is
			// left for another.
			SendPingTimeout: keepaliveTime,
			PingTimeout:     dialTimeout,
		},
		IdleConnTimeout: keepaliveTime * 9,
	}
	c.http = &http.Client{Transport: c.tr}
	return c, nil
}

// parseEndpoint turns http://host:port, https://host:port, host:port (https
// when tlsOn), unix://path or unixs://path into an endpoint. Credentials in
// the URL are dropped: they are never sent, and never printed.
func parseEndpoint(raw string, tlsOn bool, i int) (endpoint, error) {
	if !strings.Contains(raw, "://") {
		scheme := "http://"
		if tlsOn {
			scheme = "https://"
		}
		return endpoint{base: scheme + raw}, nil
	}
	u, err := url.Parse(raw)
	if err != nil {
		return endpoint{}, fmt.Errorf("etcd: endpoint %q: %v", backends.Redact(raw), err)
	}
	switch u.Scheme {
	case "http", "https":
		return endpoint{base: u.Scheme + "://" + u.Host}, nil
	case "unix", "unixs":
		// A unix socket is named by the whole rest of the URL.
		return endpoint{base: "http://unix-" + strconv.Itoa(i), unix: u.Host + u.Path}, nil
	}
	return endpoint{}, fmt.Errorf("etcd: endpoint %q: want http, https, unix or unixs", backends.Redact(raw))
}

func (c *client) close() { c.tr.CloseIdleConnections() }

// Methods of etcd's gRPC services.
const (
	methodRange           = "/etcdserverpb.KV/Range"
	methodTxn             = "/etcdserverpb.KV/Txn"
	methodDeleteRange     = "/etcdserverpb.KV/DeleteRange"
	methodWatch           = "/etcdserverpb.Watch/Watch"
	methodLeaseGrant      = "/etcdserverpb.Lease/LeaseGrant"
	methodLeaseRevoke     = "/etcdserverpb.Lease/LeaseRevoke"
	methodLeaseKeepAlive  = "/etcdserverpb.Lease/LeaseKeepAlive"
	methodLeaseTimeToLive = "/etcdserverpb.Lease/LeaseTimeToLive"
	methodAuthenticate    = "/etcdserverpb.Auth/Authenticate"
)

// call makes one unary call (or a stream of one request and one answer,
// as LeaseKeepAlive is used) and returns the answer's message.
func (c *client) call(ctx context.Context, method string, req []byte) ([]byte, error) {
	resp, err := c.send(ctx, method, req)
	if err != nil {
		return nil, err
	}
	defer resp.Body.Close()
	msg, err := readMessage(resp.Body)
	if err == io.EOF {
		// No message: the status, in the trailers, says why.
		if err := status(resp.Trailer); err != nil {
			return nil, err
		}
		return nil, fmt.Errorf("%s: no answer in the stream", method)
	}
	if err != nil {
		return nil, fmt.Errorf("%s: read the answer: %w", method, unwrapURLError(err))
	}
	// Read the end of the stream: its trailers carry the status.
	_, _ = io.Copy(io.Discard, resp.Body)
	if err := status(resp.Trailer); err != nil {
		return nil, err
	}
	return msg, nil
}

// send starts a call of method with one request message, and returns the
// response once its headers say that it has begun: authenticating first
// if the client has a user and no token yet, and once more if etcd says
// the token is no longer valid.
func (c *client) send(ctx context.Context, method string, req []byte) (*http.Response, error) {
	for attempt := 0; ; attempt++ {
		token, err := c.authToken(ctx)
		if err != nil {
			return nil, err
		}
		resp, err := c.roundTrip(ctx, method, req, token)
		if err == nil {
			return resp, nil
		}
		if attempt == 0 && c.user != "" &&
			(isAPIError(err, 0, msgInvalidAuthToken) || isAPIError(err, 0, msgAuthOldRevision)) {
			c.mu.Lock()
			if c.token == token {
				c.token = ""
			}
			c.mu.Unlock()
			continue
		}
		return nil, err
	}
}

// authToken returns the token to send, authenticating if there is none.
func (c *client) authToken(ctx context.Context) (string, error) {
	if c.user == "" {
		return "", nil
	}
	c.mu.Lock()
	token := c.token
	c.mu.Unlock()
	if token != "" {
		return token, nil
	}
	resp, err := c.roundTrip(ctx, methodAuthenticate, pb(nil).bytes(1, []byte(c.user)).bytes(2, []byte(c.password)), "")
	if err != nil {
		return "", err
	}
	defer resp.Body.Close()
	msg, err := readMessage(resp.Body)
	if err == io.EOF {
		_, _ = io.Copy(io.Discard, resp.Body)
		if err := status(resp.Trailer); err != nil {
			return "", err
		}
	}
	_, strs, derr := decodeInts(msg)
	if err != nil || derr != nil || len(strs[2]) == 0 {
		return "", fmt.Errorf("authenticate as %q: no token in etcd's answer (%v)", c.user, errors.Join(err, derr))
	}
	c.mu.Lock()
	c.token = string(strs[2])
	c.mu.Unlock()
	return string(strs[2]), nil
}

// roundTrip is send without authentication, to the members in turn: a
// member that cannot be dialled is skipped at once; when none can, it
// tries again with a short backoff until ctx ends. With several members
// and a deadline, a member that does not answer within half the time left
// is left for the next one, as etcd's client leaves a member whose
// connection never becomes ready (every request the backend sends may be
// sent twice: a second grant leaves a lease to expire, a second creation
// of the candidate's key finds it there). Any other failure (a broken
// connection, an error from etcd) is returned, and a member that did not
// answer, or could not serve, is asked last next time.
func (c *client) roundTrip(ctx context.Context, method string, req []byte, token string) (*http.Response, error) {
	retry := backends.Backoff{Min: 25 * time.Millisecond, Max: 500 * time.Millisecond}
	body := frame(req)
	for {
		c.mu.Lock()
		first := c.cur
		c.mu.Unlock()
		var lastErr error
		for k := range c.eps {
			i := (first + k) % len(c.eps)
			actx, cancel := ctx, context.CancelFunc(func() {})
			if dl, ok := ctx.Deadline(); ok && k < len(c.eps)-1 {
				actx, cancel = context.WithDeadline(ctx, time.Now().Add(time.Until(dl)/2))
			}
			resp, err := c.once(actx, c.eps[i], method, body, token)
			switch {
			case err == nil:
				c.mu.Lock()
				c.cur = i
				c.mu.Unlock()
				resp.Body = cancelOnClose{resp.Body, cancel}
				return resp, nil
			case ctx.Err() != nil:
				cancel()
				return nil, err
			case actx.Err() != nil:
				// No answer in its share of the time: the next member.
				cancel()
				c.skip(i)
				lastErr = err
				continue
			case !dialFailed(err):
				cancel()
				var ae *apiError
				if !errors.As(err, &ae) || ae.Code == codeUnavailable {
					// No answer, or a member that cannot serve
					// (no leader, stopping): ask another first
					// next time.
					c.skip(i)
				}
				return nil, err
			}
			cancel()
			lastErr = err
		}
		// No member could be dialled: etcd is down or restarting.
		if retry.Sleep(ctx) != nil {
			return nil, lastErr
		}
	}
}

// skip makes the member after i the one asked first, if i was.
func (c *client) skip(i int) {
	c.mu.Lock()
	if c.cur == i {
		c.cur = (i + 1) % len(c.eps)
	}
	c.mu.Unlock()
}

// cancelOnClose ends a call's own context once its answer has been read.
type cancelOnClose struct {
	io.ReadCloser
	cancel context.CancelFunc
}

func (b cancelOnClose) Close() error {
	err := b.ReadCloser.Close()
	b.cancel()
	return err
}

// once starts one call on one member. An error status that comes with the
// headers (a call refused at once) is returned as an error.
func (c *client) once(ctx context.Context, ep endpoint, method string, body []byte, token string) (*http.Response, error) {
	req, err := http.NewRequestWithContext(ctx, http.MethodPost, ep.base+method, bytes.NewReader(body))
	if err != nil {
		return nil, err
	}
	req.Header.Set("Content-Type", "application/grpc")
	req.Header.Set("Te", "trailers")
	if token != "" {
		req.Header.Set("Token", token)
	}
	resp, err := c.http.Do(req)
	if err != nil {
		return nil, unwrapURLError(err)
	}
	if resp.StatusCode != http.StatusOK {
		resp.Body.Close()
		return nil, &apiError{Code: codeUnavailable, Message: fmt.Sprintf("%s: HTTP %s", method, resp.Status)}
	}
	if err := status(resp.Header); err != nil {
		resp.Body.Close()
		return nil, err
	}
	return resp, nil
}

// frame is msg as a gRPC message on the wire: uncompressed, with its length.
func frame(msg []byte) []byte {
	b := make([]byte, 5, 5+len(msg))
	binary.BigEndian.PutUint32(b[1:], uint32(len(msg)))
	return append(b, msg...)
}

// maxMessage bounds a message read from etcd (its own default limit for
// what it sends is 2 MiB per request; answers here are small).
const maxMessage = 16 << 20

// readMessage reads one gRPC message; io.EOF if the stream ended first.
func readMessage(r io.Reader) ([]byte, error) {
	var h [5]byte
	if _, err := io.ReadFull(r, h[:]); err != nil {
		if err == io.ErrUnexpectedEOF {
			return nil, errMalformed
		}
		return nil, err
	}
	n := binary.BigEndian.Uint32(h[1:])
	if h[0] != 0 || n > maxMessage {
		return nil, fmt.Errorf("%w: compressed or %d bytes long", errMalformed, n)
	}
	msg := make([]byte, n)
	if _, err := io.ReadFull(r, msg); err != nil {
		return nil, errMalformed
	}
	return msg, nil
}

// status is the gRPC status in h (headers or trailers), nil for OK or none.
func status(h http.Header) error {
	s := h.Get("Grpc-Status")
	if s == "" || s == "0" {
		return nil
	}
	code, err := strconv.Atoi(s)
	if err != nil {
		code = -1
	}
	msg := h.Get("Grpc-Message")
	if m, err := url.PathUnescape(msg); err == nil {
		msg = m
	}
	if msg == "" {
		msg = "gRPC status " + s
	}
	return &apiError{Code: code, Message: msg}
}

// unwrapURLError drops net/http's "Post \"URL\": " prefix: the backend's
// messages name the endpoints themselves, redacted.
func unwrapURLError(err error) error {
	var ue *url.Error
	if errors.As(err, &ue) {
		return ue.Err
	}
	return err
}

// dialFailed reports whether err is a failure to connect: nothing was sent,
// so the request can go to another member.
func dialFailed(err error) bool {
	var oe *net.OpError
	return errors.As(err, &oe) && oe.Op == "dial"
}

// The messages, as much of them as the backend reads and writes.

type header struct {
	Revision int64
}

type keyValue struct {
	Key            []byte
	CreateRevision int64
	ModRevision    int64
	Value          []byte
	Lease          int64
}

// rangeRequest is a Range, alone or in a transaction.
type rangeRequest struct {
	Key               []byte
	RangeEnd          []byte
	Limit             int64
	SortOrder         int64 // sortAscend, sortDescend
	SortTarget        int64 // sortByKey, sortByCreate
	KeysOnly          bool
	CountOnly         bool
	MaxCreateRevision int64
}

type rangeResponse struct {
	Header header
	Kvs    []keyValue
	Count  int64
}

type putRequest struct {
	Key   []byte
	Value []byte
	Lease int64
}

type deleteRequest struct {
	Key      []byte
	RangeEnd []byte
}

type compare struct {
	Result         int64 // compareEqual
	Target         int64 // compareTargetCreate
	Key            []byte
	CreateRevision int64
}

type requestOp struct {
	Range  *rangeRequest
	Put    *putRequest
	Delete *deleteRequest
}

type txnRequest struct {
	Compare []compare
	Success []requestOp
	Failure []requestOp
}

type txnResponse struct {
	Header    header
	Succeeded bool
	// Responses are the Range answers of the branch taken, nil for the
	// other operations.
	Responses []*rangeResponse
}

// rangeAt is the i-th response of a transaction, a Range's; empty if the
// answer lacks it.
func (r *txnResponse) rangeAt(i int) *rangeResponse {
	if i < len(r.Responses) && r.Responses[i] != nil {
		return r.Responses[i]
	}
	return &rangeResponse{}
}

// createdIs is the compare "key's create revision = rev" (0: the key does
// not exist).
func createdIs(key string, rev int64) compare {
	return compare{Result: compareEqual, Target: compareTargetCreate, Key: []byte(key), CreateRevision: rev}
}

// prefixEnd is the range end that makes a range cover every key starting
// with prefix.
func prefixEnd(prefix string) []byte {
	end := []byte(prefix)
	for i := len(end) - 1; i >= 0; i-- {
		if end[i] < 0xff {
			end[i]++
			return end[:i+1]
		}
	}
	return []byte{0} // every key
}

// firstCreated reads the oldest key under prefix; lastCreatedBefore the
// newest one created before revision rev.
func firstCreated(prefix string) *rangeRequest {
	return &rangeRequest{Key: []byte(prefix), RangeEnd: prefixEnd(prefix), Limit: 1, SortOrder: sortAscend, SortTarget: sortByCreate}
}

func lastCreatedBefore(prefix string, rev int64) *rangeRequest {
	return &rangeRequest{Key: []byte(prefix), RangeEnd: prefixEnd(prefix), Limit: 1, SortOrder: sortDescend, SortTarget: sortByCreate,
		MaxCreateRevision: rev - 1}
}

func countUnder(prefix string) *rangeRequest {
	return &rangeRequest{Key: []byte(prefix), RangeEnd: prefixEnd(prefix), CountOnly: true}
}

func (c *client) rangeKeys(ctx context.Context, r *rangeRequest) (*rangeResponse, error) {
	msg, err := c.call(ctx, methodRange, r.encode())
	if err != nil {
		return nil, err
	}
	return decodeRange(msg)
}

func (c *client) txn(ctx context.Context, t txnRequest) (*txnResponse, error) {
	msg, err := c.call(ctx, methodTxn, t.encode())
	if err != nil {
		return nil, err
	}
	return decodeTxn(msg)
}

func (c *client) deleteRange(ctx context.Context, d deleteRequest) error {
	_, err := c.call(ctx, methodDeleteRange, d.encode())
	return err
}

// grant asks for a lease of ttl seconds; etcd answers with the TTL it
// granted.
func (c *client) grant(ctx context.Context, ttl int64) (id, granted int64, err error) {
	msg, err := c.call(ctx, methodLeaseGrant, pb(nil).varint(1, ttl))
	if err != nil {
		return 0, 0, err
	}
	ints, strs, err := decodeInts(msg)
	switch {
	case err != nil:
		return 0, 0, err
	case len(strs[4]) > 0:
		return 0, 0, &apiError{Code: -1, Message: string(strs[4])}
	case ints[2] == 0:
		return 0, 0, errors.New("etcd granted no lease")
	}
	return ints[2], ints[3], nil
}

// keepAlive renews lease id once: one request on a keep-alive stream of
// its own. A lease that etcd no longer knows comes back with no TTL: that
// is an error for which leaseNotFound is true.
func (c *client) keepAlive(ctx context.Context, id int64) (ttl int64, err error) {
	msg, err := c.call(ctx, methodLeaseKeepAlive, pb(nil).varint(1, id))
	if err != nil {
		return 0, err
	}
	ints, _, err := decodeInts(msg)
	if err != nil {
		return 0, err
	}
	if ints[3] <= 0 {
		return 0, &apiError{Code: codeNotFound, Message: msgLeaseNotFound}
	}
	return ints[3], nil
}

// revoke ends lease id, deleting its keys. A lease that is already gone is
// not an error.
func (c *client) revoke(ctx context.Context, id int64) error {
	_, err := c.call(ctx, methodLeaseRevoke, pb(nil).varint(1, id))
	if leaseNotFound(err) {
		return nil
	}
	return err
}

// timeToLive reads how long lease id has left (-1: etcd does not know it)
// and the TTL it was granted.
func (c *client) timeToLive(ctx context.Context, id int64) (ttl, granted int64, err error) {
	msg, err := c.call(ctx, methodLeaseTimeToLive, pb(nil).varint(1, id))
	if err != nil {
		return 0, 0, err
	}
	ints, _, err := decodeInts(msg)
	return ints[3], ints[4], err
}

// watchEvent is one change a watch reports.
type watchEvent struct {
	Type int64 // eventDelete, or 0 for a put
	Kv   keyValue
}

// watchResponse is one message of a watch stream.
type watchResponse struct {
	Header          header
	Created         bool
	Canceled        bool
	CompactRevision int64
	CancelReason    string
	Events          []watchEvent
}

// watch watches key from revision rev (inclusive) and calls f with each
// batch of events and the revision the batch was sent at, until f returns
// false, ctx ends or the stream does (a broken connection, a compacted
// revision, etcd cancelling the watch); it returns why, nil if f said
// stop. Each watch is a stream of its own, on the member's one connection.
func (c *client) watch(ctx context.Context, key string, rev int64, f func(evs []watchEvent, at int64) bool) error {
	wctx, cancel := context.WithCancel(ctx)
	defer cancel()
	create := pb(nil).bytes(1, []byte(key)).varint(3, rev)
	// The request side ends after the create request; etcd keeps the
	// watch until the stream is cancelled.
	resp, err := c.send(wctx, methodWatch, pb(nil).message(1, create))
	if err != nil {
		return err
	}
	defer resp.Body.Close()
	for {
		msg, err := readMessage(resp.Body)
		switch {
		case ctx.Err() != nil:
			return ctx.Err()
		case err == io.EOF:
			if err := status(resp.Trailer); err != nil {
				return fmt.Errorf("watch %s: %w", key, err)
			}
			return fmt.Errorf("watch %s: the stream ended", key)
		case err != nil:
			return fmt.Errorf("watch %s: %w", key, unwrapURLError(err))
		}
		w, err := decodeWatch(msg)
		switch {
		case err != nil:
			return fmt.Errorf("watch %s: %w", key, err)
		case w.Canceled:
			return fmt.Errorf("watch %s cancelled by etcd (compacted at %d): %s", key, w.CompactRevision, w.CancelReason)
		}
		if !f(w.Events, w.Header.Revision) {
			return nil
		}
	}
}

// LoadTLS builds the client's TLS configuration from PEM files, as etcdctl
// does with --cacert, --cert and --key. Any may be empty; cert and key go
// together.
func LoadTLS(caFile, certFile, keyFile string) (*tls.Config, error) {
	if (certFile == "") != (keyFile == "") {
		return nil, errors.New("a client certificate needs both a certificate and a key file")
	}
	cfg := &tls.Config{MinVersion: tls.VersionTLS12}
	if caFile != "" {
		pem, err := os.ReadFile(caFile)
		if err != nil {
			return nil, err
		}
		pool := x509.NewCertPool()
		if !pool.AppendCertsFromPEM(pem) {
			return nil, fmt.Errorf("%s: no PEM certificate in it", caFile)
		}
		cfg.RootCAs = pool
	}
	if certFile != "" {
		cert, err := tls.LoadX509KeyPair(certFile, keyFile)
		if err != nil {
			return nil, err
		}
		cfg.Certificates = []tls.Certificate{cert}
	}
	return cfg, nil
}
