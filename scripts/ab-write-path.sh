#!/usr/bin/env bash
# Alternating A/B of two `tidemark` binaries on the write path, as docs/benchmarks.md reports
# it ("W1 and W2 before and after the one write path"): on a shared 2-vCPU machine only runs
# that alternate the two builds can be compared.
#
#   git worktree add /tmp/tm-base <commit> && (cd /tmp/tm-base && CARGO_TARGET_DIR=/tmp/tm-base-target cargo build --release -p tidemark)
#   cargo build --release -p tidemark
#   scripts/ab-write-path.sh /tmp/tm-base-target/release/tidemark target/release/tidemark
#
# Each round runs, for A then B: W1 embedded (1M events, 5 trials), W1 over a server with
# the binary protocol (1 MB buffer) and HTTP (100 KB buffer), W1 on a 3-node cluster, and W2
# (`bench metrics --quick`, its server a process of its own) while the server's thread count
# is read from /proc every 2 s. Prints one line per binary and round: the W1 medians in
# events/s, W2's backfill rate, live lag, server RSS (the bench's figures) and the most
# threads seen. Environment: ROUNDS (2), SKIP_CLUSTER (set: no cluster runs).
set -euo pipefail
a="$(realpath "$1")" b="$(realpath "$2")"
rounds="${ROUNDS:-2}"
dir="$(mktemp -d)"
trap 'rm -rf "$dir"' EXIT
cd "$dir"

# The median column of `bench insert`'s table for 1M events.
median() { awk '$2 == 1000000 && $3 ~ /^[0-9]+$/ && NF >= 5 { print $4; exit } $1 == "cluster" && $4 == 1000000 { print $5; exit }'; }

w2() {
  local bin="$1" most=0 n pid
  rm -rf w2
  "$bin" bench metrics --quick --out w2 >w2.log 2>&1 &
  local bench=$!
  while kill -0 "$bench" 2>/dev/null; do
    pid=$(pgrep -f "$bin serve --data-dir w2/data" | head -1 || true)
    if [ -n "$pid" ]; then
      n=$(awk '/^Threads:/ { print $2 }' "/proc/$pid/status" 2>/dev/null || echo 0)
      [ "${n:-0}" -gt "$most" ] && most=$n
    fi
    sleep 2
  done
  wait "$bench"
  # system, live pt/s, backfill, lag avg/p99/max, cores, RSS MB, ...
  awk -v most="$most" '$1 == "tidemark" && NF > 6 { printf "w2 backfill %s lag %s rss %sMB threads %s", $3, $4, $6, most; exit }' w2.log
}

for round in $(seq "$rounds"); do
  for side in A B; do
    bin=$a; [ "$side" = B ] && bin=$b
    rm -rf out
    embedded=$("$bin" bench insert --target embedded --events 1000000 --trials 5 --out out 2>/dev/null | median)
    rm -rf out
    binary=$("$bin" bench insert --target server --protocol binary --buffer-size 1MB --events 1000000 --trials 5 --out out 2>/dev/null | median)
    rm -rf out
    http=$("$bin" bench insert --target server --protocol http --buffer-size 100KB --events 1000000 --trials 3 --out out 2>/dev/null | median)
    cluster=-
    if [ -z "${SKIP_CLUSTER:-}" ]; then
      rm -rf out
      cluster=$("$bin" bench insert --target cluster --nodes 3 --events 1000000 --trials 5 --out out 2>/dev/null | median)
    fi
    echo "round $round $side embedded $embedded server-binary $binary server-http $http cluster3 $cluster $(w2 "$bin")"
  done
done
