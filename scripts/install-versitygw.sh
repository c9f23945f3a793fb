#!/usr/bin/env bash
# Build versitygw v1.8.0, an S3-compatible server written in Go (its posix
# backend keeps buckets as directories and objects as files), from the Go
# module proxy into $LEADERRUN_CACHE/versitygw-v1.8.0/versitygw and print
# that directory. internal/testenv reads the binary from
# $LEADERRUN_VERSITYGW_BIN. None of its code is in this repository.
# Idempotent: returns at once if the binary is there and reports v1.8.0.
#
# versitygw listens on every interface (:7070) unless told otherwise: the
# tests always start it with --port 127.0.0.1:PORT, and leave its WebUI,
# admin and website servers off (their defaults).
# Usage: scripts/install-versitygw.sh
set -euo pipefail
# shellcheck source-path=SCRIPTDIR source=lib.sh
. "$(dirname "${BASH_SOURCE[0]}")/lib.sh"

VERSION=v1.8.0
BIN_DIR="$LEADERRUN_CACHE/versitygw-$VERSION"

cached() { [[ $("$BIN_DIR/versitygw" --version 2>/dev/null) == *"Version  : $VERSION"* ]]; }
if cached; then echo "$BIN_DIR"; exit 0; fi
# One build at a time (tests may call this concurrently).
mkdir -p "$LEADERRUN_CACHE" "$BIN_DIR"
exec 9>"$LEADERRUN_CACHE/.versitygw.lock"
flock 9
if cached; then echo "$BIN_DIR"; exit 0; fi

log "building versitygw $VERSION (minutes, cold)"
# go install of a module version builds it with its own go.mod and go.sum,
# outside any workspace; -X sets what --version reports (the Makefile's
# way), which cached() checks.
GOTOOLCHAIN=local GOWORK=off GOFLAGS=-mod=mod GOBIN="$BIN_DIR/new" \
  quiet go install -trimpath -ldflags "-X main.Version=$VERSION" "github.com/versity/versitygw/cmd/versitygw@$VERSION" ||
  die "building versitygw $VERSION failed"
mv "$BIN_DIR/new/versitygw" "$BIN_DIR/versitygw"
rmdir "$BIN_DIR/new"
cached || die "the built versitygw does not report version $VERSION"
echo "$BIN_DIR"
