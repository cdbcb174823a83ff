#!/usr/bin/env bash
# W1 against the leader of a cluster (3 nodes unless NODES says otherwise), with the client in a process of its own, and the
# CPU time (user + system) the three nodes spent during the run, read from /proc. Comparing
# two builds on a shared 2-vCPU machine needs several runs of each, alternating:
#
#   cp target/release/tidemark /tmp/tm-a      # build A, then the same for build B
#   for i in 1 2 3 4 5 6; do scripts/cluster-node-cpu.sh /tmp/tm-a; scripts/cluster-node-cpu.sh /tmp/tm-b; done
#
# Prints one line per run: the binary, each trial's events/s (ascending), the nodes' CPU seconds.
# Environment: NODES (3), EVENTS (10000000), TRIALS (3), BUFFER (1MB), BASE_PORT (9300).
set -euo pipefail
bin="$1"
events="${EVENTS:-10000000}" trials="${TRIALS:-3}" buffer="${BUFFER:-1MB}" base="${BASE_PORT:-9300}" nodes="${NODES:-3}"
dir="$(mktemp -d)"
"$bin" cluster up --nodes "$nodes" --data-dir "$dir/cluster" --base-port "$base" >"$dir/cluster.log" 2>&1 &
up=$!
trap 'kill -INT $up 2>/dev/null; wait $up 2>/dev/null; rm -rf "$dir"' EXIT
for _ in $(seq 120); do grep -q leader "$dir/cluster.log" && break; sleep 0.5; done
leader=$("$bin" cluster status --server "http://127.0.0.1:$((base + 1))" | grep -oiE 'leader[: ]+(node )?[0-9]+' | grep -oE '[0-9]+' | head -1)
http=$((base + (leader - 1) * 3 + 1))
pids=$(pgrep -P "$up" -f 'serve --node-id')
ticks() { local sum=0 f; for p in $pids; do read -ra f <"/proc/$p/stat"; sum=$((sum + f[13] + f[14])); done; echo "$sum"; }
before=$(ticks)
"$bin" bench insert --target server --server "http://127.0.0.1:$http" --binary-addr "127.0.0.1:$((http + 1))" \
  --buffer-size "$buffer" --events "$events" --trials "$trials" --out "$dir/bench" >/dev/null 2>&1
after=$(ticks)
rates=$(tail -n +2 "$dir/bench/insert.csv" | cut -d, -f8 | sort -n | tr '\n' ' ')
echo "$bin events/s: ${rates}node CPU: $(awk "BEGIN { printf \"%.1f\", ($after - $before) / $(getconf CLK_TCK) }") s"
