#!/usr/bin/env bash
# Run a throwaway etcd (v3.6.16, built by install-etcd.sh) on 127.0.0.1 for tests.
#
#   scripts/etcd.sh start [--members 1|3] [--dir DIR]
#       Start a 1- or 3-member cluster (default 1) on free ports, data in DIR
#       (default: new mktemp dir), wait until every member is healthy, write
#       DIR/env and print it on stdout:
#         export ETCDCTL_ENDPOINTS=http://127.0.0.1:P1[,...]
#         export LEADERRUN_TEST_ETCD_DIR=DIR
#         export LEADERRUN_TEST_ETCD_BIN=/path/to/bin   (etcd, etcdctl)
#       If DIR was started before (member-N.cmd exist) the same members,
#       ports and data are reused.
#   scripts/etcd.sh stop [--kill] [--dir DIR]
#       stop all members (followers first; SIGTERM, or SIGKILL with --kill),
#       wait until gone. SIGTERM takes etcd ~2s; --kill is instant.
#   scripts/etcd.sh stop-member N [--kill] [--dir DIR]
#       stop member N (1-based) with SIGTERM (graceful; a leader hands over
#       leadership first) or SIGKILL (--kill: a crash); waits until it is gone.
#   scripts/etcd.sh start-member N [--dir DIR]
#       start member N again with the same data; waits until its /health is
#       true, so it fails (30s) if no quorum can be formed.
#   scripts/etcd.sh restart-member N [--kill] [--dir DIR]
# DIR defaults to $LEADERRUN_TEST_ETCD_DIR for all but start.
# Per member: DIR/member-N.{cmd,pid,log} and data in DIR/member-N.data.
set -euo pipefail
# shellcheck source-path=SCRIPTDIR source=lib.sh
. "$(dirname "${BASH_SOURCE[0]}")/lib.sh"

usage() { sed -n '2,/^set -euo/{/^#/s/^# \{0,1\}//p}' "$0" >&2; exit 2; }

cmd=${1:-}; [[ -n $cmd ]] || usage; shift
sig=TERM member="" members=1 dir=${LEADERRUN_TEST_ETCD_DIR:-}
[[ $cmd == start ]] && dir=""
[[ $cmd == *-member ]] && { member=${1:-}; [[ $member =~ ^[1-9]$ ]] || usage; shift; }
while (($#)); do
  case $1 in
    --members) members=$2; shift 2 ;;
    --dir) dir=$2; shift 2 ;;
    --kill) sig=KILL; shift ;;
    *) usage ;;
  esac
done
[[ $cmd == start || -d $dir ]] || die "$cmd: --dir DIR (or LEADERRUN_TEST_ETCD_DIR) required"

client_url() { sed -E 's/.*--advertise-client-urls ([^ ]+).*/\1/' "$dir/member-$1.cmd"; }
member_count() { find "$dir" -maxdepth 1 -name 'member-*.cmd' | wc -l; }

# init_cmds — choose ports and write DIR/member-N.cmd for a new cluster.
init_cmds() {
  local bin=$1 i cluster="" ports token="leaderrun-$$-$RANDOM"
  mapfile -t ports < <(free_ports $((2 * members)))
  for ((i = 1; i <= members; i++)); do
    cluster+="${cluster:+,}m$i=http://127.0.0.1:${ports[2 * i - 1]}"
  done
  for ((i = 1; i <= members; i++)); do
    local c="http://127.0.0.1:${ports[2 * i - 2]}" p="http://127.0.0.1:${ports[2 * i - 1]}"
    printf '%q ' "$bin/etcd" --name "m$i" --data-dir "$dir/member-$i.data" \
      --listen-client-urls "$c" --advertise-client-urls "$c" \
      --listen-peer-urls "$p" --initial-advertise-peer-urls "$p" \
      --initial-cluster "$cluster" --initial-cluster-state new \
      --initial-cluster-token "$token" \
      --heartbeat-interval 100 --election-timeout 1000 >"$dir/member-$i.cmd"
    echo >>"$dir/member-$i.cmd"
  done
}

# start_member N [HEALTH_TIMEOUT] — spawn member N unless running; wait for it.
start_member() {
  local n=$1 url
  [[ -f $dir/member-$n.cmd ]] || die "no member $n in $dir"
  url=$(client_url "$n")
  alive "$dir" "member-$n" || spawn "$dir" "member-$n"
  if ! wait_http "$url/health" "${2:-30}" '"health":"true"' "$(<"$dir/member-$n.pid")"; then
    log "member $n not healthy; last log lines:"; tail -n 10 "$dir/member-$n.log" >&2
    return 1
  fi
}

case $cmd in
  start)
    [[ $members == 1 || $members == 3 ]] || die "--members must be 1 or 3"
    bin=$("$(dirname "$0")/install-etcd.sh")
    if [[ -z $dir ]]; then dir=$(mktemp -d "${TMPDIR:-/tmp}/leaderrun-etcd.XXXXXX"); fi
    mkdir -p "$dir"; dir=$(cd "$dir" && pwd)
    (($(member_count) > 0)) || init_cmds "$bin"
    n=$(member_count)
    for ((i = 1; i <= n; i++)); do alive "$dir" "member-$i" || spawn "$dir" "member-$i"; done
    for ((i = 1; i <= n; i++)); do
      start_member "$i" 60 || { "$0" stop --dir "$dir"; die "etcd failed to start (logs in $dir)"; }
    done
    eps=$(for ((i = 1; i <= n; i++)); do client_url "$i"; done | paste -sd,)
    write_env "$dir/env" ETCDCTL_ENDPOINTS "$eps" LEADERRUN_TEST_ETCD_DIR "$dir" \
      LEADERRUN_TEST_ETCD_BIN "$bin"
    log "etcd up: $n member(s) at $eps"
    ;;
  stop)
    # Followers first: a leader stopping while its followers also stop waits
    # ~7s for a leadership transfer that cannot succeed.
    leaders=() followers=()
    for ((i = 1; i <= $(member_count); i++)); do
      metrics=$(curl -fsS --max-time 1 "$(client_url "$i")/metrics" 2>/dev/null || true)
      if [[ $metrics == *$'\netcd_server_is_leader 1'* ]]; then
        leaders+=("member-$i")
      else
        followers+=("member-$i")
      fi
    done
    stop_all "$dir" "$sig" "${followers[@]}"
    stop_all "$dir" "$sig" "${leaders[@]}"
    ;;
  stop-member) stop_proc "$dir" "member-$member" "$sig" ;;
  start-member) start_member "$member" ;;
  restart-member) stop_proc "$dir" "member-$member" "$sig"; start_member "$member" ;;
  *) usage ;;
esac
