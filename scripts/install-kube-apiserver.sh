#!/usr/bin/env bash
# Build kube-apiserver v1.37.2 from the Go module proxy into
# $LEADERRUN_CACHE/kube-apiserver-v1.37.2/bin/kube-apiserver and print the
# bin dir. Idempotent: returns immediately if the binary is there and reports
# v1.37.2. About 6 minutes cold on 2 cores.
# Usage: scripts/install-kube-apiserver.sh
#
# k8s.io/kubernetes is not meant to be imported: its go.mod requires the
# k8s.io/* staging modules at v0.0.0 and replaces them with ./staging, which
# the module zip does not contain. So we copy the module out of the module
# cache, drop the replace lines, pin every staging module to its published
# v0.37.2 and build cmd/kube-apiserver in that copy, outside this repo.
set -euo pipefail
# shellcheck source-path=SCRIPTDIR source=lib.sh
. "$(dirname "${BASH_SOURCE[0]}")/lib.sh"

VERSION=v1.37.2
STAGING=v0.${VERSION#v1.}
MINOR=${STAGING#v0.}
MINOR=${MINOR%%.*}
BIN_DIR="$LEADERRUN_CACHE/kube-apiserver-$VERSION/bin"

cached() {
  [[ $("$BIN_DIR/kube-apiserver" --version 2>/dev/null) == "Kubernetes $VERSION" ]]
}
if cached; then echo "$BIN_DIR"; exit 0; fi
# One build at a time (tests may call this concurrently).
mkdir -p "$LEADERRUN_CACHE"
exec 9>"$LEADERRUN_CACHE/.kube-apiserver.lock"
flock 9
if cached; then echo "$BIN_DIR"; exit 0; fi

export GOTOOLCHAIN=local GOWORK=off GOFLAGS="-mod=mod -buildvcs=false"
build="$LEADERRUN_CACHE/build"
mkdir -p "$build" "$BIN_DIR"
work=$(mktemp -d "$build/kube-apiserver.XXXXXX")
trap 'chmod -R u+w "$work" 2>/dev/null; rm -rf "$work"' EXIT

log "fetching k8s.io/kubernetes@$VERSION"
dir=$(cd "$work" && go mod download -json "k8s.io/kubernetes@$VERSION" |
  sed -n 's/^[[:space:]]*"Dir": "\(.*\)",$/\1/p')
[[ -d $dir ]] || die "go mod download gave no module directory"
cp -r "$dir" "$work/src"
chmod -R u+w "$work/src"
cd "$work/src"
sed -i -e '/=> \.\/staging/d' \
  -e "s#^\(\s*k8s\.io/[a-z0-9-]*\) v0\.0\.0\$#\1 $STAGING#" go.mod
if grep -Eq '=> \./staging|^\s*k8s\.io/[a-z0-9-]+ v0\.0\.0$' go.mod; then
  die "go.mod still refers to the staging modules"
fi

log "building kube-apiserver (takes minutes)"
ver=k8s.io/component-base/version
go build -trimpath -ldflags "-s -w -X $ver.gitVersion=$VERSION \
  -X $ver.gitMajor=1 -X $ver.gitMinor=$MINOR -X $ver.gitTreeState=clean" \
  -o "$work/out/kube-apiserver" ./cmd/kube-apiserver
mv "$work/out/kube-apiserver" "$BIN_DIR/"
cached || die "built binary does not report version $VERSION"
"$BIN_DIR/kube-apiserver" --version >&2
echo "$BIN_DIR"
