#!/usr/bin/env bash
# Install Apache ZooKeeper 3.8 for the tests, from Debian's zookeeper package
# (it brings a Java runtime), and print the class path that the test helpers
# start servers with (internal/testenv reads it from
# $LEADERRUN_ZOOKEEPER_CLASSPATH).
# Idempotent: prints the class path at once if the jars and java are there.
# Installing needs root and apt-get; nothing is downloaded otherwise.
# The package starts no server (zookeeperd would, and is not installed), and
# a policy-rc.d forbids every maintainer script to start a service while
# apt-get runs, so no system ZooKeeper is left running.
# Usage: scripts/install-zookeeper.sh
set -euo pipefail
# shellcheck source-path=SCRIPTDIR source=lib.sh
. "$(dirname "${BASH_SOURCE[0]}")/lib.sh"

JAR=/usr/share/java/zookeeper.jar
# The server logs through slf4j; slf4j-simple (from libslf4j-java, a
# dependency of the package) prints its warnings on stderr.
LOGGER=/usr/share/java/slf4j-simple.jar
CLASSPATH_OUT="$JAR:$LOGGER"

installed() { [[ -r $JAR && -r $LOGGER ]] && command -v java >/dev/null; }
if installed; then echo "$CLASSPATH_OUT"; exit 0; fi

[[ $(id -u) == 0 ]] || die "ZooKeeper is not installed; as root, run this script again, or: apt-get install zookeeper"
command -v apt-get >/dev/null || die "ZooKeeper is not installed and there is no apt-get: install ZooKeeper 3.8 and set LEADERRUN_ZOOKEEPER_CLASSPATH"

# One install at a time (tests may call this concurrently).
mkdir -p "$LEADERRUN_CACHE"
exec 9>"$LEADERRUN_CACHE/.zookeeper.lock"
flock 9
if installed; then echo "$CLASSPATH_OUT"; exit 0; fi

policy=/usr/sbin/policy-rc.d
if [[ ! -e $policy ]]; then
  printf '#!/bin/sh\n# leaderrun install-zookeeper.sh: start no service while installing\nexit 101\n' >"$policy"
  chmod 755 "$policy"
  trap 'rm -f "$policy"' EXIT
fi
export DEBIAN_FRONTEND=noninteractive
if ! apt-cache show zookeeper >/dev/null 2>&1; then
  log "apt-get update"
  quiet apt-get update -qq
fi
log "installing Debian's zookeeper package and a Java runtime"
quiet apt-get install -y -qq --no-install-recommends zookeeper default-jre-headless
installed || die "zookeeper installed, but $JAR, $LOGGER or java is missing"
echo "$CLASSPATH_OUT"
