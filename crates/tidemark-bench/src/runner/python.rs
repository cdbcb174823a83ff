//! `tidemark bench python` (workload `python`): a W1 DataFrame appended durably through the
//! Python package and read back into pandas and Arrow, beside the `questdb` Python client
//! (line protocol over HTTP from the same DataFrame) into QuestDB, in one run.
//!
//! The measuring is Python's (`python/bench/python_bench.py`, built into this binary and
//! written next to the output): what is timed is what an analyst's notebook would wait for.
//! This command starts the servers, runs it, and turns the trials it prints into
//! `python.csv`, `python.png` and the run's summary.

use std::io::{BufRead, BufReader};
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};

use crate::chart::{self, Bar};
use crate::peers::parse_selection;
use crate::peers::questdb::{CommitMode, QuestDb};
use crate::stats::median;
use crate::summary::{append_summary, Figure};
use anyhow::{bail, Context, Result};
use serde::Deserialize;

use super::with_server_process;

/// The script that measures, from the repository's `python/bench`.
const SCRIPT: &str = include_str!("../../../../python/bench/python_bench.py");

#[derive(clap::Args)]
pub struct PythonArgs {
    /// Rows of the W1 DataFrame [default: 10000000; with --quick: 1000000].
    #[arg(long)]
    rows: Option<usize>,
    /// Trials per system [default: 3; with --quick: 1].
    #[arg(long)]
    trials: Option<usize>,
    /// Smaller defaults: the run takes a minute or two.
    #[arg(long)]
    quick: bool,
    /// A Python with the tidemark package, pandas and (for the peer) questdb installed
    /// [default: .venv/bin/python, which `make test` sets up, else python3].
    #[arg(long)]
    python: Option<PathBuf>,
    /// Peers to run next to Tidemark: questdb, all or none. A peer that is not installed
    /// is skipped with the reason (peers/install.sh questdb).
    #[arg(long, default_value = "none")]
    peers: String,
    /// Directory for python.csv, python.png and summary.csv.
    #[arg(long, default_value = "bench-out")]
    pub out: PathBuf,
}

impl PythonArgs {
    /// The defaults of `bench python`, for `bench all`.
    pub fn defaults(quick: bool, peers: &str, out: PathBuf) -> PythonArgs {
        let ours = |list: &str| list.split(',').any(|p| p.trim() == "questdb");
        let peers = match peers.trim() {
            "all" => "all",
            list if ours(list) => "questdb",
            _ => "none",
        };
        PythonArgs {
            rows: None,
            trials: None,
            quick,
            python: None,
            peers: peers.into(),
            out,
        }
    }
}

/// One timed phase of one trial, as the script prints it.
#[derive(Debug, Deserialize)]
struct Trial {
    system: String,
    /// `append`, `read_pandas` or `read_arrow`.
    phase: String,
    trial: usize,
    rows: usize,
    seconds: f64,
}

pub fn run(args: PythonArgs) -> Result<()> {
    let peers = match args.peers.trim() {
        "all" => vec!["questdb".to_string()],
        selection => parse_selection(selection).map_err(anyhow::Error::msg)?,
    };
    if let Some(unknown) = peers.iter().find(|p| p.as_str() != "questdb") {
        bail!("bench python has no peer {unknown:?}: say questdb, all or none");
    }
    let rows = args
        .rows
        .unwrap_or(if args.quick { 1_000_000 } else { 10_000_000 });
    let trials = args.trials.unwrap_or(if args.quick { 1 } else { 3 });
    if rows == 0 || trials == 0 {
        bail!("--rows and --trials must be above 0");
    }
    std::fs::create_dir_all(&args.out)
        .with_context(|| format!("creating {}", args.out.display()))?;
    let python = python(args.python.as_deref())?;
    let script = args.out.join("python_bench.py");
    std::fs::write(&script, SCRIPT).with_context(|| format!("writing {}", script.display()))?;
    println!(
        "bench python: a {rows}-row W1 DataFrame, {trials} trials per system, with {}",
        python.display()
    );
    let sizes = [
        "--rows".to_string(),
        rows.to_string(),
        "--trials".into(),
        trials.to_string(),
    ];
    let mut results = with_server_process(&args.out.join("data"), |target| {
        let mut command = Command::new(&python);
        command
            .arg(&script)
            .args(["--tidemark", &target.http])
            .args(&sizes);
        if let Some(token) = &target.token {
            command.args(["--token", token]);
        }
        measure(command)
    })?;
    for peer in &peers {
        let dir = args.out.join(format!("data-{peer}"));
        match QuestDb::start(&dir, CommitMode::Sync) {
            Ok(questdb) => {
                let mut command = Command::new(&python);
                command
                    .arg(&script)
                    .args(["--questdb", &questdb.http_addr().to_string()])
                    .args(&sizes);
                let outcome = measure(command);
                drop(questdb);
                std::fs::remove_dir_all(&dir).ok();
                results.extend(outcome?);
            }
            Err(skip) => println!("  skipped {skip}"),
        }
    }
    report(&args.out, rows, &results)
}

/// The Python to run: the one asked for, else the project's virtualenv, else python3; it
/// must import the package and pandas.
fn python(asked: Option<&Path>) -> Result<PathBuf> {
    python_importing(asked, &["tidemark", "pandas", "numpy"])
}

