package cmd

import (
	"cmp"
	"net/url"
	"os"

	"github.com/urfave/cli/v2"

	"github.com/leaderrun/leaderrun/backends"
	"github.com/leaderrun/leaderrun/backends/s3/spec"
)

// s3Flags are the flags of the S3 backend. Credentials, the Region and the
// endpoint are read as the AWS CLI reads them (AWS_PROFILE, AWS_REGION,
// AWS_ENDPOINT_URL_S3, SSO, instance roles, ...), but the AWS_* variables
// never select the store: jobs commonly have them set for their own work.
func s3Flags() []cli.Flag {
	return []cli.Flag{
		&cli.StringFlag{Name: "s3-bucket", Category: categoryStore, EnvVars: []string{"LEADERRUN_S3_BUCKET"},
			Usage: "S3 `BUCKET` of the locks, on AWS or any S3-compatible server with conditional writes; " +
				"served by leaderrun-aws, installed beside leaderrun; " +
				"credentials, Region and endpoint as the AWS CLI reads them (AWS_PROFILE, AWS_REGION, AWS_ENDPOINT_URL_S3, ...)"},
		&cli.StringFlag{Name: "s3-region", Category: categoryStore, EnvVars: []string{"LEADERRUN_S3_REGION"},
			Usage: "AWS `REGION` of the bucket (default: AWS_REGION, else the profile's)"},
		&cli.StringFlag{Name: "s3-endpoint", Category: categoryStore, EnvVars: []string{"LEADERRUN_S3_ENDPOINT"},
			Usage: "S3 endpoint `URL` (MinIO, Ceph, R2, a VPC endpoint; default: AWS_ENDPOINT_URL_S3, else the Region's)"},
		&cli.StringFlag{Name: "s3-addressing-style", Category: categoryStore, EnvVars: []string{"LEADERRUN_S3_ADDRESSING_STYLE"},
			Value: spec.AddressingAuto, Usage: "`STYLE` of the bucket's URLs: path, virtual, or auto (path-style for an endpoint that is not AWS's)"},
	}
}

var s3Store = store{
	name:     "s3",
	flags:    s3Flags,
	selected: s3Selected,
	open:     newS3Backend,
	handOver: handOverS3,
	address:  "--s3-bucket (LEADERRUN_S3_BUCKET)",
	// AWS credentials are as often the job's own access to AWS: nothing
	// is removed.
	risks: s3Risks,
}

// s3Selected: an S3 flag, or its variable (LEADERRUN_S3_BUCKET, _REGION,
// _ENDPOINT, _ADDRESSING_STYLE), selects the store; AWS_* variables never
// do.
func s3Selected(c *cli.Context) bool {
	for _, f := range []string{"s3-bucket", "s3-region", "s3-endpoint", "s3-addressing-style"} {
		if c.IsSet(f) {
			return true
		}
	}
	return false
}

// openS3 opens the S3 backend: nil in the leaderrun binary, which leaves
// the AWS SDK out and hands an S3 run over to the companion leaderrun-aws
// (companion.go); leaderrun-aws sets it with RegisterS3.
var openS3 func(spec.Settings) (backends.Store, error)

// RegisterS3 links the S3 backend in: leaderrun-aws's main calls it,
// before Main.
func RegisterS3(open func(spec.Settings) (backends.Store, error)) { openS3 = open }

// handOverS3: a leaderrun without the S3 backend checks the S3 flags, then
// becomes leaderrun-aws.
func handOverS3(c *cli.Context, cfg storeConfig) error {
	if openS3 != nil {
		return nil
	}
	if _, err := s3Settings(c, cfg); err != nil {
		return err
	}
	return handOver(c, awsCompanion, "S3")
}

// newS3Backend validates the S3 flags and opens the store. Nothing is
// sent: a bucket that cannot be reached, or a request refused, shows in
// the first request, as exit 69 naming the bucket.
func newS3Backend(c *cli.Context, cfg storeConfig) (backends.Store, error) {
	s, err := s3Settings(c, cfg)
	if err != nil {
		return nil, err
	}
	if openS3 == nil {
		// handOverS3 ran before anything was started.
		return nil, errNoBackend
	}
	if s.Log, err = newLogger(c, os.Stderr); err != nil {
		return nil, err
	}
	b, err := openS3(s)
	if err != nil {
		return nil, usageErrorf("%v", err)
	}
	return b, nil
}

// s3Settings reads and checks the S3 flags.
func s3Settings(c *cli.Context, cfg storeConfig) (spec.Settings, error) {
	bucket := c.String("s3-bucket")
	if bucket == "" {
		return spec.Settings{}, usageErrorf("--s3-bucket (LEADERRUN_S3_BUCKET) is required for the s3 store")
	}
	if err := spec.ValidateBucket(bucket); err != nil {
		return spec.Settings{}, usageErrorf("--s3-bucket (LEADERRUN_S3_BUCKET): %v", err)
	}
	if err := spec.ValidatePrefix(cfg.Prefix); err != nil {
		return spec.Settings{}, usageErrorf("--prefix: %v", err)
	}
	if err := spec.ValidateAddressing(c.String("s3-addressing-style")); err != nil {
		return spec.Settings{}, usageErrorf("--s3-addressing-style (LEADERRUN_S3_ADDRESSING_STYLE): %v", err)
	}
	endpoint := c.String("s3-endpoint")
	if endpoint != "" {
		// Checked for user information before it is parsed: a parser
		// takes a password holding "/" for a host and a path.
		if backends.Redact(endpoint) != endpoint {
			return spec.Settings{}, usageErrorf("--s3-endpoint %q: want a URL without user information (credentials as the AWS CLI reads them)", backends.Redact(endpoint))
		}
		if u, err := url.Parse(endpoint); err != nil || (u.Scheme != "http" && u.Scheme != "https") || u.Host == "" {
			return spec.Settings{}, usageErrorf("--s3-endpoint %q: want an http:// or https:// URL", endpoint)
		}
	}
	return spec.Settings{Bucket: bucket, Region: c.String("s3-region"), Endpoint: endpoint,
		Addressing: c.String("s3-addressing-style"), Prefix: cfg.Prefix}, nil
}

// s3Risks: requests signed with the AWS credentials, to an endpoint across
// the network over plain HTTP, where they can be read and replayed for
// minutes.
func s3Risks(c *cli.Context, _ map[string]bool) []string {
	// The endpoint the SDK will use: the flag's, else the variables'.
	endpoint := cmp.Or(c.String("s3-endpoint"), os.Getenv("AWS_ENDPOINT_URL_S3"), os.Getenv("AWS_ENDPOINT_URL"))
	if host, plain := plainHTTP(endpoint); plain && remote(host) {
		return []string{inClear("requests signed with the AWS credentials", host, "https://")}
	}
	return nil
}
