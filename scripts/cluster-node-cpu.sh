#!/usr/bin/env bash
# W1 against the leader of a cluster (3 nodes unless NODES says otherwise), with the client in a process of its own, and the
# CPU time (user + system) the three nodes spent during the run, read from /proc. Comparing
# two builds on a shared 2-vCPU machine needs several runs of each, alternating:
#
#   cp target/release/tidemark /tmp/tm-a      # build A, then the same for build B
#   for i in 1 2 3 4 5 6; do scripts/cluster-node-cpu.sh /tmp/tm-a; scripts/cluster-node-cpu.sh /tmp/tm-b; done
#
# Prints one line per run: the binary, each trial's events/s (ascending), the nodes' CPU seconds
# (all nodes, then the leader's and each follower's).
# Environment: NODES (3), EVENTS (10000000), TRIALS (3), BUFFER (1MB), BASE_PORT (9300).
set -euo pipefail
bin="$1"
events="${EVENTS:-10000000}" trials="${TRIALS:-3}" buffer="${BUFFER:-1MB}" base="${BASE_PORT:-9300}" nodes="${NODES:-3}"
dir="$(mktemp -d)"
"$bin" cluster up --nodes "$nodes" --data-dir "$dir/cluster" --base-port "$base" >"$dir/cluster.log" 2>&1 &
up=$!
trap 'kill -INT $up 2>/dev/null; wait $up 2>/dev/null; rm -rf "$dir"' EXIT
leader=
for _ in $(seq 120); do
  leader=$("$bin" cluster status --server "http://127.0.0.1:$((base + 1))" 2>/dev/null |
    grep -oiE 'leader[: ]+(node )?[0-9]+' | grep -oE '[0-9]+' | head -1 || true)
  [ -n "$leader" ] && break
  sleep 0.5
done
[ -n "$leader" ] || { echo "no leader within 60 s: $dir/cluster.log" >&2; exit 1; }
http=$((base + (leader - 1) * 3 + 1))
# The leader first, then the followers.
pids="$(pgrep -P "$up" -f "serve --node-id $leader ") $(pgrep -P "$up" -f 'serve --node-id' | grep -vx "$(pgrep -P "$up" -f "serve --node-id $leader ")")"
ticks() { local f; for p in $pids; do read -ra f <"/proc/$p/stat"; echo $((f[13] + f[14])); done; }
before=($(ticks))
"$bin" bench insert --target server --server "http://127.0.0.1:$http" --binary-addr "127.0.0.1:$((http + 1))" \
  --buffer-size "$buffer" --events "$events" --trials "$trials" --out "$dir/bench" >/dev/null 2>&1
after=($(ticks))
rates=$(tail -n +2 "$dir/bench/insert.csv" | cut -d, -f8 | sort -n | tr '\n' ' ')
cpu=$(for i in "${!after[@]}"; do echo $((after[i] - before[i])); done |
  awk -v hz="$(getconf CLK_TCK)" '{ s += $1; v[NR] = $1 / hz } END { printf "%.1f s (leader %.1f, followers", s / hz, v[1]; for (i = 2; i <= NR; i++) printf " %.1f", v[i]; printf ")" }')
echo "$bin events/s: ${rates}node CPU: $cpu"
