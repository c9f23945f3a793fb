#!/bin/sh
# build.sh assembles watchdog_amd64.asm into ../watchdog_linux_amd64.bin
# with GNU binutils: one read-only, executable segment, no section
# headers' worth of symbols. The output is committed; TestEmbeddedWatchdogIsBuilt
# checks that it is what this script makes of the source.
set -eu
cd "$(dirname "$0")"
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
as --64 -o "$tmp/w.o" watchdog_amd64.asm
ld -static -nostdlib -s --build-id=none -z noseparate-code -z noexecstack -o "$tmp/w" "$tmp/w.o"
cp "$tmp/w" "${1:-../watchdog_linux_amd64.bin}"
