#!/usr/bin/env bash
# Build the DynamoDB emulator of the tests (internal/testenv/ddbemu:
# minidyn, an in-memory DynamoDB written in Go, fetched as a Go module,
# behind a small front that serialises requests and plays IAM) into
# $LEADERRUN_CACHE/ddbemu/ddbemu and print that directory. internal/testenv
# reads the binary from $LEADERRUN_DYNAMODB_EMULATOR_BIN.
# The emulator is a module of its own, so that minidyn stays out of
# leaderrun's go.mod; Go's build cache makes a rebuild take a second.
# Usage: scripts/install-dynamodb.sh
set -euo pipefail
# shellcheck source-path=SCRIPTDIR source=lib.sh
. "$(dirname "${BASH_SOURCE[0]}")/lib.sh"

src="$(cd "$(dirname "${BASH_SOURCE[0]}")/../internal/testenv/ddbemu" && pwd)"
BIN_DIR="$LEADERRUN_CACHE/ddbemu"
mkdir -p "$BIN_DIR"
# One build at a time (tests may call this concurrently); built beside and
# renamed into place, as a running test may be using the previous build.
exec 9>"$LEADERRUN_CACHE/.ddbemu.lock"
flock 9
(cd "$src" && GOWORK=off go build -o "$BIN_DIR/ddbemu.new" .) || die "building the DynamoDB emulator failed"
mv "$BIN_DIR/ddbemu.new" "$BIN_DIR/ddbemu"
echo "$BIN_DIR"
