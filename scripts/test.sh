#!/usr/bin/env bash
# Runs the whole test suite, as CI does. On first use it builds the test
# servers (etcd v3.6.16 and Consul v1.14.8) into $LEADERRUN_CACHE (default
# ~/.cache/leaderrun, outside the repo; a few minutes cold, seconds after);
# each test then starts its own servers on free loopback ports.
#
#   scripts/test.sh [go test flags, e.g. -run Local -v]
set -euo pipefail
cd "$(dirname "$0")/.."

etcd_dir=$(scripts/install-etcd.sh)
consul_dir=$(scripts/install-consul.sh)
export LEADERRUN_ETCD_BIN="$etcd_dir/etcd"
export LEADERRUN_ETCDCTL_BIN="$etcd_dir/etcdctl"
export LEADERRUN_CONSUL_BIN="$consul_dir/consul"

echo "== go vet"
go vet ./...
echo "== gofmt"
unformatted=$(gofmt -l .)
if [ -n "$unformatted" ]; then
	echo "not gofmt'ed: $unformatted" >&2
	exit 1
fi
echo "== go test -race"
go test -race -count=1 -timeout 20m ./... "$@"
