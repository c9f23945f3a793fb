#!/usr/bin/env bash
# Build Consul v1.14.8 (last MPL-2.0 line; 1.16.4+ is BUSL, never use it) from
# source into $LEADERRUN_CACHE/consul-v1.14.8/bin/consul and print the bin dir.
# Idempotent: returns immediately if the binary is already there and runs.
# Usage: scripts/install-consul.sh
# Cold (empty Go module and build caches) this takes ~9 minutes on 2 busy cores.
set -euo pipefail
# shellcheck source-path=SCRIPTDIR source=lib.sh
. "$(dirname "${BASH_SOURCE[0]}")/lib.sh"

VERSION=v1.14.8
BIN_DIR="$LEADERRUN_CACHE/consul-$VERSION/bin"
BIN="$BIN_DIR/consul"

cached() { [[ $("$BIN" version 2>/dev/null) == *"Consul $VERSION"* ]]; }
if cached; then echo "$BIN_DIR"; exit 0; fi
# One build at a time (tests may call this concurrently).
mkdir -p "$LEADERRUN_CACHE"
exec 9>"$LEADERRUN_CACHE/.consul.lock"
flock 9
if cached; then echo "$BIN_DIR"; exit 0; fi

export GOTOOLCHAIN=local GOFLAGS="-mod=mod -buildvcs=false"
build="$LEADERRUN_CACHE/build"
mkdir -p "$build" "$BIN_DIR"
work=$(mktemp -d "$build/consul.XXXXXX")
trap 'chmod -R u+w "$work" 2>/dev/null; rm -rf "$work"' EXIT

log "downloading github.com/hashicorp/consul@$VERSION"
mkdir "$work/dl"
(cd "$work/dl" && quiet go mod init dl &&
  go mod download -json "github.com/hashicorp/consul@$VERSION") >"$work/dl.json"
src=$(sed -n 's/^[[:space:]]*"Dir": "\(.*\)",$/\1/p' "$work/dl.json")
[[ -d $src ]] || die "module dir not found in: $(cat "$work/dl.json")"

cp -r "$src" "$work/consul"
chmod -R u+w "$work/consul"
cd "$work/consul"
# The module proxy zip lacks ./api, ./sdk, ./proto-public; use the published modules instead.
sed -i -E '/^[[:space:]]*(replace[[:space:]]+)?github\.com\/hashicorp\/consul\/(api|sdk|proto-public)[[:space:]]*=>[[:space:]]*\.\//d' go.mod
# The published api module lacks RaftServer.LastIndex.
f=command/operator/raft/listpeers/operator_raft_list.go
grep -q 'raftServer.LastIndex' "$f" || die "$f: raftServer.LastIndex not found"
sed -i 's/raftServer\.LastIndex/0/' "$f"

log "building consul (takes a few minutes)"
go build -o "$BIN.tmp" .
mv "$BIN.tmp" "$BIN"
"$BIN" version >&2
echo "$BIN_DIR"
