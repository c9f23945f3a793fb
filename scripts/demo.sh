#!/usr/bin/env bash
# Builds leaderrun and runs two instances of one job on the local backend
# (no server needed): one leads and prints its fencing token while the other
# waits, then the second takes over with a greater token.
#
#   scripts/demo.sh
set -euo pipefail
cd "$(dirname "$0")/.."

work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
go build -o "$work/leaderrun" .
echo "built $work/leaderrun ($("$work/leaderrun" version))"
echo

job='echo "  [$LEADERRUN_IDENTITY] leading with FENCE_TOKEN=$FENCE_TOKEN"; sleep 1; echo "  [$LEADERRUN_IDENTITY] done"'
run() {
	"$work/leaderrun" --backend local --state-dir "$work/state" --lock demo \
		--identity "$1" --quiet --shell -- "$job"
}

echo "two instances of the same job, started together:"
run host-a & a=$!
run host-b & b=$!
wait "$a" "$b"
echo
echo "a third with --try while another holds the lock skips it (exit 75):"
run host-c & c=$!
for _ in $(seq 100); do
	[ -s "$work/state/demo.lock" ] && break
	sleep 0.01
done
set +e
"$work/leaderrun" --backend local --state-dir "$work/state" --lock demo --try --quiet -- true
echo "  --try exited $?"
set -e
wait "$c"
echo
"$work/leaderrun" status --backend local --state-dir "$work/state" --lock demo || true
