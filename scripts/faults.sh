#!/usr/bin/env bash
# Fault-injection suite: real leaderrun binaries against a real 3-member
# etcd cluster, a real 3-server Consul cluster, a real PostgreSQL server, a
# real 3-server ZooKeeper ensemble, two real kube-apiservers on one etcd,
# a real redis-server (append-only file, appendfsync always), a DynamoDB
# emulator, Azurite (the Azure Storage emulator), a real MariaDB server and
# versitygw (an S3-compatible server), each candidate's store
# traffic through a TCP proxy that the suite stalls and resets, checked
# against a fencing ledger. Prints a table per store and scenario and
# writes it, with one SVG timeline per scenario, to --out. Exits non-zero
# on any violation.
#
#   scripts/faults.sh [--trials N] [--backend STORE[,STORE...]|all] [--parallel P] [--only REGEX] [--out DIR]
#
# STORE is one of: etcd consul postgres zookeeper kubernetes redis dynamodb azureblob mysql s3 local
# (local: the kill -9, SIGTERM and pool rows). --only runs the scenarios whose name
# matches REGEX, as `go test -run` matches a subtest's name (spaces become
# underscores), e.g. --only '^holders' for the pool rows.
#
# --trials 1 --parallel 2 is the short mode that CI runs; the published
# table in docs/faults/ comes from --trials 20 --backend all --parallel 3
# --out docs/faults, with rows from later runs of some scenarios or stores
# (its header names the command and commit of each).
set -euo pipefail
cd "$(dirname "$0")/.."

trials=3 backend=all out="" parallel=1 only=""
while [ $# -gt 0 ]; do
	case "$1" in
	--trials) trials=$2; shift 2 ;;
	--backend) backend=$2; shift 2 ;;
	--out) out=$2; shift 2 ;;
	--parallel) parallel=$2; shift 2 ;;
	--only) only=$2; shift 2 ;;
	*) echo "usage: $0 [--trials N] [--backend STORE[,STORE...]|all] [--parallel P] [--only REGEX] [--out DIR]" >&2; exit 64 ;;
	esac
done
stores="etcd consul postgres zookeeper kubernetes redis dynamodb azureblob mysql s3 local"
case "$trials" in '' | *[!0-9]* | 0) echo "--trials $trials: want a positive number" >&2; exit 64 ;; esac
case "$parallel" in '' | *[!0-9]* | 0) echo "--parallel $parallel: want a positive number" >&2; exit 64 ;; esac
if [ "$backend" != all ]; then
	for b in ${backend//,/ }; do
		case " $stores " in *" $b "*) ;; *) echo "--backend $backend: want all or some of: $stores" >&2; exit 64 ;; esac
	done
fi
# wants STORE: the run includes STORE.
wants() { [ "$backend" = all ] || case ",$backend," in *",$1,"*) true ;; *) false ;; esac; }
if [ -z "$out" ]; then
	out=$(mktemp -d -t leaderrun-faults.XXXXXX)
fi
mkdir -p "$out"
out=$(cd "$out" && pwd)

etcd_dir=$(scripts/install-etcd.sh)
consul_dir=$(scripts/install-consul.sh)
export LEADERRUN_ETCD_BIN="$etcd_dir/etcd" LEADERRUN_ETCDCTL_BIN="$etcd_dir/etcdctl" LEADERRUN_CONSUL_BIN="$consul_dir/consul"
if wants kubernetes; then
	kube_dir=$(scripts/install-kube-apiserver.sh)
	export LEADERRUN_KUBE_APISERVER_BIN="$kube_dir/kube-apiserver"
fi
if wants dynamodb; then
	ddb_dir=$(scripts/install-dynamodb.sh)
	export LEADERRUN_DYNAMODB_EMULATOR_BIN="$ddb_dir/ddbemu"
fi
if wants zookeeper; then
	LEADERRUN_ZOOKEEPER_CLASSPATH=$(scripts/install-zookeeper.sh)
	export LEADERRUN_ZOOKEEPER_CLASSPATH
fi
if wants azureblob; then
	LEADERRUN_AZURITE_BIN=$(scripts/install-azurite.sh)
	export LEADERRUN_AZURITE_BIN
fi
if wants s3; then
	vgw_dir=$(scripts/install-versitygw.sh)
	export LEADERRUN_VERSITYGW_BIN="$vgw_dir/versitygw"
fi
# Installing PostgreSQL needs root and apt-get; without them its trials are
# skipped (failed under CI=true), as in scripts/test.sh.
if wants postgres; then
	if pg_dir=$(scripts/install-postgres.sh); then
		export LEADERRUN_POSTGRES_BIN="$pg_dir"
	else
		echo "PostgreSQL not installed: its trials will be skipped (failed under CI=true)" >&2
	fi
fi
# Installing Redis needs root and apt-get too.
if wants redis; then
	if redis_bin=$(scripts/install-redis.sh); then
		export LEADERRUN_REDIS_BIN="$redis_bin"
	else
		echo "Redis not installed: its trials will be skipped (failed under CI=true)" >&2
	fi
fi
# And MariaDB's (Debian's mariadb-server).
if wants mysql; then
	if mariadb_bin=$(scripts/install-mariadb.sh); then
		export LEADERRUN_MARIADB_BIN="$mariadb_bin"
	else
		echo "MariaDB not installed: its trials will be skipped (failed under CI=true)" >&2
	fi
fi
export FAULTS_TRIALS=$trials FAULTS_BACKEND=$backend FAULTS_OUT=$out FAULTS_PARALLEL=$parallel FAULTS_ONLY=$only
FAULTS_COMMIT=$(git rev-parse --short HEAD 2>/dev/null || echo unknown)
if [ -n "$(git status --porcelain 2>/dev/null)" ]; then FAULTS_COMMIT="$FAULTS_COMMIT+changes"; fi
export FAULTS_COMMIT

# -v shows each trial; the whole output goes to faults.log, the outline to
# the terminal; the table is printed at the end and saved as faults.md.
set +e
run='^TestFaults$'
[ -z "$only" ] || run="^TestFaults\$/^stores\$/.*/$only"
go test -count=1 -timeout 0 -parallel "$parallel" -run "$run" -v ./faults/ 2>&1 | tee "$out/faults.log" |
	grep --line-buffered -E '^(=== RUN|--- FAIL|\||FAIL|ok|PASS)|faults_test.go'
status=${PIPESTATUS[0]}
set -e
echo "table, timelines and log in $out"
exit "$status"
