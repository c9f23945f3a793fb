#!/usr/bin/env bash
# Runs the whole test suite, as CI does. On first use it builds the test
# servers (etcd v3.6.16, Consul v1.14.8, kube-apiserver v1.37.2 and the
# DynamoDB emulator) and installs Azurite 3.35.0 (npm) into
# $LEADERRUN_CACHE (default ~/.cache/leaderrun, outside the repo; minutes
# cold, seconds after) and, as root, installs Debian's zookeeper,
# postgresql, pgbouncer, redis-server and mariadb-server packages if they are missing; each test then
# starts its own servers on free loopback ports.
#
#   scripts/test.sh [go test flags, e.g. -run Local -v]
set -euo pipefail
cd "$(dirname "$0")/.."

# Debian packages some tests run for real: sqlite3 (the SQLite fencing
# example), systemd-analyze from systemd (the example units are verified
# and rated), strace (leaderrun's system calls checked against the units'
# filter), cron (the crontab recipe, run by cron itself in a private
# mount namespace) and curl (an operator's edit of a Kubernetes Lease). As
# root, install what is missing; otherwise those tests are skipped (failed
# under CI).
missing=()
command -v sqlite3 >/dev/null || missing+=(sqlite3)
command -v systemd-analyze >/dev/null || missing+=(systemd)
command -v strace >/dev/null || missing+=(strace)
[ -x /usr/sbin/cron ] || missing+=(cron)
command -v curl >/dev/null || missing+=(curl)
if [ ${#missing[@]} -gt 0 ]; then
	if [ "$(id -u)" = 0 ] && command -v apt-get >/dev/null; then
		# Install, never start: policy-rc.d 101 forbids maintainer scripts
		# to start services (systemd's own postinst included).
		policy=
		if [ ! -e /usr/sbin/policy-rc.d ]; then
			policy=/usr/sbin/policy-rc.d
			printf '#!/bin/sh\nexit 101\n' >"$policy" && chmod 755 "$policy"
		fi
		status=0
		apt-get update -qq &&
			DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends "${missing[@]}" >/dev/null ||
			status=$?
		[ -z "$policy" ] || rm -f "$policy"
		[ "$status" = 0 ] || exit "$status"
	else
		echo "not found: ${missing[*]}: install them (apt-get install ${missing[*]}) to run the tests that need them" >&2
	fi
fi
etcd_dir=$(scripts/install-etcd.sh)
consul_dir=$(scripts/install-consul.sh)
kube_dir=$(scripts/install-kube-apiserver.sh)
export LEADERRUN_ETCD_BIN="$etcd_dir/etcd"
export LEADERRUN_ETCDCTL_BIN="$etcd_dir/etcdctl"
export LEADERRUN_CONSUL_BIN="$consul_dir/consul"
export LEADERRUN_KUBE_APISERVER_BIN="$kube_dir/kube-apiserver"
# The client-go elector that the Kubernetes interop tests run is a module
# of its own, outside ./...: built here, once, into the cache (minutes
# cold: it compiles client-go), not inside a test's timeout.
elector_dir="${LEADERRUN_CACHE:-${XDG_CACHE_HOME:-$HOME/.cache}/leaderrun}/k8selector"
mkdir -p "$elector_dir"
echo "== building the client-go elector (internal/testenv/k8selector)"
(cd internal/testenv/k8selector && GOWORK=off go build -o "$elector_dir/k8selector.new" . && mv "$elector_dir/k8selector.new" "$elector_dir/k8selector")
export LEADERRUN_K8SELECTOR_BIN="$elector_dir/k8selector"
# The DynamoDB emulator (minidyn behind a front of ours) is a module of
# its own too, built into the cache.
ddb_dir=$(scripts/install-dynamodb.sh)
export LEADERRUN_DYNAMODB_EMULATOR_BIN="$ddb_dir/ddbemu"
# versitygw, the S3 store's server, is built from the module proxy into the cache.
vgw_dir=$(scripts/install-versitygw.sh)
export LEADERRUN_VERSITYGW_BIN="$vgw_dir/versitygw"
# The servers that come from Debian's packages (root and apt-get, or
# installed already) or from the npm registry (Node.js and npm): without
# one, its store's tests are skipped (failed under CI=true).
# optional VAR SCRIPT STORE exports VAR as what SCRIPT prints, if it can.
optional() {
	local out
	if out=$("scripts/$2"); then
		export "$1=$out"
	else
		echo "$3 not installed: its tests will be skipped (failed under CI=true)" >&2
	fi
}
optional LEADERRUN_ZOOKEEPER_CLASSPATH install-zookeeper.sh ZooKeeper
optional LEADERRUN_AZURITE_BIN install-azurite.sh "Azurite (Azure Blob)"
optional LEADERRUN_POSTGRES_BIN install-postgres.sh PostgreSQL
# Redis: Debian's redis-server; Sentinel is the same binary.
optional LEADERRUN_REDIS_BIN install-redis.sh Redis
optional LEADERRUN_MARIADB_BIN install-mariadb.sh "MariaDB (the mysql store)"

echo "== go vet"
go vet ./...
# The binary builds for macOS (development), so its packages must vet there.
GOOS=darwin go vet ./...
(cd internal/testenv/k8selector && GOWORK=off go vet ./...)
(cd internal/testenv/ddbemu && GOWORK=off go vet ./...)
echo "== gofmt"
unformatted=$(gofmt -l .)
if [ -n "$unformatted" ]; then
	echo "not gofmt'ed: $unformatted" >&2
	exit 1
fi
echo "== staticcheck"
# Built once into the cache, outside the repo, from the module proxy.
staticcheck_bin="${LEADERRUN_CACHE:-${XDG_CACHE_HOME:-$HOME/.cache}/leaderrun}/staticcheck-v0.8.2"
if [ ! -x "$staticcheck_bin/staticcheck" ]; then
	GOBIN="$staticcheck_bin" GOFLAGS=-mod=mod go install honnef.co/go/tools/cmd/staticcheck@v0.8.2
fi
"$staticcheck_bin/staticcheck" ./...
echo "== go test -race"
# e2e, the longest package, is listed first so that go test builds and
# starts it first, beside the others rather than after them; three test
# binaries run at a time (go test's default is one per CPU): they spend
# their time waiting on the servers they start, not on the CPU. e2e runs
# its own tests side by side too (e2e/main_test.go).
go test -race -count=1 -timeout 30m -p 3 ./e2e/ ./... "$@"
