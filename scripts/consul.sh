#!/usr/bin/env bash
# Run a throwaway Consul (v1.14.8, built by install-consul.sh) for tests.
#
#   scripts/consul.sh start [--servers 1|3] [--dir DIR]
#       1 (default): one `consul agent -dev` on 127.0.0.1 (state in memory).
#       3: three servers on 127.0.0.1, 127.0.0.2, 127.0.0.3 (-bootstrap-expect 3),
#          data in DIR/server-N.data.
#       All ports are free ones picked at start; DNS and gRPC are disabled.
#       Waits until every server sees a leader and its node is registered
#       (serfHealth passing), writes DIR/env and prints it on stdout:
#         export CONSUL_HTTP_ADDR=127.0.0.1:P1
#         export LEADERRUN_TEST_CONSUL_DIR=DIR
#         export LEADERRUN_TEST_CONSUL_ADDRS=127.0.0.1:P1[,127.0.0.2:P2,127.0.0.3:P3]
#         export LEADERRUN_TEST_CONSUL_BIN=/path/to/bin   (consul)
#       If DIR was started before (server-N.cmd exist) the same servers,
#       ports and data are reused.
#   scripts/consul.sh stop [--kill] [--dir DIR]
#       stop all servers (SIGTERM, or SIGKILL with --kill), wait until gone.
#   scripts/consul.sh stop-server N [--kill] [--dir DIR]
#       stop server N with SIGTERM (servers don't leave the cluster on TERM)
#       or SIGKILL (--kill); waits until it is gone.
#   scripts/consul.sh start-server N [--dir DIR]
#       start server N again (same data; dev mode: empty state) and wait as above.
#   scripts/consul.sh restart-server N [--kill] [--dir DIR]
# DIR defaults to $LEADERRUN_TEST_CONSUL_DIR for all but start.
# Per server: DIR/server-N.{cmd,addr,pid,log}; node names s1..s3.
set -euo pipefail
# shellcheck source-path=SCRIPTDIR source=lib.sh
. "$(dirname "${BASH_SOURCE[0]}")/lib.sh"

usage() { sed -n '2,/^set -euo/{/^#/s/^# \{0,1\}//p}' "$0" >&2; exit 2; }

cmd=${1:-}; [[ -n $cmd ]] || usage; shift
sig=TERM server="" servers=1 dir=${LEADERRUN_TEST_CONSUL_DIR:-}
[[ $cmd == start ]] && dir=""
[[ $cmd == *-server ]] && { server=${1:-}; [[ $server =~ ^[1-9]$ ]] || usage; shift; }
while (($#)); do
  case $1 in
    --servers) servers=$2; shift 2 ;;
    --dir) dir=$2; shift 2 ;;
    --kill) sig=KILL; shift ;;
    *) usage ;;
  esac
done
[[ $cmd == start || -d $dir ]] || die "$cmd: --dir DIR (or LEADERRUN_TEST_CONSUL_DIR) required"

http_addr() { cat "$dir/server-$1.addr"; }
server_count() { find "$dir" -maxdepth 1 -name 'server-*.cmd' | wc -l; }

# init_cmds BIN — choose ports and write DIR/server-N.cmd for a new cluster.
init_cmds() {
  local bin=$1 i j ports common
  mapfile -t ports < <(free_ports $((3 * servers)))  # http, serf_lan, server per node
  common=(-disable-host-node-id -hcl 'disable_update_check = true'
    -hcl 'performance { raft_multiplier = 1 }')
  for ((i = 1; i <= servers; i++)); do
    local ip=127.0.0.$i http=${ports[3 * i - 3]} lan=${ports[3 * i - 2]} rpc=${ports[3 * i - 1]}
    local hcl="ports { http = $http, serf_lan = $lan, server = $rpc, serf_wan = -1, dns = -1, grpc = -1, grpc_tls = -1, https = -1 }"
    local args=("$bin/consul" agent -node "s$i" -bind "$ip" -client "$ip" -hcl "$hcl" "${common[@]}")
    if ((servers == 1)); then
      args+=(-dev)
    else
      args+=(-server -bootstrap-expect 3 -data-dir "$dir/server-$i.data" -retry-interval 500ms
        -hcl 'gossip_lan { gossip_interval = "100ms", probe_interval = "200ms", probe_timeout = "100ms" }')
      for ((j = 1; j <= servers; j++)); do
        ((j == i)) || args+=(-retry-join "127.0.0.$j:${ports[3 * j - 2]}")
      done
    fi
    echo "$ip:$http" >"$dir/server-$i.addr"
    printf '%q ' "${args[@]}" >"$dir/server-$i.cmd"
    echo >>"$dir/server-$i.cmd"
  done
}

# start_server N [TIMEOUT] — spawn server N unless running; wait until it sees
# a leader and its own node is registered with a passing serfHealth check.
start_server() {
  local n=$1 addr pid
  [[ -f $dir/server-$n.cmd ]] || die "no server $n in $dir"
  addr=$(http_addr "$n")
  alive "$dir" "server-$n" || spawn "$dir" "server-$n"
  pid=$(<"$dir/server-$n.pid")
  if ! wait_http "http://$addr/v1/status/leader" "${2:-30}" '^"[^"]+:[0-9]+"' "$pid" ||
    ! wait_http "http://$addr/v1/health/node/s$n" "${2:-30}" '"CheckID":"serfHealth"[^}]*"Status":"passing"' "$pid"; then
    log "server $n not ready; last log lines:"; tail -n 10 "$dir/server-$n.log" >&2
    return 1
  fi
}

case $cmd in
  start)
    [[ $servers == 1 || $servers == 3 ]] || die "--servers must be 1 or 3"
    bin=$("$(dirname "$0")/install-consul.sh")
    if [[ -z $dir ]]; then dir=$(mktemp -d "${TMPDIR:-/tmp}/leaderrun-consul.XXXXXX"); fi
    mkdir -p "$dir"; dir=$(cd "$dir" && pwd)
    (($(server_count) > 0)) || init_cmds "$bin"
    n=$(server_count)
    for ((i = 1; i <= n; i++)); do alive "$dir" "server-$i" || spawn "$dir" "server-$i"; done
    for ((i = 1; i <= n; i++)); do
      start_server "$i" 60 || { "$0" stop --dir "$dir"; die "consul failed to start (logs in $dir)"; }
    done
    addrs=$(for ((i = 1; i <= n; i++)); do http_addr "$i"; done | paste -sd,)
    write_env "$dir/env" CONSUL_HTTP_ADDR "${addrs%%,*}" LEADERRUN_TEST_CONSUL_DIR "$dir" \
      LEADERRUN_TEST_CONSUL_ADDRS "$addrs" LEADERRUN_TEST_CONSUL_BIN "$bin"
    log "consul up: $n server(s) at $addrs"
    ;;
  stop)
    mapfile -t names < <(seq -f 'server-%g' "$(server_count)")
    stop_all "$dir" "$sig" "${names[@]}"
    ;;
  stop-server) stop_proc "$dir" "server-$server" "$sig" ;;
  start-server) start_server "$server" ;;
  restart-server) stop_proc "$dir" "server-$server" "$sig"; start_server "$server" ;;
  *) usage ;;
esac
