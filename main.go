// Command leaderrun runs a command only while this host holds leadership of
// a lock in etcd, Consul, PostgreSQL, Kubernetes, ZooKeeper or a local lock
// file, and hands it a fencing token.
package main

import (
	"os"

	"github.com/leaderrun/leaderrun/cmd"
)

func main() { os.Exit(cmd.Main(os.Args)) }
