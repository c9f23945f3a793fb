#!/usr/bin/env bash
# Build etcd and etcdctl v3.6.16 from source into
# $LEADERRUN_CACHE/etcd-v3.6.16/bin/{etcd,etcdctl} and print the bin dir.
# Idempotent: returns immediately if both binaries are there and report 3.6.16.
# Usage: scripts/install-etcd.sh
#
# `go install` refuses both modules (their go.mod files have replace
# directives), so we build them from a throwaway module that imports the
# importable entry points etcdmain.Main and ctlv3.MustStart.
set -euo pipefail
# shellcheck source-path=SCRIPTDIR source=lib.sh
. "$(dirname "${BASH_SOURCE[0]}")/lib.sh"

VERSION=v3.6.16
BIN_DIR="$LEADERRUN_CACHE/etcd-$VERSION/bin"

cached() {
  local v=${VERSION#v}
  [[ $("$BIN_DIR/etcd" --version 2>/dev/null) == *"etcd Version: $v"* ]] &&
    [[ $("$BIN_DIR/etcdctl" version 2>/dev/null) == *"etcdctl version: $v"* ]]
}
if cached; then echo "$BIN_DIR"; exit 0; fi
# One build at a time (tests may call this concurrently).
mkdir -p "$LEADERRUN_CACHE"
exec 9>"$LEADERRUN_CACHE/.etcd.lock"
flock 9
if cached; then echo "$BIN_DIR"; exit 0; fi

export GOTOOLCHAIN=local GOFLAGS="-mod=mod -buildvcs=false"
build="$LEADERRUN_CACHE/build"
mkdir -p "$build" "$BIN_DIR"
work=$(mktemp -d "$build/etcd.XXXXXX")
trap 'rm -rf "$work"' EXIT
cd "$work"

mkdir etcd etcdctl
cat >etcd/main.go <<'GO'
package main

import (
	"os"

	"go.etcd.io/etcd/server/v3/etcdmain"
)

func main() { etcdmain.Main(os.Args) }
GO
cat >etcdctl/main.go <<'GO'
package main

import "go.etcd.io/etcd/etcdctl/v3/ctlv3"

func main() { ctlv3.MustStart() }
GO

log "fetching etcd $VERSION modules"
quiet go mod init leaderrun-etcd-build
quiet go get "go.etcd.io/etcd/server/v3@$VERSION" "go.etcd.io/etcd/etcdctl/v3@$VERSION"
quiet go mod tidy
log "building etcd and etcdctl"
go build -trimpath -o "$work/out/" ./etcd ./etcdctl
mv "$work/out/etcd" "$work/out/etcdctl" "$BIN_DIR/"
cached || die "built binaries do not report version $VERSION"
"$BIN_DIR/etcd" --version >&2
echo "$BIN_DIR"
