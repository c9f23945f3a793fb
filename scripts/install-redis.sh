#!/usr/bin/env bash
# Make sure redis-server (and redis-cli) are installed, and print the path of
# redis-server. When it is missing it installs Debian's redis-server package
# (as root, with apt-get; bookworm's is Redis 7.0); it never starts a server:
# the tests start throwaway ones of their own on free loopback ports, with
# Sentinel from the same binary (redis-server --sentinel), and
# internal/testenv/redis.go reads the path from $LEADERRUN_REDIS_BIN.
# Idempotent: returns at once when redis-server is there.
# Usage: scripts/install-redis.sh
#
# Environment: LEADERRUN_REDIS_BIN names a redis-server installed some other
# way (redis-cli is looked for beside it, then in PATH).
set -euo pipefail
# shellcheck source-path=SCRIPTDIR source=lib.sh
. "$(dirname "${BASH_SOURCE[0]}")/lib.sh"

# server prints the redis-server to use: $LEADERRUN_REDIS_BIN if set (and
# nothing else), else the one in PATH, else Debian's /usr/bin/redis-server.
server() {
	if [[ -n ${LEADERRUN_REDIS_BIN:-} ]]; then
		[[ -x $LEADERRUN_REDIS_BIN ]] && echo "$LEADERRUN_REDIS_BIN"
		return
	fi
	command -v redis-server 2>/dev/null || { [[ -x /usr/bin/redis-server ]] && echo /usr/bin/redis-server; }
}

have_cli() {
	local s=$1
	[[ -x $(dirname "$s")/redis-cli ]] || command -v redis-cli >/dev/null 2>&1
}

if s=$(server) && have_cli "$s"; then echo "$s"; exit 0; fi
if [[ -n ${LEADERRUN_REDIS_BIN:-} ]]; then
	die "LEADERRUN_REDIS_BIN=$LEADERRUN_REDIS_BIN is not an executable redis-server with redis-cli beside it or in PATH"
fi

[[ $(id -u) == 0 ]] || die "redis-server is missing: run this as root to install Debian's package, or set LEADERRUN_REDIS_BIN"
command -v apt-get >/dev/null 2>&1 || die "redis-server is missing and apt-get is not available: install Redis 6.2 or later, or set LEADERRUN_REDIS_BIN"

# One installation at a time (tests may call this concurrently).
mkdir -p "$LEADERRUN_CACHE"
exec 9>"$LEADERRUN_CACHE/.redis.lock"
flock 9
if s=$(server) && have_cli "$s"; then echo "$s"; exit 0; fi

# Keep the package from starting its service: invoke-rc.d asks
# policy-rc.d, and 101 means "not allowed". A policy already in place is
# left alone.
cleanup=()
trap 'rm -f "${cleanup[@]}"' EXIT
if [[ ! -e /usr/sbin/policy-rc.d ]]; then
	printf '#!/bin/sh\n# leaderrun install-redis.sh: no services during the install\nexit 101\n' >/usr/sbin/policy-rc.d
	chmod 755 /usr/sbin/policy-rc.d
	cleanup+=(/usr/sbin/policy-rc.d)
fi
export DEBIAN_FRONTEND=noninteractive
if ! apt-cache show redis-server >/dev/null 2>&1; then
	log "apt-get update"
	quiet apt-get update -qq
fi
log "installing Debian's redis-server package with apt-get"
quiet apt-get install -y -qq --no-install-recommends -o Dpkg::Options::=--force-confold redis-server

s=$(server) || die "installed redis-server but found no redis-server binary"
have_cli "$s" || die "installed redis-server but found no redis-cli"
"$s" --version >&2
echo "$s"