/// The Python to run: the one asked for, else the project's virtualenv, else python3; it
/// must import `modules`.
pub(super) fn python_importing(asked: Option<&Path>, modules: &[&str]) -> Result<PathBuf> {
    let venv = Path::new(".venv/bin/python");
    let python = match asked {
        Some(path) => path.to_path_buf(),
        None if venv.exists() => venv.to_path_buf(),
        None => PathBuf::from("python3"),
    };
    let install = "`make .venv/installed` sets up .venv with them, or pass --python";
    let listed = modules.join(", ");
    // A Python that is missing or lacks the packages is a workload that cannot run here
    // (`bench all` skips it), not a failed one.
    let check = Command::new(&python)
        .args(["-c", &format!("import {listed}")])
        .output()
        .map_err(|e| super::Unavailable {
            missing: format!(
                "no Python to import {listed}: running {}: {e}",
                python.display()
            ),
            install: install.into(),
        })?;
    if !check.status.success() {
        let why = String::from_utf8_lossy(&check.stderr);
        let why = why.trim().lines().last().unwrap_or("");
        return Err(super::Unavailable {
            missing: format!("{} cannot import {listed} ({why})", python.display()),
            install: install.into(),
        }
        .into());
    }
    Ok(python)
}

/// Runs a benchmark script that prints one JSON record a line, handing each to `each` as it
/// comes, and returns them.
pub(super) fn json_lines<T: serde::de::DeserializeOwned>(
    mut command: Command,
    mut each: impl FnMut(&T),
) -> Result<Vec<T>> {
    let mut child = command
        .stdout(Stdio::piped())
        .spawn()
        .context("starting the Python benchmark")?;
    let stdout = child
        .stdout
        .take()
        .context("the benchmark's output was not captured")?;
    let mut records = Vec::new();
    for line in BufReader::new(stdout).lines() {
        let line = line.context("reading the benchmark's output")?;
        let record: T = serde_json::from_str(&line)
            .with_context(|| format!("the benchmark printed {line:?}, not a record"))?;
        each(&record);
        records.push(record);
    }
    let status = child.wait().context("waiting for the Python benchmark")?;
    if !status.success() {
        bail!("the Python benchmark failed ({status})");
    }
    Ok(records)
}

/// Runs the script, echoing each trial as it ends, and returns them.
fn measure(command: Command) -> Result<Vec<Trial>> {
    json_lines(command, |trial: &Trial| {
        println!(
            "  {:<8} {:<11} trial {}: {:>10} rows in {:.3} s, {:.0} rows/s",
            trial.system,
            trial.phase,
            trial.trial,
            trial.rows,
            trial.seconds,
            trial.rows as f64 / trial.seconds
        )
    })
}

/// python.csv (every trial), summary.csv (each system's and phase's median) and python.png.
fn report(out: &Path, rows: usize, results: &[Trial]) -> Result<()> {
    let mut csv = String::from("system,phase,trial,rows,seconds,rows_per_second\n");
    for t in results {
        csv.push_str(&format!(
            "{},{},{},{},{:.6},{:.0}\n",
            t.system,
            t.phase,
            t.trial,
            t.rows,
            t.seconds,
            t.rows as f64 / t.seconds
        ));
    }
    let csv_path = out.join("python.csv");
    std::fs::write(&csv_path, csv).with_context(|| format!("writing {}", csv_path.display()))?;
    let variant = format!("{rows}-row W1 DataFrame, durable appends, from Python");
    let mut figures = Vec::new();
    let mut bars = Vec::new();
    let mut keys: Vec<(&str, &str)> = Vec::new();
    for t in results {
        if !keys.contains(&(t.system.as_str(), t.phase.as_str())) {
            keys.push((&t.system, &t.phase));
        }
    }
    for (group, (system, phase)) in keys.iter().enumerate() {
        let rates: Vec<f64> = results
            .iter()
            .filter(|t| t.system == *system && t.phase == *phase)
            .map(|t| t.rows as f64 / t.seconds)
            .collect();
        let Some(rate) = median(&rates) else { continue };
        figures.push(Figure::new(
            "python",
            system,
            &variant,
            &format!("median_{phase}_rows_per_second"),
            rate.round(),
            "rows/s",
        ));
        bars.push(Bar {
            label: format!("{system} {phase}"),
            group,
            value: rate,
        });
    }
    let tidemark_append = figures
        .iter()
        .find(|f| f.system == "tidemark" && f.metric == "median_append_rows_per_second")
        .map(|f| f.value);
    for figure in &figures {
        let beside = match (figure.system.as_str(), tidemark_append) {
            ("questdb", Some(ours)) => format!("  (Tidemark appends {:.2}×)", ours / figure.value),
            _ => String::new(),
        };
        println!(
            "{:<9} {:<36} {:>12} rows/s{beside}",
            figure.system, figure.metric, figure.value
        );
    }
    append_summary(out, &figures).context("writing summary.csv")?;
    let chart_path = out.join("python.png");
    chart::draw_bars(
        &chart_path,
        &format!("Python: {variant}"),
        "rows/s (median)",
        &bars,
    )?;
    println!(
        "wrote {}, {} and summary.csv",
        csv_path.display(),
        chart_path.display()
    );
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_python_without_the_packages_is_unavailable_not_failed() {
        let dir = tempfile::tempdir().unwrap();
        // A "python" that cannot import anything, and one that does not exist.
        for python in [PathBuf::from("false"), dir.path().join("no-python")] {
            let error = super::python(Some(&python)).unwrap_err();
            let unavailable = error
                .downcast_ref::<super::super::Unavailable>()
                .unwrap_or_else(|| panic!("{}: {error:#}", python.display()));
            assert!(
                unavailable.install.contains("make .venv/installed"),
                "{unavailable}"
            );
        }
    }
}
