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

// Bounds on what is read from the network: DynamoDB's largest item is
// 400 KB and the store's stay under 100 KiB, so an answer over 1 MiB is
// not one it asked for.
const (
	maxAnswerBytes = 1 << 20
	maxHeaderBytes = 64 << 10
)

var errAnswerTooLarge = fmt.Errorf("dynamodb: answer larger than %d bytes", maxAnswerBytes)

// cappedClient bounds every answer's body at maxAnswerBytes (the SDK
// reads whole bodies), and each attempt, answer read included, by try()
// (zero: no bound of its own).
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

// cappedBody fails, rather than truncates, a body longer than left.
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

// newHTTPClient is the client of every request the SDK sends, credential
// lookups included: each attempt bounded by timeout, headers bounded, no
// transparent decompression. It is the SDK's own buildable client, so
// that a CA bundle and proxies from the environment apply.
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

// newClient builds the service client: the AWS configuration read as the
// AWS CLI reads it (credentials are fetched on the first request), with
// cfg's Region, endpoint and credentials, within the bounds above.
func newClient(cfg Config, try func() time.Duration) (*dynamodb.Client, string, error) {
	ctx, cancel := context.WithTimeout(context.Background(), requestTimeout)
	defer cancel()
	opts := []func(*config.LoadOptions) error{config.WithHTTPClient(newHTTPClient(connTimeout)), config.WithLogger(sdkLogger(cfg.Log))}
	if cfg.Region != "" {
		opts = append(opts, config.WithRegion(cfg.Region))
	}
	awsCfg, err := config.LoadDefaultConfig(ctx, opts...)
	switch {
	case err != nil:
		return nil, "", fmt.Errorf("dynamodb: load the AWS configuration: %w", err)
	case awsCfg.Region == "":
		return nil, "", errors.New("dynamodb: no AWS region: set AWS_REGION, a profile's region, or --dynamodb-region")
	case cfg.Credentials != nil:
		awsCfg.Credentials = cfg.Credentials
	}
	return dynamodb.NewFromConfig(awsCfg, func(o *dynamodb.Options) {
		if cfg.Endpoint != "" {
			o.BaseEndpoint = aws.String(cfg.Endpoint)
		}
		// The SDK retries throttling, 5xx answers, broken connections and
		// transaction conflicts, 3 attempts at most, never beyond the
		// caller's context (a renewal's is the runner's attempt timeout).
		// Its retry quota is off: after a long outage it still retries.
		o.Retryer = retry.AddWithErrorCodes(retry.NewStandard(func(so *retry.StandardOptions) {
			so.MaxAttempts, so.MaxBackoff, so.RateLimiter = 3, 500*time.Millisecond, ratelimit.None
		}), "TransactionConflictException")
		o.HTTPClient = cappedClient{inner: awsCfg.HTTPClient, try: try}
	}), awsCfg.Region, nil
}

// isNotFound: the table does not exist (or is still being created).
func isNotFound(err error) bool {
	var rnf *types.ResourceNotFoundException
	return errors.As(err, &rnf)
}

func isConditionFailed(err error) bool {
	var ccf *types.ConditionalCheckFailedException
	return errors.As(err, &ccf)
}

// transient are the error codes of answers that may go away by themselves.
var transient = map[string]bool{"ThrottlingException": true, "ProvisionedThroughputExceededException": true,
	"RequestLimitExceeded": true, "TransactionConflictException": true, "TransactionInProgressException": true,
	"LimitExceededException": true, "InternalServerError": true, "ServiceUnavailable": true}

// isRefusal reports whether DynamoDB refused a request for a reason that
// retrying will not change: credentials, permissions, a malformed request.
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

// sdkLogger sends the SDK's own lines to leaderrun's log, not stderr.
func sdkLogger(log *slog.Logger) logging.Logger {
	return logging.LoggerFunc(func(c logging.Classification, format string, v ...any) {
		level := slog.LevelDebug
		if c == logging.Warn {
			level = slog.LevelWarn
		}
		log.Log(context.Background(), level, fmt.Sprintf(format, v...), "source", "aws-sdk-go-v2")
	})
}
