// Command leaderrun-dynamodb is leaderrun with the DynamoDB backend linked
// in. leaderrun itself leaves the AWS SDK out, whose package init would
// cost every leading instance on a host 3.1 MiB (2.2 MiB in leaderrun,
// 0.9 MiB in its watchdog) whatever its store, and replaces itself with
// this binary, installed beside it, when the store is DynamoDB. It takes every flag leaderrun takes, and serves every
// store.
package main

import (
	"os"

	"github.com/leaderrun/leaderrun/backends"
	"github.com/leaderrun/leaderrun/backends/dynamodb"
	"github.com/leaderrun/leaderrun/backends/dynamodb/spec"
	"github.com/leaderrun/leaderrun/cmd"
	// leaderrun-dynamodb re-executed as its command's watchdog becomes it
	// in this package's init, before the stores' clients initialise.
	_ "github.com/leaderrun/leaderrun/takeover"
)

func main() {
	cmd.RegisterDynamoDB(func(s spec.Settings) (backends.Backend, error) {
		return dynamodb.New(dynamodb.Config{Settings: s})
	})
	os.Exit(cmd.Main(os.Args))
}
