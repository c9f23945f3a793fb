#!/usr/bin/env bash
# Shared helpers for the scripts in this directory. Source it, don't run it:
#   . "$(dirname "${BASH_SOURCE[0]}")/lib.sh"
# Provides: LEADERRUN_CACHE, log, die, quiet, free_port, free_ports, wait_http,
# pid_running, spawn, alive, stop_proc, stop_all, write_env.

# Build cache for test servers; outside the repo, overridable by env.
LEADERRUN_CACHE="${LEADERRUN_CACHE:-${XDG_CACHE_HOME:-$HOME/.cache}/leaderrun}"
export LEADERRUN_CACHE

# log MSG... — message to stderr, prefixed with the script name.
log() { printf '[%s] %s\n' "$(basename "$0")" "$*" >&2; }

# die MSG... — log and exit 1.
die() { log "error: $*"; exit 1; }

# quiet CMD... — run CMD with its output hidden unless it fails.
quiet() {
  local out rc=0
  out=$("$@" 2>&1) || rc=$?
  ((rc == 0)) || printf '%s\n' "$out" >&2
  return "$rc"
}

# free_port — print a port that is free right now: chosen by the kernel if
# python3 is around, else a random one in 20000-39999 that ss shows unused
# (TCP and UDP).
free_port() {
  if command -v python3 >/dev/null 2>&1 &&
    python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1",0)); print(s.getsockname()[1])' 2>/dev/null; then
    return 0
  fi
  local port i
  for i in $(seq 200); do
    port=$((20000 + RANDOM % 20000))
    if [[ -z $(ss -Htuan "sport = :$port") ]]; then echo "$port"; return 0; fi
  done
  die "free_port: no free port found after $i tries"
}

# free_ports N — print N distinct free ports, one per line.
free_ports() {
  local n=$1 p
  local -A seen=()
  while ((${#seen[@]} < n)); do
    p=$(free_port)
    [[ -n ${seen[$p]:-} ]] && continue
    seen[$p]=1
    echo "$p"
  done
}

# wait_http URL TIMEOUT_S [GREP_RE] [PID] — poll URL until it answers 2xx
# (and, if given, its body with all whitespace removed matches GREP_RE).
# Gives up early if PID dies.
# Readiness wait only; returns 1 on timeout.
wait_http() {
  local url=$1 timeout=$2 re=${3:-} pid=${4:-} body deadline=$((SECONDS + $2))
  while ((SECONDS < deadline)); do
    if body=$(curl -fsS --max-time 2 "$url" 2>/dev/null) && { [[ -z $re ]] || tr -d '[:space:]' <<<"$body" | grep -Eq "$re"; }; then
      return 0
    fi
    if [[ -n $pid ]] && ! pid_running "$pid"; then
      log "wait_http: process $pid exited while waiting for $url"
      return 1
    fi
    sleep 0.2
  done
  log "wait_http: $url not ready after ${timeout}s"
  return 1
}

# pid_running PID — true if PID exists and is not a zombie (this machine's
# init reaps orphans with ~1s delay, so `kill -0` alone would lag).
pid_running() {
  local st
  st=$(cat "/proc/$1/stat" 2>/dev/null) || return 1
  st=${st##*) }
  [[ ${st%% *} != Z ]]
}

# spawn DIR NAME — run the command line stored in DIR/NAME.cmd detached in its
# own session; output is appended to DIR/NAME.log, its pid written to DIR/NAME.pid.
spawn() {
  local pidf="$1/$2.pid" i
  rm -f "$pidf"
  # shellcheck disable=SC2016 # expanded by the inner shell
  setsid bash -c 'echo $$ >"$1"; eval "exec $(<"$2")"' _ "$pidf" "$1/$2.cmd" \
    </dev/null >>"$1/$2.log" 2>&1 &
  for i in $(seq 50); do [[ -s $pidf ]] && return 0; sleep 0.1; done
  die "spawn $2: no pid after 5s"
}

# alive DIR NAME — true if the process recorded in DIR/NAME.pid is running.
alive() { [[ -s $1/$2.pid ]] && pid_running "$(<"$1/$2.pid")"; }

# stop_proc DIR NAME [SIGNAL] — send SIGNAL (default TERM; SIGKILL after 15s)
# to the process in DIR/NAME.pid, wait until it is gone, remove the pid file.
stop_proc() {
  local pidf="$1/$2.pid" sig=${3:-TERM} pid i
  [[ -s $pidf ]] || return 0
  pid=$(<"$pidf")
  kill "-$sig" "$pid" 2>/dev/null || true
  for i in $(seq 150); do pid_running "$pid" || break; sleep 0.1; done
  if pid_running "$pid"; then
    log "$2 (pid $pid) still running 15s after SIG$sig; sending SIGKILL"
    kill -KILL "$pid" 2>/dev/null || true
    while pid_running "$pid"; do sleep 0.1; done
  fi
  rm -f "$pidf"
}

# stop_all DIR SIGNAL NAME... — stop_proc all the named processes in parallel.
stop_all() {
  local dir=$1 sig=$2 n; shift 2
  for n in "$@"; do [[ -s $dir/$n.pid ]] && kill "-$sig" "$(<"$dir/$n.pid")" 2>/dev/null; done
  for n in "$@"; do stop_proc "$dir" "$n" "$sig"; done
}

# write_env FILE NAME VALUE [NAME VALUE]... — write "export NAME=VALUE" lines
# (unquoted, so easy to parse from Go too) to FILE and echo them on stdout.
write_env() {
  local f=$1; shift
  : >"$f"
  while (($#)); do
    [[ $2 =~ ^[A-Za-z0-9_./:,=@+-]+$ ]] || die "write_env: unsafe value for $1: $2"
    echo "export $1=$2" >>"$f"
    shift 2
  done
  cat "$f"
}
