#!/usr/bin/env bash
# Builds leaderrun's release images (.goreleaser.yaml, kos) for this
# machine with ko, without a Docker daemon or a registry, and checks them:
# each holds only its static binary at /ko-app/NAME, as its entrypoint,
# and that binary runs `version` (scripts/image/main.go). ko is installed
# once into $LEADERRUN_CACHE/bin from the Go module proxy, never into the
# repository.
#
#   scripts/image.sh
set -euo pipefail

version=v0.18.0
cache="${LEADERRUN_CACHE:-${XDG_CACHE_HOME:-$HOME/.cache}/leaderrun}"
[[ $cache == /* ]] || cache="$PWD/$cache" # go install wants an absolute GOBIN
cd "$(dirname "$0")/.."
ko="$cache/bin/ko"

if ! "$ko" version 2>/dev/null | grep -Eqx "v?${version#v}"; then
	echo "== installing ko $version into $cache/bin"
	# Outside the module and without the caller's GOFLAGS.
	(cd / && GOFLAGS='' GOBIN="$cache/bin" go install "github.com/google/ko@$version")
fi
go run ./scripts/image -ko "$ko"
