package dynamodb

import (
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/http"
	"time"

	"github.com/aws/aws-sdk-go-v2/aws"
	"github.com/aws/aws-sdk-go-v2/aws/ratelimit"
	"github.com/aws/aws-sdk-go-v2/aws/retry"
	awshttp "github.com/aws/aws-sdk-go-v2/aws/transport/http"
	"github.com/aws/aws-sdk-go-v2/config"
	"github.com/aws/aws-sdk-go-v2/service/dynamodb"
	"github.com/aws/aws-sdk-go-v2/service/dynamodb/types"
	"github.com/aws/smithy-go"
	"github.com/aws/smithy-go/logging"
)

// Bounds on what the backend reads from the network. DynamoDB's largest
// item is 400 KB; the backend's own items stay under 100 KiB (see the
// package doc), so an answer over 1 MiB is not one it asked for.
const (
	maxAnswerBytes = 1 << 20
	maxHeaderBytes = 64 << 10
)

// Retries: the SDK retries throttling, 5xx answers and broken connections,
// at most maxAttempts attempts in all per call, with jittered backoff of at
// most maxBackoff in between, and never beyond the caller's context: a
// renewal's context is the runner's attempt timeout, so the retries of one
// renewal fit in it. The SDK's client-side retry quota is off, so that a
// long outage does not leave the backend unable to retry once it is over.
const (
	maxAttempts = 3
	maxBackoff  = 500 * time.Millisecond
)

// errAnswerTooLarge is returned, while an answer is read, once it has
// passed maxAnswerBytes.
var errAnswerTooLarge = fmt.Errorf("dynamodb: answer larger than %d bytes", maxAnswerBytes)

// cappedClient bounds every answer's body at maxAnswerBytes: the SDK
// reads whole bodies, and a hostile endpoint must get an error, never our
// memory. It also bounds each attempt, answer read included, by try()
// (zero: only by the caller's context and connTimeout).
type cappedClient struct {
	inner aws.HTTPClient
	try   func() time.Duration
}

func (c cappedClient) Do(req *http.Request) (*http.Response, error) {
	cancel := context.CancelFunc(func() {})
	if d := c.try(); d > 0 {
		var ctx context.Context
		ctx, cancel = context.WithTimeout(req.Context(), d)
		req = req.WithContext(ctx)
	}
	resp, err := c.inner.Do(req)
	if err != nil {
		cancel()
		return nil, err
	}
	if resp.ContentLength > maxAnswerBytes {
		resp.Body.Close()
		cancel()
		return nil, fmt.Errorf("%w: Content-Length %d", errAnswerTooLarge, resp.ContentLength)
	}
	resp.Body = &cappedBody{rc: resp.Body, left: maxAnswerBytes, cancel: cancel}
	return resp, nil
}

// cappedBody reads at most left bytes, and fails (rather than truncates)
// if the body goes on beyond them.
type cappedBody struct {
	rc     io.ReadCloser
	left   int64
	cancel context.CancelFunc // ends the attempt's own deadline
}

func (b *cappedBody) Read(p []byte) (int, error) {
	if b.left <= 0 {
		var one [1]byte
		if n, err := b.rc.Read(one[:]); n > 0 {
			return 0, errAnswerTooLarge
		} else if err != nil {
			return 0, err
		}
		return 0, nil
	}
	if int64(len(p)) > b.left {
		p = p[:b.left]
	}
	n, err := b.rc.Read(p)
	b.left -= int64(n)
	return n, err
}

func (b *cappedBody) Close() error {
	defer b.cancel()
	return b.rc.Close()
}

// newHTTPClient is the client of every request the SDK sends for the
// backend, credential lookups (STS, SSO, IMDS) included: each attempt
// bounded by timeout, headers bounded, no transparent decompression (the
// SDK asks DynamoDB for identity encoding). It is the SDK's own buildable
// client, so that a CA bundle (AWS_CA_BUNDLE, a profile's ca_bundle) and
// proxies from the environment apply; the DynamoDB client wraps it in
// cappedClient.
func newHTTPClient(timeout time.Duration) *awshttp.BuildableClient {
	return awshttp.NewBuildableClient().
		WithTimeout(timeout).
		WithDialerOptions(func(d *net.Dialer) { d.Timeout = min(timeout, 10*time.Second) }).
		WithTransportOptions(func(tr *http.Transport) {
			tr.TLSHandshakeTimeout = min(timeout, 10*time.Second)
			tr.ResponseHeaderTimeout = timeout
			tr.MaxIdleConnsPerHost = 2
			tr.IdleConnTimeout = 30 * time.Second
			tr.MaxResponseHeaderBytes = maxHeaderBytes
			tr.DisableCompression = true
		})
}

