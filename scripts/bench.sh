#!/usr/bin/env bash
# Benchmarks: leaderrun on every store (etcd, Consul, PostgreSQL,
# Kubernetes, ZooKeeper, Redis, Azure Blob's and DynamoDB's emulators,
# MySQL on MariaDB, S3 on versitygw, local) side by side with `etcdctl
# lock`, `consul lock` and client-go's elector, on local servers started for the run, with the same child for
# every tool and the tools alternated run by run: start-to-child, package
# init per package (time and allocation, beside etcdctl's and consul's),
# binary size, memory as a host pays it (summed Pss and Private of 1, 5
# and 20 leaders with their watchdogs, and one more instance), loss
# reaction, handover, crash failover, store cost, 200 followers, and what
# `consul lock -n 3` (and leaderrun --holders 3, where built) does when a
# holder dies. Prints the tables and writes them, with the machine's
# description, every goal's verdict and an analysis, to
# OUT/benchmarks.md, and the latency plot to OUT/benchmarks.svg.
#
#   scripts/bench.sh [--runs N] [--out DIR] [--stores STORE[,STORE...]]
#
# --runs: runs per start-to-child figure (default 30; loss reaction and
# handover get a sixth of that, at least 5). --out defaults to docs/, where
# the published figures live. --stores keeps only those store columns (as
# --backend names them), to prove a new column; with it, leave out the
# phases that compare with a store left out (BENCH_PHASES: "pool of
# holders" is on Consul), and give an --out other than docs/. The whole
# run takes about 15 minutes on 2 cores (a third of it the 200-follower phase, a sixth the memory phase). BENCH_COST_SECONDS (default 30) and BENCH_FOLLOWERS (default 200)
# tune the store-cost windows and the many-followers phase (200 followers
# per store). The servers are built or installed as scripts/test.sh does
# (PostgreSQL and ZooKeeper from Debian's packages: as root).
set -euo pipefail
cd "$(dirname "$0")/.."

runs=30 out=docs stores=""
args=("$@")
while [ $# -gt 0 ]; do
	case "$1" in
	--runs) runs=${2:-}; shift 2 ;;
	--out) out=${2:-}; shift 2 ;;
	--stores) stores=${2:-}; shift 2 ;;
	*) echo "usage: $0 [--runs N] [--out DIR] [--stores STORE[,STORE...]]" >&2; exit 64 ;;
	esac
done
case "$runs" in '' | *[!0-9]* | 0) echo "--runs $runs: want a positive number" >&2; exit 64 ;; esac
[ -n "$out" ] || { echo "--out: want a directory" >&2; exit 64; }
mkdir -p "$out"
out=$(cd "$out" && pwd)

# The servers every store column runs on, built or installed as
# scripts/test.sh does (kube-apiserver and the client-go elector built into
# the cache, minutes cold; PostgreSQL, ZooKeeper and Redis from Debian's packages,
# Azurite from the npm registry,
# as root).
etcd_dir=$(scripts/install-etcd.sh)
consul_dir=$(scripts/install-consul.sh)
kube_dir=$(scripts/install-kube-apiserver.sh)
pg_dir=$(scripts/install-postgres.sh)
LEADERRUN_ZOOKEEPER_CLASSPATH=$(scripts/install-zookeeper.sh)
redis_bin=$(scripts/install-redis.sh)
ddb_dir=$(scripts/install-dynamodb.sh)
azurite_bin=$(scripts/install-azurite.sh)
mariadb_bin=$(scripts/install-mariadb.sh)
vgw_dir=$(scripts/install-versitygw.sh)
elector_dir="${LEADERRUN_CACHE:-${XDG_CACHE_HOME:-$HOME/.cache}/leaderrun}/k8selector"
mkdir -p "$elector_dir"
(cd internal/testenv/k8selector && GOWORK=off go build -o "$elector_dir/k8selector.new" . && mv "$elector_dir/k8selector.new" "$elector_dir/k8selector")
export LEADERRUN_ETCD_BIN="$etcd_dir/etcd" LEADERRUN_ETCDCTL_BIN="$etcd_dir/etcdctl" LEADERRUN_CONSUL_BIN="$consul_dir/consul" \
	LEADERRUN_KUBE_APISERVER_BIN="$kube_dir/kube-apiserver" LEADERRUN_POSTGRES_BIN="$pg_dir" \
	LEADERRUN_ZOOKEEPER_CLASSPATH LEADERRUN_K8SELECTOR_BIN="$elector_dir/k8selector" LEADERRUN_DYNAMODB_EMULATOR_BIN="$ddb_dir/ddbemu" LEADERRUN_REDIS_BIN="$redis_bin" \
	LEADERRUN_AZURITE_BIN="$azurite_bin" LEADERRUN_MARIADB_BIN="$mariadb_bin" LEADERRUN_VERSITYGW_BIN="$vgw_dir/versitygw"
export BENCH=1 BENCH_STORES=$stores BENCH_RUNS=$runs BENCH_OUT=$out BENCH_CMD="scripts/bench.sh${args[*]:+ ${args[*]}}"

log=$(mktemp -t leaderrun-bench.XXXXXX.log)
# -v shows each phase; the table is printed at the end.
status=0
go test -count=1 -timeout 0 -run '^TestBench$' -v ./bench/ >"$log" 2>&1 || status=$?
grep -E '^(\||--- FAIL|FAIL|ok|PASS)|_test\.go:[0-9]+:' "$log" || true
echo "report in $out/benchmarks.md, plot in $out/benchmarks.svg, log in $log"
exit "$status"
