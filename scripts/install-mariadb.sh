#!/usr/bin/env bash
# Make sure MariaDB's server (mariadbd) and mariadb-install-db are installed,
# and print the path of mariadbd. When one is missing it installs Debian's
# mariadb-server package (as root, with apt-get; bookworm's is MariaDB 10.11)
# without starting its service: the tests start throwaway servers of their
# own, each with its data directory in a temporary directory, on a free
# loopback port and a unix socket (internal/testenv/mariadb.go, which reads
# the path from $LEADERRUN_MARIADB_BIN).
# Idempotent: returns at once when both are there.
# Usage: scripts/install-mariadb.sh
#
# Environment: LEADERRUN_MARIADB_BIN names a mariadbd (or mysqld) installed
# some other way; mariadb-install-db (or mysql_install_db) is looked for
# beside it, in ../bin, ../scripts, then in PATH.
set -euo pipefail
# shellcheck source-path=SCRIPTDIR source=lib.sh
. "$(dirname "${BASH_SOURCE[0]}")/lib.sh"

# server prints the mariadbd to use: $LEADERRUN_MARIADB_BIN if set (and
# nothing else), else the one in PATH, else Debian's /usr/sbin/mariadbd.
server() {
	if [[ -n ${LEADERRUN_MARIADB_BIN:-} ]]; then
		[[ -x $LEADERRUN_MARIADB_BIN ]] && echo "$LEADERRUN_MARIADB_BIN"
		return
	fi
	command -v mariadbd 2>/dev/null || { [[ -x /usr/sbin/mariadbd ]] && echo /usr/sbin/mariadbd; }
}

have_install_db() {
	local d n
	d=$(dirname "$1")
	for n in mariadb-install-db mysql_install_db; do
		[[ -x $d/$n || -x $d/../bin/$n || -x $d/../scripts/$n ]] && return 0
		command -v "$n" >/dev/null 2>&1 && return 0
	done
	return 1
}

if s=$(server) && have_install_db "$s"; then echo "$s"; exit 0; fi
if [[ -n ${LEADERRUN_MARIADB_BIN:-} ]]; then
	die "LEADERRUN_MARIADB_BIN=$LEADERRUN_MARIADB_BIN is not an executable mariadbd with mariadb-install-db beside it or in PATH"
fi

[[ $(id -u) == 0 ]] || die "mariadbd is missing: run this as root to install Debian's mariadb-server package, or set LEADERRUN_MARIADB_BIN"
command -v apt-get >/dev/null 2>&1 || die "mariadbd is missing and apt-get is not available: install MariaDB 10.6 or later, or set LEADERRUN_MARIADB_BIN"

# One installation at a time (tests may call this concurrently).
mkdir -p "$LEADERRUN_CACHE"
exec 9>"$LEADERRUN_CACHE/.mariadb.lock"
flock 9
if s=$(server) && have_install_db "$s"; then echo "$s"; exit 0; fi

# Keep the package from starting its service: invoke-rc.d asks
# policy-rc.d, and 101 means "not allowed". A policy already in place is
# left alone.
cleanup=()
trap 'rm -f "${cleanup[@]}"' EXIT
if [[ ! -e /usr/sbin/policy-rc.d ]]; then
	printf '#!/bin/sh\n# leaderrun install-mariadb.sh: no services during the install\nexit 101\n' >/usr/sbin/policy-rc.d
	chmod 755 /usr/sbin/policy-rc.d
	cleanup+=(/usr/sbin/policy-rc.d)
fi
export DEBIAN_FRONTEND=noninteractive
if ! apt-cache show mariadb-server >/dev/null 2>&1; then
	log "apt-get update"
	quiet apt-get update -qq
fi
log "installing Debian's mariadb-server package with apt-get"
quiet apt-get install -y -qq --no-install-recommends -o Dpkg::Options::=--force-confold mariadb-server mariadb-client

s=$(server) || die "installed mariadb-server but found no mariadbd"
have_install_db "$s" || die "installed mariadb-server but found no mariadb-install-db"
"$s" --version >&2
echo "$s"
