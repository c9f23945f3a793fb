// Package faults is leaderrun's fault-injection suite. It drives real
// leaderrun binaries against a real 3-member etcd cluster, a real 3-server
// Consul cluster, a real PostgreSQL server, a real 3-server ZooKeeper
// ensemble, two real kube-apiservers on one etcd, a real Redis server
// (append-only, fsync always), the DynamoDB emulator, Azurite (the
// Azure Storage emulator), a real MariaDB server, versitygw (an
// S3-compatible server) and, for the rows where a process dies or is
// told to stop, the local backend, with every candidate's store traffic passing through a TCP proxy that the suite
// stalls and resets, and checks the safety contract on every trial against
// a fencing ledger.
//
// The ledger is a small HTTP service that accepts a write only if its token
// is at least the highest it has accepted, and records every write. Each
// child writes to it every 50 ms with its $FENCE_TOKEN and holds a TCP
// connection to it for as long as it lives, so that the ledger knows, to the
// millisecond and however the child dies, when each child ran.
//
// Run it with scripts/faults.sh; see the README. The code is in the test
// files: it is a test program, run by go test.
package faults
