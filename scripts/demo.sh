#!/usr/bin/env bash
# Builds leaderrun (the README's build line) and runs two instances of one job on the local backend
# (no server needed): one leads and prints its fencing token while the other
# waits, then the second takes over with a greater token.
#
#   scripts/demo.sh
set -euo pipefail
cd "$(dirname "$0")/.."

work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
CGO_ENABLED=0 go build -trimpath -buildvcs=true -tags urfave_cli_no_docs -ldflags='-s -w' -o "$work/" . ./cmd/leaderrun-aws
echo "built $work/leaderrun ($("$work/leaderrun" version))"
echo

job='echo "  [$LEADERRUN_IDENTITY] leading with FENCE_TOKEN=$FENCE_TOKEN"; sleep 2; echo "  [$LEADERRUN_IDENTITY] done"'
run() {
	"$work/leaderrun" --backend local --state-dir "$work/state" --lock demo \
		--identity "$1" --quiet --shell -- "$job"
}

# leading NAME waits until status names NAME as the holder. (The lock
# file keeps the last holder's record after a release, so its size says
# nothing.)
leading() {
	for _ in $(seq 500); do
		"$work/leaderrun" status --backend local --state-dir "$work/state" --lock demo --json 2>/dev/null |
			grep -q "\"identity\":\"$1\"" && return 0
		sleep 0.01
	done
	echo "demo: $1 did not lead within 5 s" >&2
	return 1
}

echo "two instances of the same job; the second waits for the first:"
run host-a & a=$!
leading host-a
run host-b & b=$!
wait "$a" "$b"
echo
echo "a third with --try while another holds the lock skips it (exit 75):"
run host-c & c=$!
leading host-c
set +e
"$work/leaderrun" --backend local --state-dir "$work/state" --lock demo --try --quiet -- true
echo "  --try exited $?"
set -e
wait "$c"
echo
"$work/leaderrun" status --backend local --state-dir "$work/state" --lock demo || true
