// Package s3 is the S3 store: a lock is an object in a bucket of any
// S3-compatible server, written with If-None-Match: * or If-Match on the
// ETag read, a backends.RecordLock without a clock. Every write carries
// 128 random bits (rvn), so no ETag ever comes back. Beside the lock
// object <prefix><lock> (holder, token, lease, markers), the state object
// <prefix><lock>~state keeps the token's high-water mark and the history.
// A grant raises the mark to max(mark, token in the lock object) + 1, then
// writes the lock object, conditional on it as read (created free first
// if missing): a grant reads what every grant before it wrote, in one
// object or the other, so the token grows even if one is deleted
// (docs/backends/s3.md has the argument).
package s3

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"net/http"
	"net/url"
	"strings"
	"sync/atomic"
	"time"

	"github.com/aws/aws-sdk-go-v2/aws"
	"github.com/aws/aws-sdk-go-v2/aws/ratelimit"
	"github.com/aws/aws-sdk-go-v2/aws/retry"
	awshttp "github.com/aws/aws-sdk-go-v2/aws/transport/http"
	"github.com/aws/aws-sdk-go-v2/config"
	s3api "github.com/aws/aws-sdk-go-v2/service/s3"
	"github.com/aws/smithy-go/logging"

	"github.com/leaderrun/leaderrun/backends"
	"github.com/leaderrun/leaderrun/backends/s3/spec"
)

// Config is the settings the command line reads, and credentials that
// replace the SDK's default chain (nil: the chain).
type Config struct {
	spec.Settings
	Credentials aws.CredentialsProvider
}

// Store is one bucket, reached by one client.
type Store struct {
	api                   *s3api.Client
	bucket, where, prefix string // where: the Region, and the endpoint if set
	// try bounds each HTTP attempt to half the runner's attempt timeout,
	// once a campaign told it (zero: none): a request stuck on a dead
	// connection is retried within one renewal.
	try atomic.Int64
}

// Open validates cfg and reads the AWS configuration as the AWS CLI does;
// it sends nothing. Every request, credential lookups included, goes
// through one bounded HTTP client; the SDK's warnings go to cfg.Log.
func Open(cfg Config) (*Store, error) {
	for _, err := range []error{spec.ValidateBucket(cfg.Bucket), spec.ValidatePrefix(cfg.Prefix), spec.ValidateAddressing(cfg.Addressing)} {
		if err != nil {
			return nil, err
		}
	}
	httpc := awshttp.NewBuildableClient().WithTimeout(requestTimeout).
		WithDialerOptions(func(d *net.Dialer) { d.Timeout = connTimeout }).
		WithTransportOptions(func(tr *http.Transport) {
			tr.TLSHandshakeTimeout, tr.ResponseHeaderTimeout = connTimeout, connTimeout
			tr.MaxResponseHeaderBytes, tr.MaxIdleConnsPerHost, tr.DisableCompression = 64<<10, 2, true
		})
	log := cmp.Or(cfg.Log, slog.New(slog.DiscardHandler))
	opts := []func(*config.LoadOptions) error{config.WithHTTPClient(httpc), config.WithRegion(cfg.Region),
		config.WithLogger(logging.LoggerFunc(func(c logging.Classification, format string, v ...any) {
			log.Warn(fmt.Sprintf(format, v...), "source", "aws-sdk-go-v2", "class", string(c))
		}))}
	ctx, cancel := context.WithTimeout(context.Background(), requestTimeout)
	defer cancel()
	awsCfg, err := config.LoadDefaultConfig(ctx, opts...)
	switch {
	case err != nil:
		return nil, fmt.Errorf("s3: load the AWS configuration: %w", err)
	case awsCfg.Region == "":
		return nil, errors.New("s3: no AWS region: set AWS_REGION, a profile's region, or --s3-region")
	case cfg.Credentials != nil:
		awsCfg.Credentials = cfg.Credentials
	}
	s := &Store{bucket: cfg.Bucket, prefix: cfg.Prefix}
	s.api = s3api.NewFromConfig(awsCfg, func(o *s3api.Options) { s.configure(o, cfg) })
	s.where = "region " + awsCfg.Region
	if ep := aws.ToString(s.api.Options().BaseEndpoint); ep != "" {
		s.where += " at " + backends.Redact(ep)
	}
	return s, nil
}

// configure sets the endpoint and addressing style; at most 3 attempts
// 500 ms apart, no client-side retry quota (a long outage would use it
// up); every attempt bounded; checksums only where required, unless the
// AWS configuration asks for more (S3-compatible servers may not know the
// newer ones).
func (s *Store) configure(o *s3api.Options, cfg Config) {
	if cfg.Endpoint != "" {
		o.BaseEndpoint = aws.String(cfg.Endpoint)
	}
	o.UsePathStyle = pathStyle(cfg.Addressing, aws.ToString(o.BaseEndpoint))
	o.Retryer = retry.NewStandard(func(r *retry.StandardOptions) {
		r.MaxAttempts, r.MaxBackoff, r.RateLimiter = 3, 500*time.Millisecond, ratelimit.None
	})
	o.HTTPClient = bounded{inner: o.HTTPClient, s: s}
	if o.RequestChecksumCalculation == aws.RequestChecksumCalculationUnset {
		o.RequestChecksumCalculation = aws.RequestChecksumCalculationWhenRequired
	}
	if o.ResponseChecksumValidation == aws.ResponseChecksumValidationUnset {
		o.ResponseChecksumValidation = aws.ResponseChecksumValidationWhenRequired
	}
}

// pathStyle: path-style for an endpoint that is not AWS's (MinIO, Ceph and
// versitygw need it unless their DNS names every bucket).
func pathStyle(style, endpoint string) bool {
	switch style {
	case spec.AddressingPath:
		return true
	case spec.AddressingVirtual:
		return false
	}
	u, err := url.Parse(endpoint)
	return endpoint != "" && (err != nil || !strings.HasSuffix(strings.ToLower(u.Hostname()), ".amazonaws.com"))
}

// Name implements backends.Store.
func (s *Store) Name() string { return "s3" }

// Lock implements backends.Store.
func (s *Store) Lock(n string) backends.Lock {
	return &lock{s: s, key: s.prefix + n, state: s.prefix + n + spec.StateSuffix}
}

// Close implements backends.Store: the client has nothing to close.
func (s *Store) Close() error { return nil }

// failed wraps err of op on the object key, naming where, never a
// credential: a conflict if a write's condition failed; a refusal is final.
func (s *Store) failed(op, key string, err error) error {
	switch {
	case conflict(err):
		return fmt.Errorf("s3: %s %s/%s: %w: %w", op, s.bucket, key, backends.ErrConflict, err)
	case refused(err):
		return fmt.Errorf("s3 bucket %s in %s: %s %s: %w: %w: %w", s.bucket, s.where, op, key, backends.ErrUnavailable, backends.ErrRefused, err)
	}
	return fmt.Errorf("s3 bucket %s in %s: %s %s: %w: %w", s.bucket, s.where, op, key, backends.ErrUnavailable, err)
}
