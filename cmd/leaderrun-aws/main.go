// Command leaderrun-aws is leaderrun with the backends that need the AWS
// SDK linked in: DynamoDB and S3. leaderrun itself leaves the SDK out,
// whose package init would cost every leading instance on a host 3.1 MiB
// (2.2 MiB in leaderrun, 0.9 MiB in its watchdog) whatever its store, and
// replaces itself with this binary, installed beside it, when the store
// is DynamoDB or S3. It takes every flag leaderrun takes, and serves every
// store.
package main

import (
	"os"

	"github.com/leaderrun/leaderrun/backends"
	"github.com/leaderrun/leaderrun/backends/dynamodb"
	dynamodbspec "github.com/leaderrun/leaderrun/backends/dynamodb/spec"
	"github.com/leaderrun/leaderrun/backends/s3"
	s3spec "github.com/leaderrun/leaderrun/backends/s3/spec"
	"github.com/leaderrun/leaderrun/cmd"
	// leaderrun-aws re-executed as its command's watchdog becomes it in
	// this package's init, before the stores' clients initialise.
	_ "github.com/leaderrun/leaderrun/takeover"
)

func main() {
	cmd.RegisterDynamoDB(func(s dynamodbspec.Settings) (backends.Store, error) {
		return dynamodb.Open(dynamodb.Config{Settings: s})
	})
	cmd.RegisterS3(func(s s3spec.Settings) (backends.Store, error) {
		return s3.Open(s3.Config{Settings: s})
	})
	os.Exit(cmd.Main(os.Args))
}
