#!/usr/bin/env bash
# W1 against the leader of a local cluster (or, with NODES=1, against one plain server), with
# the client in a process of its own, and what each node spent during the run, read from
# /proc: CPU time (user + system) and minor page faults. NODES=1 gives the same client the
# same run against `tidemark serve`, so the CPU a replica spends per event can be set beside
# a server's. Comparing two builds on a shared 2-vCPU machine needs several runs of each,
# alternating:
#
#   cp target/release/tidemark /tmp/tm-a      # build A, then the same for build B
#   for i in 1 2 3 4 5 6; do scripts/cluster-node-cpu.sh /tmp/tm-a; scripts/cluster-node-cpu.sh /tmp/tm-b; done
#
# Prints one line per run: the binary, each trial's events/s (ascending), the nodes' CPU
# seconds (all nodes, then the leader's and each follower's; user and system), the CPU per
# million events, and the leader's (or server's) page faults.
# Environment: NODES (3; 1 = a server), EVENTS (10000000), TRIALS (3), BUFFER (1MB),
# BASE_PORT (9300).
set -euo pipefail
bin="$1"
events="${EVENTS:-10000000}" trials="${TRIALS:-3}" buffer="${BUFFER:-1MB}" base="${BASE_PORT:-9300}" nodes="${NODES:-3}"
dir="$(mktemp -d)"
if [ "$nodes" = 1 ]; then
  "$bin" serve --data-dir "$dir/server" --http "127.0.0.1:$((base + 1))" --binary "127.0.0.1:$((base + 2))" \
    >"$dir/server.log" 2>&1 &
else
  "$bin" cluster up --nodes "$nodes" --data-dir "$dir/cluster" --base-port "$base" >"$dir/cluster.log" 2>&1 &
fi
up=$!
trap 'kill -INT $up 2>/dev/null; wait $up 2>/dev/null; rm -rf "$dir"' EXIT
if [ "$nodes" = 1 ]; then
  ready=
  for _ in $(seq 120); do
    curl -sf "http://127.0.0.1:$((base + 1))/ready" >/dev/null && ready=1 && break
    sleep 0.5
  done
  [ -n "$ready" ] || { echo "the server was not ready within 60 s: $dir/server.log" >&2; exit 1; }
  http=$((base + 1)) pids=$up
else
  leader=
  for _ in $(seq 120); do
    leader=$("$bin" cluster status --server "http://127.0.0.1:$((base + 1))" 2>/dev/null |
      grep -oiE 'leader[: ]+(node )?[0-9]+' | grep -oE '[0-9]+' | head -1 || true)
    [ -n "$leader" ] && break
    sleep 0.5
  done
  [ -n "$leader" ] || { echo "no leader within 60 s: $dir/cluster.log" >&2; exit 1; }
  http=$((base + (leader - 1) * 3 + 1))
  leader_pid=$(pgrep -P "$up" -f "serve --node-id $leader ")
  pids="$leader_pid $(pgrep -P "$up" -f 'serve --node-id' | grep -vx "$leader_pid")"
fi
# One line per node, the leader first: CPU ticks (user, system) and minor faults.
usage() { local f; for p in $pids; do read -ra f <"/proc/$p/stat"; echo "${f[13]} ${f[14]} ${f[9]}"; done; }
usage >"$dir/before"
"$bin" bench insert --target server --server "http://127.0.0.1:$http" --binary-addr "127.0.0.1:$((http + 1))" \
  --buffer-size "$buffer" --events "$events" --trials "$trials" --out "$dir/bench" >/dev/null 2>&1
usage >"$dir/after"
rates=$(tail -n +2 "$dir/bench/insert.csv" | cut -d, -f8 | sort -n | tr '\n' ' ')
spent=$(paste "$dir/before" "$dir/after" | awk -v hz="$(getconf CLK_TCK)" -v events="$((events * trials))" '
  {
    user += ($4 - $1) / hz; sys += ($5 - $2) / hz
    cpu[NR] = ($4 + $5 - $1 - $2) / hz; total += cpu[NR]
    if (NR == 1) faults = $6 - $3
  }
  END {
    role = NR == 1 ? "server" : "leader"
    printf "%.1f s (%s %.1f", total, role, cpu[1]
    if (NR > 1) printf ", followers"
    for (i = 2; i <= NR; i++) printf " %.1f", cpu[i]
    printf "; user %.1f, system %.1f), per million events %.3f s", user, sys, total * 1e6 / events
    printf ", %s page faults %.2fM", role, faults / 1e6
  }')
echo "$bin events/s: ${rates}node CPU: $spent"
