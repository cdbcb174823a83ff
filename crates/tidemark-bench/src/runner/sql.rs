//! `tidemark bench sql` (workload `sql`): the queries analysts and dashboards send, timed on
//! a Tidemark server and on DuckDB in memory over the same rows (1M trades, 200k quotes), in
//! one run: issue 46's goal is no query above 5× DuckDB's time.
//!
//! The measuring is Python's (`python/bench/sql_bench.py`, built into this binary and
//! written next to the output), as a notebook would wait for the answer: Tidemark over HTTP
//! with Arrow answers, DuckDB in the same process. This command starts the server, runs it,
//! and writes `sql.csv` (each query's medians and ratio) and the run's summary.

use std::path::{Path, PathBuf};
use std::process::Command;

use crate::summary::{append_summary, Figure};
use anyhow::{bail, Context, Result};
use serde::Deserialize;

use super::python::{json_lines, python_importing};
use super::with_server_process;

/// The script that measures, from the repository's `python/bench`.
const SCRIPT: &str = include_str!("../../../../python/bench/sql_bench.py");

/// Issue 46's bound: a query's time within this many times DuckDB's.
const GOAL_RATIO: f64 = 5.0;

#[derive(clap::Args)]
pub struct SqlArgs {
    /// Trades [default: 1000000; with --quick: 100000].
    #[arg(long)]
    trades: Option<usize>,
    /// Quotes [default: 200000; with --quick: 20000].
    #[arg(long)]
    quotes: Option<usize>,
    /// Timed runs of each query on each system, after one untimed [default: 5; with --quick: 2].
    #[arg(long)]
    repeat: Option<usize>,
    /// Only the queries whose names contain this (see sql.csv for the names).
    #[arg(long)]
    only: Option<String>,
    /// Smaller defaults: the run takes a minute or two.
    #[arg(long)]
    quick: bool,
    /// A Python with the tidemark package, pandas and duckdb installed [default:
    /// .venv/bin/python, which `make test` sets up, else python3].
    #[arg(long)]
    python: Option<PathBuf>,
    /// Directory for sql.csv and summary.csv.
    #[arg(long, default_value = "bench-out")]
    pub out: PathBuf,
}

impl SqlArgs {
    /// The defaults of `bench sql`, for `bench all`.
    pub fn defaults(quick: bool, out: PathBuf) -> SqlArgs {
        SqlArgs {
            trades: None,
            quotes: None,
            repeat: None,
            only: None,
            quick,
            python: None,
            out,
        }
    }
}

/// One query's median on one system, as the script prints it.
#[derive(Debug, Deserialize)]
struct Timing {
    query: String,
    system: String,
    seconds: f64,
    rows: u64,
    runs: usize,
}

pub fn run(args: SqlArgs) -> Result<()> {
    let pick = |asked: Option<usize>, quick: usize, full: usize| {
        asked.unwrap_or(if args.quick { quick } else { full })
    };
    let trades = pick(args.trades, 100_000, 1_000_000);
    let quotes = pick(args.quotes, 20_000, 200_000);
    let repeat = pick(args.repeat, 2, 5);
    if trades == 0 || quotes == 0 || repeat == 0 {
        bail!("--trades, --quotes and --repeat must be above 0");
    }
    std::fs::create_dir_all(&args.out)
        .with_context(|| format!("creating {}", args.out.display()))?;
    let python = python_importing(
        args.python.as_deref(),
        &["tidemark", "pandas", "numpy", "duckdb"],
    )?;
    let script = args.out.join("sql_bench.py");
    std::fs::write(&script, SCRIPT).with_context(|| format!("writing {}", script.display()))?;
    println!(
        "bench sql: {trades} trades and {quotes} quotes, each query {repeat} times on Tidemark \
         and DuckDB, with {}",
        python.display()
    );
    let timings = with_server_process(&args.out.join("data"), |target| {
        let mut command = Command::new(&python);
        command
            .arg(&script)
            .args(["--tidemark", &target.http])
            .args(["--trades", &trades.to_string()])
            .args(["--quotes", &quotes.to_string()])
            .args(["--repeat", &repeat.to_string()]);
        if let Some(only) = &args.only {
            command.args(["--only", only]);
        }
        if let Some(token) = &target.token {
            command.args(["--token", token]);
        }
        json_lines(command, |t: &Timing| {
            println!(
                "  {:<26} {:<8} {:>10.2} ms  ({} rows, {} runs)",
                t.query,
                t.system,
                t.seconds * 1e3,
                t.rows,
                t.runs
            )
        })
    })?;
    report(&args.out, trades, quotes, &timings)
}

/// sql.csv (each query's medians side by side) and summary.csv (the worst ratio and how
/// many queries miss the goal).
fn report(out: &Path, trades: usize, quotes: usize, timings: &[Timing]) -> Result<()> {
    let mut csv = String::from("query,tidemark_ms,duckdb_ms,ratio,rows\n");
    let mut ratios = Vec::new();
    println!(
        "\n{:<26} {:>12} {:>12} {:>8}",
        "query", "tidemark ms", "duckdb ms", "ratio"
    );
    for ours in timings.iter().filter(|t| t.system == "tidemark") {
        let Some(theirs) = timings
            .iter()
            .find(|t| t.system == "duckdb" && t.query == ours.query)
        else {
            continue;
        };
        let ratio = ours.seconds / theirs.seconds.max(1e-9);
        let flag = if ratio > GOAL_RATIO {
            "  over the goal"
        } else {
            ""
        };
        println!(
            "{:<26} {:>12.2} {:>12.2} {:>7.1}×{flag}",
            ours.query,
            ours.seconds * 1e3,
            theirs.seconds * 1e3,
            ratio
        );
        csv.push_str(&format!(
            "{},{:.3},{:.3},{:.2},{}\n",
            ours.query,
            ours.seconds * 1e3,
            theirs.seconds * 1e3,
            ratio,
            ours.rows
        ));
        ratios.push(ratio);
    }
    let csv_path = out.join("sql.csv");
    std::fs::write(&csv_path, csv).with_context(|| format!("writing {}", csv_path.display()))?;
    let variant = format!("{trades} trades, {quotes} quotes; Tidemark over HTTP, DuckDB in memory");
    let worst = ratios.iter().copied().fold(0.0, f64::max);
    let over = ratios.iter().filter(|&&r| r > GOAL_RATIO).count();
    let figures = [
        Figure::new(
            "sql",
            "tidemark",
            &variant,
            "worst_ratio_to_duckdb",
            (worst * 100.0).round() / 100.0,
            "×",
        ),
        Figure::new(
            "sql",
            "tidemark",
            &variant,
            "queries_over_5x_duckdb",
            over as f64,
            "queries",
        ),
    ];
    println!(
        "\n{} queries; the worst {worst:.1}× DuckDB's time; {over} above {GOAL_RATIO}×",
        ratios.len()
    );
    append_summary(out, &figures).context("writing summary.csv")?;
    println!("wrote {} and summary.csv", csv_path.display());
    Ok(())
}
