#!/usr/bin/env bash
# Install Azurite 3.35.0, Microsoft's Azure Storage emulator, from the npm
# registry into $LEADERRUN_CACHE/azurite-3.35.0 and print the path of its
# blob service's launcher (internal/testenv reads it from
# $LEADERRUN_AZURITE_BIN). Tests start their own blob services from it, on
# free loopback ports; nothing is started here.
# Idempotent: prints the path at once if it is installed and answers.
# Needs Node.js and npm (Node 20 here); 3.35.0 is the last Azurite whose
# package accepts Node below 21.
# Usage: scripts/install-azurite.sh
set -euo pipefail
# shellcheck source-path=SCRIPTDIR source=lib.sh
. "$(dirname "${BASH_SOURCE[0]}")/lib.sh"

VERSION=3.35.0
DIR="$LEADERRUN_CACHE/azurite-$VERSION"
BIN="$DIR/node_modules/.bin/azurite-blob"

cached() { [[ -x $BIN && $("$BIN" --version 2>/dev/null) == "$VERSION" ]]; }
if cached; then echo "$BIN"; exit 0; fi
command -v node >/dev/null && command -v npm >/dev/null ||
  die "Azurite needs Node.js and npm: install them (apt-get install nodejs npm), then run this script again"
# One install at a time (tests may call this concurrently).
mkdir -p "$LEADERRUN_CACHE"
exec 9>"$LEADERRUN_CACHE/.azurite.lock"
flock 9
if cached; then echo "$BIN"; exit 0; fi

work=$(mktemp -d "$LEADERRUN_CACHE/azurite.XXXXXX")
trap 'rm -rf "$work"' EXIT
log "installing azurite@$VERSION with npm"
# A package of its own, so that npm keeps the install and its lock file
# inside $work; no audit or funding requests, no install scripts of
# dependencies beyond what Azurite declares.
printf '{"name":"leaderrun-azurite","private":true}\n' >"$work/package.json"
quiet npm install --prefix "$work" --no-audit --no-fund --omit=dev --save-exact "azurite@$VERSION"
rm -rf "$DIR"
mv "$work" "$DIR"
trap - EXIT
cached || die "azurite installed in $DIR, but $BIN does not report version $VERSION"
echo "$BIN"
