// Command leaderrun runs a command only while this host holds leadership of
// a lock in etcd, Consul, PostgreSQL, Kubernetes, ZooKeeper or a local lock
// file, and hands it a fencing token.
package main

import (
	"os"

	"github.com/leaderrun/leaderrun/cmd"
	// leaderrun re-executed as its command's watchdog becomes it in this
	// package's init, before the stores' clients initialise.
	_ "github.com/leaderrun/leaderrun/takeover"
)

func main() { os.Exit(cmd.Main(os.Args)) }
