// Command leaderrun-dynamodb is leaderrun with the DynamoDB backend linked
// in. leaderrun itself leaves the AWS SDK out, whose package init would
// cost every leaderrun process on a host about 2 MiB whatever its store,
// and replaces itself with this binary, installed beside it, when the
// store is DynamoDB. It takes every flag leaderrun takes, and serves every
// store.
package main

import (
	"os"

	"github.com/leaderrun/leaderrun/backends"
	"github.com/leaderrun/leaderrun/backends/dynamodb"
	"github.com/leaderrun/leaderrun/backends/dynamodb/spec"
	"github.com/leaderrun/leaderrun/cmd"
)

func main() {
	cmd.RegisterDynamoDB(func(s spec.Settings) (backends.Backend, error) {
		return dynamodb.New(dynamodb.Config{Settings: s})
	})
	os.Exit(cmd.Main(os.Args))
}
