package cmd

import (
	"net/url"
	"os"

	"github.com/urfave/cli/v2"

	"github.com/leaderrun/leaderrun/backends"
	"github.com/leaderrun/leaderrun/backends/dynamodb/spec"
)

// dynamodbFlags are the flags of the DynamoDB backend. Credentials, the
// Region and the endpoint are read as the AWS CLI reads them
// (AWS_PROFILE, AWS_REGION, AWS_ENDPOINT_URL_DYNAMODB, SSO, instance
// roles, ...), but the AWS_* variables never select the store: jobs
// commonly have them set for their own work.
func dynamodbFlags() []cli.Flag {
	return []cli.Flag{
		&cli.StringFlag{Name: "dynamodb-table", Category: categoryStore, EnvVars: []string{"LEADERRUN_DYNAMODB_TABLE"}, Value: spec.DefaultTable,
			Usage: "DynamoDB `TABLE` of the locks (partition key \"name\", a string), created on first use if missing and permitted; " +
				"served by leaderrun-aws, installed beside leaderrun; " +
				"credentials, Region and endpoint as the AWS CLI reads them (AWS_PROFILE, AWS_REGION, AWS_ENDPOINT_URL_DYNAMODB, ...)"},
		&cli.StringFlag{Name: "dynamodb-region", Category: categoryStore, EnvVars: []string{"LEADERRUN_DYNAMODB_REGION"},
			Usage: "AWS `REGION` of the table (default: AWS_REGION, else the profile's)"},
		&cli.StringFlag{Name: "dynamodb-endpoint", Category: categoryStore, EnvVars: []string{"LEADERRUN_DYNAMODB_ENDPOINT"},
			Usage: "DynamoDB endpoint `URL` (a VPC endpoint, an emulator; default: AWS_ENDPOINT_URL_DYNAMODB, else the Region's)"},
	}
}

var dynamodbStore = store{
	name:     "dynamodb",
	flags:    dynamodbFlags,
	selected: dynamodbSelected,
	open:     newDynamoDBBackend,
	handOver: handOverDynamoDB,
	address:  "--dynamodb-table, --dynamodb-endpoint or --dynamodb-region (LEADERRUN_DYNAMODB_TABLE, _ENDPOINT, _REGION)",
	// AWS credentials are as often the job's own access to AWS: nothing
	// is removed.
	risks: dynamodbRisks,
}

// dynamodbSelected: a DynamoDB flag, or its variable
// (LEADERRUN_DYNAMODB_TABLE, _REGION, _ENDPOINT), selects the store; AWS_*
// variables never do. Other variables that merely share the prefix (a
// test's LEADERRUN_DYNAMODB_EMULATOR_BIN) do not either.
func dynamodbSelected(c *cli.Context) bool {
	for _, f := range []string{"dynamodb-table", "dynamodb-region", "dynamodb-endpoint"} {
		if c.IsSet(f) {
			return true
		}
	}
	return false
}

// openDynamoDB opens the DynamoDB backend: nil in the leaderrun binary,
// which leaves the AWS SDK out and hands a DynamoDB run over to the
// companion leaderrun-aws (companion.go); leaderrun-aws sets it
// with RegisterDynamoDB.
var openDynamoDB func(spec.Settings) (backends.Store, error)

// RegisterDynamoDB links the DynamoDB backend in: leaderrun-aws's
// main calls it, before Main.
func RegisterDynamoDB(open func(spec.Settings) (backends.Store, error)) { openDynamoDB = open }

// handOverDynamoDB: a leaderrun without the DynamoDB backend checks the
// DynamoDB flags, then becomes leaderrun-aws.
func handOverDynamoDB(c *cli.Context, cfg storeConfig) error {
	if openDynamoDB != nil {
		return nil
	}
	if _, err := dynamodbSettings(c, cfg); err != nil {
		return err
	}
	return handOver(c, awsCompanion, "DynamoDB")
}

// newDynamoDBBackend validates the DynamoDB flags and opens the store.
// Nothing is sent: a table that cannot be reached, or an action refused,
// shows in the first request, as exit 69 naming the action.
func newDynamoDBBackend(c *cli.Context, cfg storeConfig) (backends.Store, error) {
	s, err := dynamodbSettings(c, cfg)
	if err != nil {
		return nil, err
	}
	if openDynamoDB == nil {
		// handOverDynamoDB ran before anything was started.
		return nil, errNoBackend
	}
	if s.Log, err = newLogger(c, os.Stderr); err != nil {
		return nil, err
	}
	b, err := openDynamoDB(s)
	if err != nil {
		return nil, usageErrorf("%v", err)
	}
	return b, nil
}

// dynamodbSettings reads and checks the DynamoDB flags.
func dynamodbSettings(c *cli.Context, cfg storeConfig) (spec.Settings, error) {
	table := c.String("dynamodb-table")
	if err := spec.ValidateTable(table); err != nil {
		return spec.Settings{}, usageErrorf("--dynamodb-table (LEADERRUN_DYNAMODB_TABLE): %v", err)
	}
	if err := spec.ValidatePrefix(cfg.Prefix); err != nil {
		return spec.Settings{}, usageErrorf("--prefix: %v", err)
	}
	endpoint := c.String("dynamodb-endpoint")
	if endpoint != "" {
		// Checked for user information before it is parsed: a parser
		// takes a password holding "/" for a host and a path.
		if backends.Redact(endpoint) != endpoint {
			return spec.Settings{}, usageErrorf("--dynamodb-endpoint %q: want a URL without user information (credentials as the AWS CLI reads them)", backends.Redact(endpoint))
		}
		u, err := url.Parse(endpoint)
		if err != nil || (u.Scheme != "http" && u.Scheme != "https") || u.Host == "" {
			return spec.Settings{}, usageErrorf("--dynamodb-endpoint %q: want an http:// or https:// URL", endpoint)
		}
	}
	return spec.Settings{
		Table:    table,
		Region:   c.String("dynamodb-region"),
		Endpoint: endpoint,
		Prefix:   cfg.Prefix,
	}, nil
}
