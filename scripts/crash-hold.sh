#!/usr/bin/env bash
# How long a crashed leader keeps the lock from `--try` runs, at the default
# timings: docs/recipes.md, "--try and a leader that crashes".
#
#   scripts/crash-hold.sh [--backend etcd|consul|all] [--runs N]
#
# Per store: starts a throwaway server (scripts/etcd.sh, scripts/consul.sh),
# runs a leader whose job sleeps, kills the leader with SIGKILL once the job
# runs, then runs `leaderrun --try` every 0.5 s until one runs its command,
# and prints how long that took and how many runs exited 75 before it;
# N times per store (default 3), one row each.
set -euo pipefail
cd "$(dirname "$0")/.."
# shellcheck source-path=SCRIPTDIR source=lib.sh
. scripts/lib.sh

backends=(etcd consul) runs=3
while (($#)); do
  case $1 in
    --backend)
      case $2 in
        all) ;;
        etcd | consul) backends=("$2") ;;
        *) die "--backend $2: want etcd, consul or all" ;;
      esac
      shift 2 ;;
    --runs) [[ $2 =~ ^[1-9][0-9]*$ ]] || die "--runs $2: want a positive number"; runs=$2; shift 2 ;;
    *) sed -n '2,/^set -euo/{/^#/s/^# \{0,1\}//p}' "$0" >&2; exit 2 ;;
  esac
done

work=$(mktemp -d)
# scripts/etcd.sh and scripts/consul.sh take the same commands.
cleanup() {
  for b in "${backends[@]}"; do
    [[ -d $work/$b ]] && scripts/"$b".sh stop --kill --dir "$work/$b" >/dev/null 2>&1 || true
  done
  rm -rf "$work"
}
trap cleanup EXIT

CGO_ENABLED=0 go build -trimpath -tags urfave_cli_no_docs -ldflags='-s -w' -o "$work/leaderrun" .
lr=$work/leaderrun

now() { date +%s.%N; }

printf '| store | run | held after the kill | `--try` runs that exited 75 |\n|---|---|---|---|\n'
for b in "${backends[@]}"; do
  env_lines=$(scripts/"$b".sh start --dir "$work/$b")
  for ((run = 1; run <= runs; run++)); do (
    eval "$env_lines"
    lock=crash-hold-$b-$run
    ran=$work/$b-$run.running
    "$lr" --quiet --lock "$lock" -- sh -c "echo \$FENCE_TOKEN >'$ran'; exec sleep 600" &
    leader=$!
    trap 'kill -9 "$leader" 2>/dev/null || true' EXIT
    until [[ -s $ran ]]; do
      kill -0 "$leader" 2>/dev/null || die "$b: the leader exited before its job ran"
      sleep 0.05
    done
    kill -9 "$leader"
    killed=$(now)
    wait "$leader" 2>/dev/null || true
    skipped=0
    while :; do
      rc=0
      "$lr" --quiet --try --lock "$lock" -- true || rc=$?
      case $rc in
        0) break ;;
        75) skipped=$((skipped + 1)); sleep 0.5 ;;
        *) die "$b: --try exited $rc" ;;
      esac
    done
    took=$(awk -v a="$killed" -v b="$(now)" 'BEGIN { printf "%.1f s", b - a }')
    printf '| %s | %d | %s | %d |\n' "$b" "$run" "$took" "$skipped"
  ); done
  scripts/"$b".sh stop --kill --dir "$work/$b" >/dev/null
done
