#!/usr/bin/env bash
# Make sure PostgreSQL's server binaries (initdb, pg_ctl, postgres, psql) and
# PgBouncer are installed, and print the directory that holds initdb.
# When something is missing it installs Debian's postgresql and pgbouncer
# packages (as root, with apt-get); it never starts a server: the tests start
# throwaway clusters of their own (internal/testenv/postgres.go).
# Idempotent: returns at once when everything is there.
# Usage: scripts/install-postgres.sh
#
# Environment: LEADERRUN_POSTGRES_BIN (a directory holding initdb, pg_ctl and
# postgres) and LEADERRUN_PGBOUNCER_BIN (the pgbouncer binary) name binaries
# installed some other way; the tests read the same variables.
set -euo pipefail
# shellcheck source-path=SCRIPTDIR source=lib.sh
. "$(dirname "${BASH_SOURCE[0]}")/lib.sh"

# bin_dir prints the directory holding initdb, pg_ctl, postgres and psql:
# $LEADERRUN_POSTGRES_BIN if set (and nothing else), else Debian's
# /usr/lib/postgresql/N/bin (newest N), else the directory of the initdb found
# in PATH (symlinks followed), as internal/testenv looks for them.
bin_dir() {
	local d
	local -a dirs=()
	if [[ -n ${LEADERRUN_POSTGRES_BIN:-} ]]; then
		dirs+=("$LEADERRUN_POSTGRES_BIN")
	else
		while IFS= read -r d; do dirs+=("$d"); done < <(ls -d /usr/lib/postgresql/*/bin 2>/dev/null | sort -V -r)
		if d=$(command -v initdb 2>/dev/null); then dirs+=("$(dirname "$(readlink -f "$d")")"); fi
	fi
	for d in "${dirs[@]}"; do
		if [[ -x $d/initdb && -x $d/pg_ctl && -x $d/postgres && -x $d/psql ]]; then
			echo "$d"
			return 0
		fi
	done
	return 1
}

have_pgbouncer() {
	[[ -n ${LEADERRUN_PGBOUNCER_BIN:-} && -x $LEADERRUN_PGBOUNCER_BIN ]] ||
		command -v pgbouncer >/dev/null 2>&1 || [[ -x /usr/sbin/pgbouncer ]]
}

if dir=$(bin_dir) && have_pgbouncer; then echo "$dir"; exit 0; fi
if [[ -n ${LEADERRUN_POSTGRES_BIN:-} ]] && ! bin_dir >/dev/null; then
	die "LEADERRUN_POSTGRES_BIN=$LEADERRUN_POSTGRES_BIN holds no initdb, pg_ctl, postgres and psql"
fi

[[ $(id -u) == 0 ]] || die "PostgreSQL or PgBouncer is missing: run this as root to install Debian's packages, or set LEADERRUN_POSTGRES_BIN and LEADERRUN_PGBOUNCER_BIN"
command -v apt-get >/dev/null 2>&1 || die "PostgreSQL or PgBouncer is missing and apt-get is not available: install them, or set LEADERRUN_POSTGRES_BIN and LEADERRUN_PGBOUNCER_BIN"

# One installation at a time (tests may call this concurrently).
mkdir -p "$LEADERRUN_CACHE"
exec 9>"$LEADERRUN_CACHE/.postgres.lock"
flock 9
if dir=$(bin_dir) && have_pgbouncer; then echo "$dir"; exit 0; fi

pkgs=()
bin_dir >/dev/null || pkgs+=(postgresql)
have_pgbouncer || pkgs+=(pgbouncer)

# Keep the packages from starting services: invoke-rc.d asks policy-rc.d,
# and 101 means "not allowed". A policy already in place is left alone.
cleanup=()
trap 'rm -f "${cleanup[@]}"' EXIT
if [[ ! -e /usr/sbin/policy-rc.d ]]; then
	printf '#!/bin/sh\n# leaderrun install-postgres.sh: no services during the install\nexit 101\n' >/usr/sbin/policy-rc.d
	chmod 755 /usr/sbin/policy-rc.d
	cleanup+=(/usr/sbin/policy-rc.d)
fi
# Keep postgresql-common from creating the Debian-managed "main" cluster:
# on a fresh system, say so in its configuration before it is installed (it
# keeps ours, --force-confold); otherwise drop the clusters it creates.
if [[ ! -e /etc/postgresql-common/createcluster.conf ]]; then
	mkdir -p /etc/postgresql-common
	echo "create_main_cluster = false" >/etc/postgresql-common/createcluster.conf
fi
clusters() { command -v pg_lsclusters >/dev/null 2>&1 && pg_lsclusters -h 2>/dev/null | awk '{print $1, $2}' || true; }
before=$(clusters)

log "installing ${pkgs[*]} with apt-get"
export DEBIAN_FRONTEND=noninteractive
quiet apt-get update -qq
quiet apt-get install -y -qq --no-install-recommends -o Dpkg::Options::=--force-confold "${pkgs[@]}"

while read -r version name; do
	[[ -n $version ]] || continue
	if ! grep -qx "$version $name" <<<"$before"; then
		log "dropping the cluster $version/$name that the package created"
		quiet pg_dropcluster --stop "$version" "$name"
	fi
done < <(clusters)

dir=$(bin_dir) || die "installed ${pkgs[*]} but found no initdb, pg_ctl, postgres and psql"
have_pgbouncer || die "installed ${pkgs[*]} but found no pgbouncer"
"$dir/postgres" --version >&2
echo "$dir"
