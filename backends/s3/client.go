package s3

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/http"
	"time"

	"github.com/aws/aws-sdk-go-v2/aws"
	awshttp "github.com/aws/aws-sdk-go-v2/aws/transport/http"
	"github.com/aws/aws-sdk-go-v2/config"
	s3api "github.com/aws/aws-sdk-go-v2/service/s3"
	"github.com/aws/smithy-go"
	"github.com/aws/smithy-go/logging"

	"github.com/leaderrun/leaderrun/backends"
)

const (
	// requestTimeout bounds every request, its retries included.
	requestTimeout = 10 * time.Second
	// connTimeout bounds connecting, the TLS handshake and the wait for an
	// answer's headers.
	connTimeout = 5 * time.Second
	// maxAnswer caps the body of every answer (error documents included),
	// maxObject an object read: the store's objects stay under 100 KiB
	// (a lease with its markers, a state with its history).
	maxAnswer = 1 << 20
	maxObject = 256 << 10
)

// errAnswer: an answer no S3 server gives, which ends a campaign.
var (
	errAnswer   = errors.New("s3: an answer no S3 server gives")
	errTooLarge = fmt.Errorf("%w: larger than the store's objects can be", errAnswer)
	errNoETag   = fmt.Errorf("%w: no ETag", errAnswer)
)

// loadConfig reads the configuration as the AWS CLI does: credentials from
// the environment, the shared files (profiles, SSO, credential processes),
// web identity or the container or instance metadata service; the Region
// from cfg, else AWS_REGION or the profile. Every request the SDK sends,
// credential lookups included, goes through one HTTP client whose dials,
// handshakes and answers' headers are bounded.
func loadConfig(ctx context.Context, cfg Config) (aws.Config, error) {
	httpc := awshttp.NewBuildableClient().WithTimeout(requestTimeout).
		WithDialerOptions(func(d *net.Dialer) { d.Timeout = connTimeout }).
		WithTransportOptions(func(tr *http.Transport) {
			tr.TLSHandshakeTimeout, tr.ResponseHeaderTimeout = connTimeout, connTimeout
			tr.MaxResponseHeaderBytes, tr.MaxIdleConnsPerHost, tr.DisableCompression = 64<<10, 2, true
		})
	log := cfg.Log
	if log == nil {
		log = slog.New(slog.DiscardHandler)
	}
	opts := []func(*config.LoadOptions) error{config.WithHTTPClient(httpc), config.WithLogger(logging.LoggerFunc(
		func(c logging.Classification, format string, v ...any) {
			log.Warn(fmt.Sprintf(format, v...), "source", "aws-sdk-go-v2", "class", string(c))
		}))}
	if cfg.Region != "" {
		opts = append(opts, config.WithRegion(cfg.Region))
	}
	awsCfg, err := config.LoadDefaultConfig(ctx, opts...)
	switch {
	case err != nil:
		return aws.Config{}, fmt.Errorf("s3: load the AWS configuration: %w", err)
	case awsCfg.Region == "":
		return aws.Config{}, errors.New("s3: no AWS region: set AWS_REGION, a profile's region, or --s3-region")
	case cfg.Credentials != nil:
		awsCfg.Credentials = cfg.Credentials
	}
	return awsCfg, nil
}

// bounded is the HTTP client of every S3 request: each attempt cut at the
// store's try bound, and every answer's body capped at maxAnswer, so that
// a hostile endpoint gets an error, never our memory.
type bounded struct {
	inner aws.HTTPClient
	s     *Store
}

func (b bounded) Do(req *http.Request) (*http.Response, error) {
	ctx, cancel := req.Context(), context.CancelFunc(func() {})
	if d := time.Duration(b.s.try.Load()); d > 0 {
		ctx, cancel = context.WithTimeout(ctx, d)
	}
	resp, err := b.inner.Do(req.WithContext(ctx))
	if err == nil && resp.ContentLength > maxAnswer {
		resp.Body.Close()
		err = fmt.Errorf("%w: Content-Length %d", errTooLarge, resp.ContentLength)
	}
	if err != nil {
		cancel()
		return nil, err
	}
	resp.Body = &capped{ReadCloser: resp.Body, cancel: cancel}
	return resp, nil
}

