#!/bin/sh
# `tidemark` under heaptrack, for the attack scripts' --bin (the peak heap figures in
# docs/server.md): writes $HEAPTRACK_OUT.zst (default /tmp/tidemark-heaptrack.zst), read with
# `heaptrack_print -f FILE --print-peaks 1`. SIGTERM is passed on to tidemark, so the
# scripts' graceful stop works; the RSS they print is this shell's, not the server's.
out=${HEAPTRACK_OUT:-/tmp/tidemark-heaptrack}
heaptrack -o "$out" "${TIDEMARK_BIN:-target/debug/tidemark}" "$@" &
tracer=$!
trap 'pkill -TERM -x tidemark -P "$tracer"' TERM INT
wait "$tracer"
wait "$tracer"
