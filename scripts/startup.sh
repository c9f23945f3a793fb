#!/usr/bin/env bash
# Start-up, teardown and memory of leaderrun, measured as the benchmark
# measures them (the same code, bench/), but only those phases: `version`
# exec to exit and page faults, package init per package
# (GODEBUG=inittrace=1), the binary's size by module, start-to-child and
# exec-to-exit of leaderrun on every store beside `etcdctl lock`, `consul
# lock` and client-go's elector, and the resident
# set while leading (VmHWM, anonymous and file-backed pages, by mapping),
# of leaderrun and its watchdog, after 3 s of leadership and after 300
# renewals. Takes two minutes or so.
#
#   scripts/startup.sh [--runs N] [--out DIR] [LABEL=BINARY ...]
#
# LABEL=BINARY adds another leaderrun binary (an older build, say) to every
# figure, alternated run by run with the one built from this tree, so that
# the two are compared under the same load. --runs defaults to 30; the
# report goes to DIR/startup.md (default: a temporary directory, never
# docs/).
set -euo pipefail
cd "$(dirname "$0")/.."

runs=30 out= compare=() argv=("$@")
while [ $# -gt 0 ]; do
	case "$1" in
	--runs) runs=${2:-}; shift 2 ;;
	--out) out=${2:-}; shift 2 ;;
	*=*) compare+=("$1"); shift ;;
	*) echo "usage: $0 [--runs N] [--out DIR] [LABEL=BINARY ...]" >&2; exit 64 ;;
	esac
done
case "$runs" in '' | *[!0-9]* | 0) echo "--runs $runs: want a positive number" >&2; exit 64 ;; esac
[ -n "$out" ] || out=$(mktemp -d -t leaderrun-startup.XXXXXX)
mkdir -p "$out"
out=$(cd "$out" && pwd)
for c in "${compare[@]}"; do
	bin=${c#*=}
	[ -x "$bin" ] || { echo "$c: $bin is not an executable" >&2; exit 64; }
done

# The servers every store column runs on, built or installed as
# scripts/test.sh does (kube-apiserver and the client-go elector built into
# the cache, minutes cold; PostgreSQL and ZooKeeper from Debian's packages,
# as root).
etcd_dir=$(scripts/install-etcd.sh)
consul_dir=$(scripts/install-consul.sh)
kube_dir=$(scripts/install-kube-apiserver.sh)
pg_dir=$(scripts/install-postgres.sh)
LEADERRUN_ZOOKEEPER_CLASSPATH=$(scripts/install-zookeeper.sh)
ddb_dir=$(scripts/install-dynamodb.sh)
elector_dir="${LEADERRUN_CACHE:-${XDG_CACHE_HOME:-$HOME/.cache}/leaderrun}/k8selector"
mkdir -p "$elector_dir"
(cd internal/testenv/k8selector && GOWORK=off go build -o "$elector_dir/k8selector.new" . && mv "$elector_dir/k8selector.new" "$elector_dir/k8selector")
export LEADERRUN_ETCD_BIN="$etcd_dir/etcd" LEADERRUN_ETCDCTL_BIN="$etcd_dir/etcdctl" LEADERRUN_CONSUL_BIN="$consul_dir/consul" \
	LEADERRUN_KUBE_APISERVER_BIN="$kube_dir/kube-apiserver" LEADERRUN_POSTGRES_BIN="$pg_dir" \
	LEADERRUN_ZOOKEEPER_CLASSPATH LEADERRUN_K8SELECTOR_BIN="$elector_dir/k8selector" LEADERRUN_DYNAMODB_EMULATOR_BIN="$ddb_dir/ddbemu"
export BENCH=1 BENCH_RUNS=$runs BENCH_OUT=$out BENCH_CMD="scripts/startup.sh${argv[*]:+ ${argv[*]}}"
export BENCH_PHASES="start-up of each binary,package init,binary size,start-to-child,RSS while leading,RSS after a long leadership"
BENCH_COMPARE=$(IFS=,; echo "${compare[*]}")
export BENCH_COMPARE

log=$out/startup.log
status=0
go test -count=1 -timeout 0 -run '^TestBench$' -v ./bench/ >"$log" 2>&1 || status=$?
mv "$out/benchmarks.md" "$out/startup.md" 2>/dev/null || true
rm -f "$out/benchmarks.svg"
grep -E '^(\||--- FAIL|FAIL|ok|PASS)|_test\.go:[0-9]+:' "$log" || true
echo "report in $out/startup.md, log in $log"
exit "$status"
