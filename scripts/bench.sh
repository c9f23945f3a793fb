#!/usr/bin/env bash
# Benchmarks: leaderrun side by side with `etcdctl lock` and `consul lock`
# on the same local etcd and Consul, in one run, with the same child for
# every tool and the tools alternated run by run. Prints the table and
# writes it, with the machine's description and an analysis, to
# OUT/benchmarks.md, and the latency plot to OUT/benchmarks.svg.
#
#   scripts/bench.sh [--runs N] [--out DIR]
#
# --runs: runs per start-to-child figure (default 30; loss reaction and
# handover get a third of that, at least 5). --out defaults to docs/, where
# the published figures live. The whole run takes about 5 minutes on 2 cores.
# BENCH_COST_SECONDS (default 30) and BENCH_FOLLOWERS (default 200) tune the
# store-cost windows and the many-followers test.
set -euo pipefail
cd "$(dirname "$0")/.."

runs=30 out=docs
args=("$@")
while [ $# -gt 0 ]; do
	case "$1" in
	--runs) runs=${2:-}; shift 2 ;;
	--out) out=${2:-}; shift 2 ;;
	*) echo "usage: $0 [--runs N] [--out DIR]" >&2; exit 64 ;;
	esac
done
case "$runs" in '' | *[!0-9]* | 0) echo "--runs $runs: want a positive number" >&2; exit 64 ;; esac
[ -n "$out" ] || { echo "--out: want a directory" >&2; exit 64; }
mkdir -p "$out"
out=$(cd "$out" && pwd)

etcd_dir=$(scripts/install-etcd.sh)
consul_dir=$(scripts/install-consul.sh)
export LEADERRUN_ETCD_BIN="$etcd_dir/etcd" LEADERRUN_ETCDCTL_BIN="$etcd_dir/etcdctl" LEADERRUN_CONSUL_BIN="$consul_dir/consul"
export BENCH=1 BENCH_RUNS=$runs BENCH_OUT=$out BENCH_CMD="scripts/bench.sh${args[*]:+ ${args[*]}}"

log=$(mktemp -t leaderrun-bench.XXXXXX.log)
# -v shows each phase; the table is printed at the end.
status=0
go test -count=1 -timeout 0 -run '^TestBench$' -v ./bench/ >"$log" 2>&1 || status=$?
grep -E '^(\||--- FAIL|FAIL|ok|PASS)|_test\.go:[0-9]+:' "$log" || true
echo "report in $out/benchmarks.md, plot in $out/benchmarks.svg, log in $log"
exit "$status"
