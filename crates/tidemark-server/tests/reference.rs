//! SQL answers compared with a reference engine: `reference/compare_with_duckdb.py` loads the
//! same generated rows into a server (over HTTP) and into DuckDB and compares the answers of a
//! corpus of over 100 queries. It needs a Python with the `duckdb` package: `make test` makes
//! one in `.venv` and names it in `TIDEMARK_TEST_PYTHON`; without it this test fails rather
//! than pass unchecked.

mod common;

use std::path::Path;
use std::process::Command;

use common::{python, TestServer};
use tidemark_engine::Options;

#[test]
fn sql_answers_match_duckdb_for_the_same_rows() {
    // A small memtable, so the appended events lie in several flushed segments (answered
    // from block summaries where they can be) as well as in memory.
    let options = Options {
        memtable_bytes: 16 * 1024,
        ..Options::default()
    };
    let server = TestServer::start_with(|_| {}, options);
    let script =
        Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/reference/compare_with_duckdb.py");
    let output = Command::new(python())
        .arg(&script)
        .arg(server.url())
        .output()
        .expect("the reference script runs");
    let stdout = String::from_utf8_lossy(&output.stdout);
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert!(
        output.status.success(),
        "answers differ from DuckDB's:\n{stdout}\n{stderr}"
    );
    assert!(
        stdout.contains(" passed, 0 failed"),
        "the script must say what it compared:\n{stdout}"
    );
}
