#!/usr/bin/env bash
# Checks the release configuration the way a release would use it, for
# humans before tagging (CI does not run it): installs goreleaser v2.15.1
# into $LEADERRUN_CACHE/bin if it is missing (several minutes the first
# time), then runs `goreleaser check` and a snapshot build for this machine,
# and prints the stamped version of the binary it built.
#
#   scripts/release-check.sh
#
# The full snapshot (every platform, archives, deb and rpm) is
#   goreleaser release --snapshot --clean
set -euo pipefail

version=v2.15.1
cache="${LEADERRUN_CACHE:-${XDG_CACHE_HOME:-$HOME/.cache}/leaderrun}"
[[ $cache == /* ]] || cache="$PWD/$cache" # go install wants an absolute GOBIN
cd "$(dirname "$0")/.."
goreleaser="$cache/bin/goreleaser"

if ! "$goreleaser" --version 2>/dev/null | grep -Eq "^GitVersion: +v?${version#v}\$"; then
	echo "== installing goreleaser $version into $cache/bin"
	# Outside the module and without the caller's GOFLAGS, so that neither
	# this repository's go.mod nor e.g. -mod=vendor affects the install.
	(cd / && GOFLAGS='' GOBIN="$cache/bin" go install "github.com/goreleaser/goreleaser/v2@$version")
fi

echo "== goreleaser check"
"$goreleaser" check
echo "== goreleaser build --snapshot --clean --single-target"
"$goreleaser" build --snapshot --clean --single-target
echo "== built"
bin=$(find dist -type f -name leaderrun -perm -u+x | head -n 1)
"$bin" version
