#!/usr/bin/env bash
# Refreshes assets/vendor from the npm registry at the exact versions the console uses, and
# checks each tarball against the digest recorded here (a changed package fails loudly).
# Run by hand when a version changes; building Tidemark needs no Node and no network.
set -euo pipefail
cd "$(dirname "$0")/assets/vendor"
fetch() { # name version sha256
  local tarball
  tarball=$(npm pack --silent "$1@$2")
  echo "$3  $tarball" | sha256sum --check --quiet
  rm -rf "/tmp/vendor-$1" && mkdir "/tmp/vendor-$1"
  tar xzf "$tarball" -C "/tmp/vendor-$1" && rm "$tarball"
}
fetch uplot 1.6.32 4b8a8191e425658e3ea8c8c1314b0fc679c861ee3a1af2b20c7b16ba50b5133d
mkdir -p uplot-1.6.32
cp /tmp/vendor-uplot/package/{dist/uPlot.iife.min.js,dist/uPlot.min.css,LICENSE} uplot-1.6.32/
fetch codemirror 5.65.21 b26d9d7ae0f42e34b44a8f7667d29a3ab0d3df88d0e79c0dad39dc03ba43f6dc
mkdir -p codemirror-5.65.21
p=/tmp/vendor-codemirror/package
cp $p/lib/codemirror.js $p/lib/codemirror.css $p/mode/sql/sql.js $p/addon/hint/show-hint.js \
  $p/addon/hint/show-hint.css $p/addon/hint/sql-hint.js $p/LICENSE codemirror-5.65.21/
