# The one place that says how Tidemark is built and tested.
.PHONY: test test-python notebooks check crash-long cluster-long fuzz fuzz-decoders fuzz-sql fuzz-smoke bench-insert demo

# Every test of the project: unit, property, crash (30 kills), corruption and cluster fault
# tests (5 leader kills), and SQL answers compared with DuckDB's (Python, in .venv).
test: .venv/installed
	TIDEMARK_TEST_PYTHON=$(CURDIR)/.venv/bin/python cargo test --workspace
	$(MAKE) test-python

# The debug `tidemark` as the workspace's tests build it: `cargo test --workspace --no-run`
# writes target/debug/tidemark too, so after `cargo test --workspace` this builds nothing.
# (`cargo build -p tidemark` would build DataFusion and what sits above it a second time:
# the tests' dev-dependencies turn on features of crates low in the tree, smallvec's
# `union` through influxdb-line-protocol, and every crate above one is then another build.)
BUILD_DEBUG_BINARY = cargo test --workspace --no-run --quiet

# The Python package's tests (python/tests: its API against a real server, its types by
# mypy) and the notebooks run top to bottom (notebooks/), against the debug build.
test-python: .venv/installed
	$(BUILD_DEBUG_BINARY)
	cd python && TIDEMARK_BIN=$(CURDIR)/target/debug/tidemark ../.venv/bin/pytest -q tests

# Runs the notebooks against a fresh server and saves their outputs in notebooks/.
notebooks: .venv/installed
	$(BUILD_DEBUG_BINARY)
	cd python && TIDEMARK_SAVE_NOTEBOOKS=1 TIDEMARK_BIN=$(CURDIR)/target/debug/tidemark ../.venv/bin/pytest -q tests/test_notebooks.py -k runs_top_to_bottom
	cd python && TIDEMARK_BIN=$(CURDIR)/target/debug/tidemark ../.venv/bin/pytest -q tests/test_notebooks.py

# The Python programs the tests drive as references, and the Python package with what its
# tests need, from requirements-test.txt.
.venv/installed: requirements-test.txt python/pyproject.toml
	python3 -m venv .venv
	.venv/bin/pip install --quiet --disable-pip-version-check -r requirements-test.txt
	touch $@

# Formatting, lints and doc links, as CI enforces them.
check:
	cargo fmt --all -- --check
	cargo clippy --workspace --all-targets -- -D warnings
	RUSTDOCFLAGS="-D warnings" cargo doc --workspace --no-deps --quiet

# The crash test with hundreds of kills (not run by CI).
crash-long:
	TIDEMARK_CRASH_KILLS=500 cargo test --release -p tidemark-engine --test crash -- --nocapture

# The cluster fault test with 50 leader kills instead of 5 (not run by CI).
cluster-long:
	TIDEMARK_CLUSTER_KILLS=50 cargo test --release -p tidemark --test cluster -- --nocapture

# Coverage-guided fuzzing of every decoder of bytes from disk or the network, each target
# for FUZZ_SECONDS, and of SQL text (fuzz/sql: apart, because it links DataFusion). Needs the
# nightly toolchain and `cargo install cargo-fuzz`.
FUZZ_SECONDS ?= 60
# cargo fuzz's own flags: none by default (a release build with AddressSanitizer).
FUZZ_FLAGS ?=
FUZZ_TARGETS ?= log_records column_chunk segment_file manifest json_events binary_frames raft_messages line_protocol graphite_lines prometheus_remote pg_messages pg_framing pg_copy arrow_events
fuzz: fuzz-decoders fuzz-sql

fuzz-decoders:
	for t in $(FUZZ_TARGETS); do \
		cargo +nightly fuzz run $(FUZZ_FLAGS) $$t -- -max_total_time=$(FUZZ_SECONDS) || exit 1; \
	done

# A 10-minute run by hand found nothing (2.8M inputs, 2026-11-23). Not in CI's smoke run:
# building DataFusion with sanitizers would take most of CI's time.
fuzz-sql:
	cargo +nightly fuzz run --fuzz-dir fuzz/sql sql_statements -- -max_total_time=$(FUZZ_SECONDS)

# The network decoders, briefly (what CI runs): a debug build (debug assertions and overflow
# checks on) without AddressSanitizer, which builds in about half the time of the release
# build with it (7.5 minutes on two cores, of CI's 60); `make fuzz` is the thorough run.
fuzz-smoke:
	$(MAKE) fuzz-decoders FUZZ_TARGETS="binary_frames json_events raft_messages line_protocol graphite_lines prometheus_remote pg_messages pg_framing pg_copy arrow_events" FUZZ_SECONDS=10 FUZZ_FLAGS="--dev --sanitizer none"

# W1 on the embedded target, as reported in docs/benchmarks.md.
bench-insert:
	cargo run --release -- bench insert --target embedded --events 1000000,10000000 --trials 10 --batch 10000 --out bench-out

demo:
	cargo run --release -- demo
