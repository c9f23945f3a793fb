package s3

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"time"

	"github.com/aws/aws-sdk-go-v2/aws"
	awshttp "github.com/aws/aws-sdk-go-v2/aws/transport/http"
	s3api "github.com/aws/aws-sdk-go-v2/service/s3"
	"github.com/aws/smithy-go"

	"github.com/leaderrun/leaderrun/backends"
)

// Bounds on every request (retries included), on connecting and the wait
// for an answer's headers, on every answer's body, and on an object read
// (the store's objects stay under 100 KiB).
const (
	requestTimeout = 10 * time.Second
	connTimeout    = 5 * time.Second
	maxAnswer      = 1 << 20
	maxObject      = 256 << 10
)

// errAnswer: an answer no S3 server gives, which ends a campaign.
var (
	errAnswer   = errors.New("s3: an answer no S3 server gives")
	errTooLarge = fmt.Errorf("%w: larger than the store's objects can be", errAnswer)
	errNoETag   = fmt.Errorf("%w: no ETag", errAnswer)
)

// bounded is the HTTP client of every S3 request: each attempt cut at the
// store's try bound, and every answer's body capped at maxAnswer: a
// hostile endpoint gets an error, never our memory.
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

// read decodes the object key into v and returns its ETag; "" if there
// is none.
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
// if there is none), and returns the new ETag.
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

// answered is the HTTP status and S3 error code of err's answer, if any.
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

// conflict reports whether a write's condition failed: 412, 404 (If-Match
// on an object gone), or 409 (AWS's, to one of two writes that cross).
func conflict(err error) bool {
	st, code := answered(err)
	return st == http.StatusPreconditionFailed || st == http.StatusConflict || code == "NoSuchKey"
}

// refused reports whether the server refused for good (credentials,
// permissions, a missing bucket, the wrong Region, 501 to conditions), or
// answered as no S3 server does; not throttling nor other 5xx answers.
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