// loadAWSConfig reads the configuration as the AWS CLI does: credentials
// from the environment, the shared files (profiles, SSO, credential
// processes), web identity or the container or instance metadata service;
// the region from region, else AWS_REGION or the profile. Nothing is sent
// yet: credentials are fetched on the first request.
func loadAWSConfig(ctx context.Context, region string, httpc *awshttp.BuildableClient, log *slog.Logger) (aws.Config, error) {
	opts := []func(*config.LoadOptions) error{config.WithHTTPClient(httpc), config.WithLogger(sdkLogger(log))}
	if region != "" {
		opts = append(opts, config.WithRegion(region))
	}
	cfg, err := config.LoadDefaultConfig(ctx, opts...)
	if err != nil {
		return aws.Config{}, fmt.Errorf("dynamodb: load the AWS configuration: %w", err)
	}
	if cfg.Region == "" {
		return aws.Config{}, errors.New("dynamodb: no AWS region: set AWS_REGION, a profile's region, or --dynamodb-region")
	}
	return cfg, nil
}

// newRetryer is the SDK's standard retryer within the bounds above;
// TransactionConflictException (a write that met a transaction in flight on
// the same item) is retried too.
func newRetryer() aws.Retryer {
	r := retry.NewStandard(func(o *retry.StandardOptions) {
		o.MaxAttempts = maxAttempts
		o.MaxBackoff = maxBackoff
		o.RateLimiter = ratelimit.None
	})
	return retry.AddWithErrorCodes(r, "TransactionConflictException")
}

// newDynamoDB builds the service client; endpoint, if set, overrides the
// one the SDK resolves (AWS_ENDPOINT_URL_DYNAMODB, AWS_ENDPOINT_URL, the
// profile's, else the region's).
func newDynamoDB(cfg aws.Config, endpoint string, try func() time.Duration) *dynamodb.Client {
	return dynamodb.NewFromConfig(cfg, func(o *dynamodb.Options) {
		if endpoint != "" {
			o.BaseEndpoint = aws.String(endpoint)
		}
		o.Retryer = newRetryer()
		o.HTTPClient = cappedClient{inner: cfg.HTTPClient, try: try}
	})
}

// apiCode is the error code of a DynamoDB error answer, "" if err is none.
func apiCode(err error) string {
	var ae smithy.APIError
	if errors.As(err, &ae) {
		return ae.ErrorCode()
	}
	return ""
}

// isNotFound reports whether DynamoDB said that the table does not exist
// (or is still being created).
func isNotFound(err error) bool {
	var rnf *types.ResourceNotFoundException
	return errors.As(err, &rnf)
}

// isConditionFailed reports whether a conditional write was refused
// because its condition did not hold.
func isConditionFailed(err error) bool {
	var ccf *types.ConditionalCheckFailedException
	return errors.As(err, &ccf)
}

// transient are the error codes of answers that may go away by themselves:
// throttling, and conflicts with a transaction in flight.
var transient = map[string]bool{
	"ThrottlingException":                    true,
	"ProvisionedThroughputExceededException": true,
	"RequestLimitExceeded":                   true,
	"TransactionConflictException":           true,
	"TransactionInProgressException":         true,
	"LimitExceededException":                 true,
	"InternalServerError":                    true,
	"ServiceUnavailable":                     true,
}

// isRefusal reports whether DynamoDB refused a request for a reason that
// will not go away by retrying it: credentials, permissions, a malformed
// request, a missing table. Network errors and 5xx answers are not.
func isRefusal(err error) bool {
	var ae smithy.APIError
	if !errors.As(err, &ae) {
		return false
	}
	var re *awshttp.ResponseError
	if errors.As(err, &re) && re.HTTPStatusCode() >= http.StatusInternalServerError {
		return false
	}
	return ae.ErrorFault() != smithy.FaultServer && !transient[ae.ErrorCode()]
}

// sdkLogger sends the SDK's own log lines (its warnings: a body it could
// not close, a clock skew) to leaderrun's log, marked source=aws-sdk-go-v2,
// instead of the SDK's default, a logger of its own on stderr.
func sdkLogger(log *slog.Logger) logging.Logger {
	return logging.LoggerFunc(func(c logging.Classification, format string, v ...any) {
		level := slog.LevelDebug
		if c == logging.Warn {
			level = slog.LevelWarn
		}
		log.Log(context.Background(), level, fmt.Sprintf(format, v...), "source", "aws-sdk-go-v2")
	})
}
