#!/usr/bin/env bash
# Runs the whole test suite, as CI does. On first use it builds the test
# servers (etcd v3.6.16 and Consul v1.14.8) into $LEADERRUN_CACHE (default
# ~/.cache/leaderrun, outside the repo; a few minutes cold, seconds after)
# and, as root, installs Debian's zookeeper, postgresql and pgbouncer
# packages if they are missing; each test then starts its own servers on
# free loopback ports.
#
#   scripts/test.sh [go test flags, e.g. -run Local -v]
set -euo pipefail
cd "$(dirname "$0")/.."

# The SQLite fencing example runs for real; as root, install sqlite3 if
# it is missing (Debian), otherwise that one test is skipped (failed under CI).
if ! command -v sqlite3 >/dev/null; then
	if [ "$(id -u)" = 0 ] && command -v apt-get >/dev/null; then
		apt-get update -qq && apt-get install -y -qq sqlite3 >/dev/null
	else
		echo "sqlite3 not found: install it (apt-get install sqlite3) to run the fencing example test" >&2
	fi
fi
etcd_dir=$(scripts/install-etcd.sh)
consul_dir=$(scripts/install-consul.sh)
export LEADERRUN_ETCD_BIN="$etcd_dir/etcd"
export LEADERRUN_ETCDCTL_BIN="$etcd_dir/etcdctl"
export LEADERRUN_CONSUL_BIN="$consul_dir/consul"
LEADERRUN_ZOOKEEPER_CLASSPATH=$(scripts/install-zookeeper.sh)
export LEADERRUN_ZOOKEEPER_CLASSPATH
# Installing PostgreSQL needs root and apt-get; without them its tests are
# skipped (failed under CI=true).
if pg_dir=$(scripts/install-postgres.sh); then
	export LEADERRUN_POSTGRES_BIN="$pg_dir"
else
	echo "PostgreSQL not installed: its tests will be skipped (failed under CI=true)" >&2
fi

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
