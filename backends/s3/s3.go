// Package s3 is the S3 store: a lock is an object in a bucket of any
// S3-compatible service, created with If-None-Match: * and replaced with
// If-Match on the ETag last read. S3 has no clock a client can use and
// tells nobody of a change, so every write of a lock object gives it a new
// ETag, and the others time the holder on their own clocks: a
// backends.RecordLock without a clock, timed by the campaign driver
// (backends/record.go).
//
// Each lock is two objects, JSON both:
//
//	<prefix><lock>         the lease: holder, owner, token, lease_ms, acquired, renewed, holders, rvn, markers
//	<prefix><lock>~state   the token's high-water mark and the history: mark, rvn, history
//
// rvn is 128 random bits, new at every write: an ETag is the content's MD5
// on most servers, and two writes of the same content must never share
// one. A grant raises the mark (conditional on the state object's ETag as
// read) to max(mark, token in the lease) + 1, then writes that token into
// the lease object, conditional on the ETag the candidate timed; where
// there is no lease object, it creates a free one first and takes that, so
// that every grant is conditional on an object read before its mark was.
// Every write is conditional and no two share an ETag, so the token grows
// even if one of the two objects is deleted: docs/backends/s3.md has the
// argument, and what a server that ignores conditions does to it.
package s3

import (
	"context"
	"fmt"
	"net/url"
	"strings"
	"sync/atomic"
	"time"

	"github.com/aws/aws-sdk-go-v2/aws"
	"github.com/aws/aws-sdk-go-v2/aws/ratelimit"
	"github.com/aws/aws-sdk-go-v2/aws/retry"
	s3api "github.com/aws/aws-sdk-go-v2/service/s3"

	"github.com/leaderrun/leaderrun/backends"
	"github.com/leaderrun/leaderrun/backends/s3/spec"
)

// Config describes one bucket: the settings the command line reads
// (spec.Settings, whose zero values are noted there) and the credentials.
type Config struct {
	spec.Settings
	// Credentials replace the SDK's default credential chain. Nil: the
	// chain (environment, shared files and profiles, SSO, web identity,
	// container and instance metadata).
	Credentials aws.CredentialsProvider
}

// Store is one bucket, reached by one client.
type Store struct {
	api    *s3api.Client
	bucket string
	where  string // the Region, and the endpoint if one is set
	prefix string
	// try bounds each HTTP attempt to half the runner's attempt timeout
	// once a campaign told it, so that a request stuck on a dead
	// connection is sent again on a fresh one within one renewal. Zero:
	// connTimeout alone.
	try atomic.Int64
}

var _ backends.Store = (*Store)(nil)

// Open validates cfg and reads the AWS configuration (environment, shared
// files), but sends nothing until a lock is first used.
func Open(cfg Config) (*Store, error) {
	for _, err := range []error{spec.ValidateBucket(cfg.Bucket), spec.ValidatePrefix(cfg.Prefix), spec.ValidateAddressing(cfg.Addressing)} {
		if err != nil {
			return nil, err
		}
	}
	ctx, cancel := context.WithTimeout(context.Background(), requestTimeout)
	defer cancel()
	awsCfg, err := loadConfig(ctx, cfg)
	if err != nil {
		return nil, err
	}
	s := &Store{bucket: cfg.Bucket, prefix: cfg.Prefix}
	s.api = s3api.NewFromConfig(awsCfg, func(o *s3api.Options) { s.configure(o, cfg) })
	s.where = "region " + awsCfg.Region
	if ep := aws.ToString(s.api.Options().BaseEndpoint); ep != "" {
		s.where += " at " + backends.Redact(ep)
	}
	return s, nil
}

// configure sets the S3 client's options: the endpoint and its addressing
// style; the SDK's standard retries of throttling, 5xx answers and broken
// connections, 3 attempts at most with at most 500 ms between them, and
// no client-side quota (a long outage would leave it unable to retry once
// it is over); every attempt bounded (bounded); and checksums only where
// the API requires them, as S3-compatible servers may not know the newer
// ones, unless the AWS configuration asks for more.
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

// pathStyle decides the addressing style: path-style for an endpoint that
// is not AWS's (MinIO, Ceph and versitygw need it unless their DNS names
// every bucket), virtual-hosted on AWS.
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

// Lock implements backends.Store: the objects <prefix><name> and
// <prefix><name>~state.
func (s *Store) Lock(name string) backends.Lock {
	return &lock{s: s, key: s.prefix + name, state: s.prefix + name + spec.StateSuffix}
}

// Close implements backends.Store. The SDK's client keeps idle
// connections for 30 s; it has nothing to close.
func (s *Store) Close() error { return nil }

// learn bounds each HTTP attempt by the timings of a campaign.
func (s *Store) learn(t backends.Timings) { s.try.CompareAndSwap(0, int64(t.AttemptTimeout()/2)) }

// failed wraps err of op on the object key: it names the bucket, the
// Region, the endpoint and the object, never a credential; a refusal is
// final.
func (s *Store) failed(op, key string, err error) error {
	if refused(err) {
		return fmt.Errorf("s3 bucket %s in %s: %s %s: %w: %w: %w", s.bucket, s.where, op, key, backends.ErrUnavailable, backends.ErrRefused, err)
	}
	return fmt.Errorf("s3 bucket %s in %s: %s %s: %w: %w", s.bucket, s.where, op, key, backends.ErrUnavailable, err)
}

// timeNow is the wall clock written into objects, for status and --try
// only; UTC, to the millisecond.
func timeNow() time.Time { return time.Now().UTC().Truncate(time.Millisecond) }
