#!/usr/bin/env bash
# What the cloud SDKs cost every leaderrun, whatever its store: the two
# release binaries of this tree, leaderrun (the Azure SDK linked in, the
# AWS SDK left out) and leaderrun-aws (both: leaderrun hands a
# DynamoDB run over to it), beside leaderrun built without the Azure Blob
# backend too (no SDK), each run as a leader on the local backend with an
# idle command. Prints, per build: binary size, package init
# (GODEBUG=inittrace=1: median time of 5 starts, bytes allocated) and the
# anonymous memory (the private part one more instance costs; file pages
# are shared) of leaderrun and of its watchdog, ROUNDS rounds alternated.
#
#   scripts/sdk-cost.sh [ROUNDS]
set -euo pipefail
cd "$(dirname "$0")/.."
rounds=${1:-3}
case "$rounds" in '' | *[!0-9]* | 0) echo "ROUNDS $rounds: want a positive number" >&2; exit 64 ;; esac

work=$(mktemp -d -t leaderrun-sdk-cost.XXXXXX)
tree="$work/tree"
cleanup() {
	[ -z "${pid:-}" ] || kill "$pid" 2>/dev/null || true
	git worktree remove --force "$tree" 2>/dev/null || true
	rm -rf "$work"
}
trap cleanup EXIT
git worktree add -q --detach "$tree" HEAD
# The tree as committed plus uncommitted changes to tracked files, so that
# the figures are of what is checked out.
git diff HEAD | (cd "$tree" && git apply --allow-empty)

release() { CGO_ENABLED=0 go build -trimpath -tags urfave_cli_no_docs -ldflags='-s -w' "$@"; }
echo "building three variants of $(git rev-parse --short HEAD) ..." >&2
(
	cd "$tree"
	release -o "$work/" . ./cmd/leaderrun-aws
	rm -f cmd/azureblob.go cmd/azureblob_test.go
	sed -i 's/ azureStore,//' cmd/flags.go
	release -o "$work/leaderrun-without-sdks" .
)

anon() { awk '/^Anonymous:/{print $2}' "/proc/$1/smaps_rollup"; }
state="$work/state"
mkdir -m 700 "$state"
declare -A lr dog
names=(leaderrun-aws leaderrun leaderrun-without-sdks)
for r in $(seq "$rounds"); do
	for n in "${names[@]}"; do
		"$work/$n" --backend local --state-dir "$state" --lock "cost-$n-$r" --quiet -- sleep 600 &
		pid=$!
		# The watchdog is leaderrun's child, the command its child: wait
		# for the command, so that both have started.
		for _ in $(seq 200); do
			w=$(cat /proc/$pid/task/*/children 2>/dev/null | awk '{print $1; exit}')
			[ -n "$w" ] && [ -n "$(cat /proc/$w/task/*/children 2>/dev/null)" ] && break
			sleep 0.05
		done
		if [ -z "$w" ] || [ -z "$(cat /proc/$w/task/*/children 2>/dev/null)" ]; then
			echo "$n: no watchdog with a command under leaderrun $pid within 10 s" >&2
			exit 1
		fi
		sleep 1 # past the start: what an instance keeps while it leads
		lr[$n]+="$(anon "$pid") "
		dog[$n]+="$(anon "$w") "
		kill "$pid"
		wait "$pid" 2>/dev/null || true
		pid=
	done
done

median() { tr ' ' '\n' | grep . | sort -n | awk '{a[NR]=$1} END{print a[int((NR+1)/2)]}'; }
printf '| build | binary | package init, allocated | leaderrun anonymous (median of %d) | watchdog anonymous | both |\n|---|---|---|---|---|---|\n' "$rounds"
for n in "${names[@]}"; do
	size=$(stat -c %s "$work/$n")
	# Package init: the median of 5 starts' total time; the bytes are
	# the same at every start.
	times=""
	for _ in 1 2 3 4 5; do
		times+="$(GODEBUG=inittrace=1 "$work/$n" version 2>&1 >/dev/null | awk '/^init /{t+=$5; b+=$8} END{printf "%.1f:%.2f", t, b/1e6}') "
	done
	ms=$(echo "$times" | tr ' ' '\n' | grep . | cut -d: -f1 | median)
	init="$ms ms, $(echo "$times" | cut -d' ' -f1 | cut -d: -f2) MB"
	a=$(echo "${lr[$n]}" | median)
	d=$(echo "${dog[$n]}" | median)
	awk -v n="$n" -v size="$size" -v init="$init" -v a="$a" -v d="$d" \
		'BEGIN{printf "| %s | %.1f MiB | %s | %.2f MiB | %.2f MiB | %.2f MiB |\n", n, size/1048576, init, a/1024, d/1024, (a+d)/1024}'
done