// capped fails a read once more than maxAnswer bytes came.
type capped struct {
	io.ReadCloser
	n      int
	cancel context.CancelFunc
}

func (c *capped) Read(p []byte) (int, error) {
	n, err := c.ReadCloser.Read(p)
	if c.n += n; c.n > maxAnswer {
		return 0, errTooLarge
	}
	return n, err
}

func (c *capped) Close() error {
	defer c.cancel()
	return c.ReadCloser.Close()
}

// read decodes the object key into v and returns its ETag; "" and v
// untouched if there is none.
func (s *Store) read(ctx context.Context, key string, v any) (string, error) {
	ctx, cancel := context.WithTimeout(ctx, requestTimeout)
	defer cancel()
	out, err := s.api.GetObject(ctx, &s3api.GetObjectInput{Bucket: &s.bucket, Key: &key})
	if _, code := answered(err); code == "NoSuchKey" {
		return "", nil
	} else if err != nil {
		return "", s.failed("read", key, err)
	}
	defer out.Body.Close()
	data, err := io.ReadAll(io.LimitReader(out.Body, maxObject+1))
	switch {
	case err != nil:
		return "", s.failed("read", key, err)
	case len(data) > maxObject:
		return "", s.failed("read", key, fmt.Errorf("%w: over %d bytes", errTooLarge, maxObject))
	case aws.ToString(out.ETag) == "":
		return "", s.failed("read", key, errNoETag)
	case json.Unmarshal(data, v) != nil:
		return "", fmt.Errorf("s3 bucket %s: object %s is not leaderrun's (delete it to free the lock): %w: %w: %w",
			s.bucket, key, backends.ErrCorruptState, backends.ErrUnavailable, backends.ErrRefused)
	}
	return *out.ETag, nil
}

// write replaces the object key with v if its ETag is still etag ("":
// only if there is none), and returns the new ETag. An error for which
// conflict is true says that the condition did not hold.
func (s *Store) write(ctx context.Context, key string, v any, etag string) (string, error) {
	ctx, cancel := context.WithTimeout(ctx, requestTimeout)
	defer cancel()
	data, err := json.Marshal(v)
	if err != nil {
		return "", err
	}
	in := &s3api.PutObjectInput{Bucket: &s.bucket, Key: &key, Body: bytes.NewReader(data), ContentType: aws.String("application/json")}
	if etag == "" {
		in.IfNoneMatch = aws.String("*")
	} else {
		in.IfMatch = &etag
	}
	out, err := s.api.PutObject(ctx, in)
	if err == nil && aws.ToString(out.ETag) == "" {
		err = errNoETag
	}
	if err != nil {
		return "", err
	}
	return *out.ETag, nil
}

// answered is the HTTP status and the S3 error code of the answer that
// err reports: 0 and "" if none came.
func answered(err error) (status int, code string) {
	var re *awshttp.ResponseError
	if errors.As(err, &re) {
		status = re.HTTPStatusCode()
	}
	if ae := smithy.APIError(nil); errors.As(err, &ae) {
		code = ae.ErrorCode()
	}
	return status, code
}

// conflict reports whether a conditional write failed its condition: 412,
// or the object gone (404 NoSuchKey, for If-Match), or 409, which S3 sends
// to one of two conditional writes of a key that cross.
func conflict(err error) bool {
	st, code := answered(err)
	return st == http.StatusPreconditionFailed || st == http.StatusConflict || code == "NoSuchKey"
}

// refused reports whether the server refused a request for good, or
// answered as no S3 server does: credentials, permissions, a missing
// bucket, the wrong Region, conditions it does not implement (501), an
// answer too large. Network errors, timeouts, throttling and other 5xx
// answers are not.
func refused(err error) bool {
	st, code := answered(err)
	switch {
	case errors.Is(err, errAnswer):
		return true
	case st == http.StatusRequestTimeout || st == http.StatusTooManyRequests || code == "RequestTimeout" || code == "SlowDown":
		return false
	}
	return st >= 300 && st < 500 || st == http.StatusNotImplemented
}
