//! `tidemark bench ...`: the workloads of `workloads.md`, each a subcommand, and `all`.

mod append;
mod insert;
mod lines;
mod metrics;
mod pipeline;
mod python;
mod tier;

use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::Duration;

use anyhow::{bail, Context, Result};
use clap::Subcommand;
use tidemark_bench::peers::{free_port, PeerProcess};
use tidemark_bench::summary::{append_rows, HEADER, MARKDOWN_HEADER};
use tidemark_bench::w3::ServerTarget;

#[derive(Subcommand)]
pub enum BenchCommand {
    /// W1: event-store ingest, timed until the last event is durable.
    Insert(insert::InsertArgs),
    /// W3: 64 KiB batches to 1, 100 or 2000 streams at fixed rates and at max; latency
    /// percentiles end to end and server-side.
    Append(append::AppendArgs),
    /// W2: recorded host metrics replayed at 54,000 points/s (after a backfilled hour);
    /// server CPU, RSS, ingest lag, bits per point, and two bucketed max queries.
    Metrics(metrics::MetricsArgs),
    /// W1's events as InfluxDB line protocol over HTTP (5,000 lines a request, several
    /// connections) to Tidemark, QuestDB and InfluxDB 1.6, each acknowledged durable.
    Lines(lines::LinesArgs),
    /// W4: producers send 3,000-byte messages through `tidemark agent` to a server; msg/s,
    /// MB/s, spool peak, lost and duplicated (read back and checked), latencies, agent CPU.
    Pipeline(pipeline::PipelineArgs),
    /// Tiering: W1's events over a day moved to S3Proxy (`peers/install.sh s3proxy`);
    /// upload MB/s, bucket bytes per event, a day's per-minute aggregate (requests to the
    /// bucket), a cold and a warm 1-minute scan.
    Tier(tier::TierArgs),
    /// A W1 DataFrame (10M rows) appended durably through the Python package and read back
    /// into pandas and Arrow, beside the questdb Python client into QuestDB.
    Python(python::PythonArgs),
    /// Records this host's /proc metrics (CPU, memory, disks, network, vmstat) once a second
    /// into a gzip'd CSV, the kind of file `bench metrics` replays.
    RecordMetrics(metrics::RecordArgs),
    /// Every workload in turn (W1 embedded, server and cluster; W2; W3; lines; W4 pipeline; tier; python), each in its own folder
    /// under DIR; their figures together in DIR/summary.csv and DIR/summary.md.
    All {
        /// Smaller sizes: the whole run takes minutes instead of an hour.
        #[arg(long)]
        quick: bool,
        /// Peers to run next to each workload (see `bench insert --help`).
        #[arg(long, default_value = "none")]
        peers: String,
        #[arg(long, default_value = "bench-out")]
        out: PathBuf,
    },
}

pub fn run(command: BenchCommand) -> anyhow::Result<()> {
    match command {
        BenchCommand::Insert(args) => {
            clear_summary(&args.out)?;
            insert::run(args)
        }
        BenchCommand::Append(args) => {
            clear_summary(&args.out)?;
            append::run(args)
        }
        BenchCommand::Metrics(args) => {
            clear_summary(&args.out)?;
            metrics::run(args)
        }
        BenchCommand::Lines(args) => {
            clear_summary(&args.out)?;
            lines::run(args)
        }
        BenchCommand::Pipeline(args) => {
            clear_summary(&args.out)?;
            pipeline::run(args)
        }
        BenchCommand::Tier(args) => {
            clear_summary(&args.out)?;
            tier::run(args)
        }
        BenchCommand::Python(args) => {
            clear_summary(&args.out)?;
            python::run(args)
        }
        BenchCommand::RecordMetrics(args) => metrics::record(args),
        BenchCommand::All { quick, peers, out } => all(quick, &peers, &out),
    }
}

/// One workload of `bench all`, run with its output folder.
type Workload<'a> = Box<dyn FnOnce(PathBuf) -> anyhow::Result<()> + 'a>;

/// A workload that cannot run on this machine: what it needs is not installed. Run by
/// itself it is an error (nothing was measured); in `bench all` the workload is skipped,
/// and named with this at the end, as `--peers` skips a peer that is not installed.
#[derive(Debug)]
pub struct Unavailable {
    /// What is missing, and why it is.
    pub missing: String,
    /// How to install it.
    pub install: String,
}

impl std::fmt::Display for Unavailable {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{} (install: {})", self.missing, self.install)
    }
}

impl std::error::Error for Unavailable {}

/// How one workload of `bench all` ended.
#[derive(Debug, PartialEq)]
enum Outcome {
    Ran,
    /// It could not run here; why and how to install what it needs.
    Skipped(String),
    Failed(String),
}

impl Outcome {
    fn of(result: &anyhow::Result<()>) -> Outcome {
        match result {
            Ok(()) => Outcome::Ran,
            // Wherever it was wrapped with context.
            Err(e) => match e.chain().find_map(|c| c.downcast_ref::<Unavailable>()) {
                Some(unavailable) => Outcome::Skipped(unavailable.to_string()),
                None => Outcome::Failed(format!("{e:#}")),
            },
        }
    }
}

/// The end of `bench all`: the skipped workloads, each with its reason, then the failed
/// ones; an error (exit 1) only if a workload that could run failed.
fn verdict(outcomes: &[(&str, Outcome)], out: &mut impl std::io::Write) -> anyhow::Result<()> {
    let skipped: Vec<_> = outcomes
        .iter()
        .filter_map(|(name, o)| match o {
            Outcome::Skipped(why) => Some((name, why)),
            _ => None,
        })
        .collect();
    if !skipped.is_empty() {
        writeln!(out, "skipped {} workloads:", skipped.len())?;
        for (name, why) in skipped {
            writeln!(out, "  {name}: {why}")?;
        }
    }
    let failed: Vec<&str> = outcomes
        .iter()
        .filter(|(_, o)| matches!(o, Outcome::Failed(_)))
        .map(|(name, _)| *name)
        .collect();
    if !failed.is_empty() {
        bail!("failed: {}", failed.join(", "));
    }
    Ok(())
}

fn all(quick: bool, peers: &str, out: &Path) -> anyhow::Result<()> {
    use insert::{InsertArgs, Target};
    let workloads: Vec<(&str, Workload)> = vec![
        (
            "insert-embedded",
            Box::new(|dir| insert::run(InsertArgs::defaults(Target::Embedded, quick, peers, dir))),
        ),
        (
            "insert-server",
            Box::new(|dir| insert::run(InsertArgs::defaults(Target::Server, quick, peers, dir))),
        ),
        (
            "insert-cluster",
            // Peers ran next to the server target already.
            Box::new(|dir| insert::run(InsertArgs::defaults(Target::Cluster, quick, "none", dir))),
        ),
        (
            "metrics",
            Box::new(|dir| metrics::run(metrics::MetricsArgs::defaults(quick, peers, dir))),
        ),
        (
            "append",
            Box::new(|dir| append::run(append::AppendArgs::defaults(quick, peers, dir))),
        ),
        (
            "lines",
            Box::new(|dir| lines::run(lines::LinesArgs::defaults(quick, peers, dir))),
        ),
        (
            "pipeline",
            Box::new(|dir| pipeline::run(pipeline::PipelineArgs::defaults(quick, peers, dir))),
        ),
        (
            "tier",
            Box::new(|dir| tier::run(tier::TierArgs::defaults(quick, dir))),
        ),
        (
            "python",
            Box::new(|dir| python::run(python::PythonArgs::defaults(quick, peers, dir))),
        ),
    ];
    clear_summary(out)?;
    let mut outcomes = Vec::new();
    for (name, work) in workloads {
        let dir = out.join(name);
        if dir.exists() {
            std::fs::remove_dir_all(&dir).with_context(|| format!("clearing {}", dir.display()))?;
        }
        println!("\n== {name} (output in {}) ==", dir.display());
        let result = work(dir.clone());
        let outcome = Outcome::of(&result);
        match &outcome {
            Outcome::Ran => gather(&dir, out)?,
            Outcome::Skipped(why) => println!("{name} skipped: {why}"),
            Outcome::Failed(why) => println!("{name} failed: {why}"),
        }
        outcomes.push((name, outcome));
    }
    println!(
        "\nfigures of every workload that ran: {}",
        out.join("summary.md").display()
    );
    verdict(&outcomes, &mut std::io::stdout().lock())
}

/// Removes the summary files of an earlier run in `out`: one command's figures are appended
/// to them as its workloads finish, and must not mix with another run's.
fn clear_summary(out: &Path) -> anyhow::Result<()> {
    for file in ["summary.csv", "summary.md"] {
        let path = out.join(file);
        if path.exists() {
            std::fs::remove_file(&path).with_context(|| format!("clearing {}", path.display()))?;
        }
    }
    Ok(())
}

/// Appends the figures a workload wrote in `dir` to the run's `summary.csv` and `summary.md`.
fn gather(dir: &Path, out: &Path) -> anyhow::Result<()> {
    for (file, header) in [("summary.csv", HEADER), ("summary.md", MARKDOWN_HEADER)] {
        let Ok(text) = std::fs::read_to_string(dir.join(file)) else {
            continue;
        };
        let skip = header.lines().count();
        let rows = text.lines().skip(skip).map(str::to_string);
        append_rows(&out.join(file), header, rows)
            .with_context(|| format!("writing {}", out.join(file).display()))?;
    }
    Ok(())
}

/// Starts `tidemark serve` on free ports over a fresh `data_dir`, runs `work`, stops it
/// and removes the data.
pub(super) fn with_server_process<T>(
    data_dir: &Path,
    work: impl FnOnce(&ServerTarget) -> Result<T>,
) -> Result<T> {
    if data_dir.exists() {
        std::fs::remove_dir_all(data_dir)
            .with_context(|| format!("clearing {}", data_dir.display()))?;
    }
    std::fs::create_dir_all(data_dir)?;
    let (http, binary) = (free_port()?, free_port()?);
    let exe = std::env::current_exe().context("finding the tidemark executable")?;
    let mut command = Command::new(exe);
    command
        .arg("serve")
        .arg("--data-dir")
        .arg(data_dir.join("db"))
        .args(["--http", &format!("127.0.0.1:{http}")])
        .args(["--binary", &format!("127.0.0.1:{binary}")]);
    let binary = std::net::SocketAddr::from(([127, 0, 0, 1], binary));
    let process = PeerProcess::start(
        "tidemark",
        command,
        &data_dir.join("server.log"),
        binary,
        Duration::from_secs(30),
    )?;
    let outcome = work(&ServerTarget {
        http: format!("http://127.0.0.1:{http}"),
        binary,
        token: std::env::var("TIDEMARK_TOKEN").ok(),
        pid: Some(process.pid()),
    });
    drop(process);
    std::fs::remove_dir_all(data_dir).ok();
    outcome
}

#[cfg(test)]
mod tests {
    use super::*;

    fn unavailable() -> anyhow::Error {
        Unavailable {
            missing: ".venv/bin/python cannot import tidemark".into(),
            install: "make .venv/installed".into(),
        }
        .into()
    }

    #[test]
    fn a_workload_that_cannot_run_is_skipped_wherever_its_error_was_wrapped() {
        assert_eq!(Outcome::of(&Ok(())), Outcome::Ran);
        let wrapped = Err(unavailable().context("bench python"));
        let Outcome::Skipped(why) = Outcome::of(&wrapped) else {
            panic!("{:?}", Outcome::of(&wrapped));
        };
        assert!(why.contains("cannot import tidemark") && why.contains("make .venv/installed"));
        let failed = Err(anyhow::anyhow!(
            "the Python benchmark failed (exit status: 1)"
        ));
        assert!(matches!(Outcome::of(&failed), Outcome::Failed(_)));
    }

    #[test]
    fn bench_all_exits_0_when_every_workload_that_could_run_did() {
        let skipped = |why: &str| Outcome::Skipped(why.into());
        let mut printed = Vec::new();
        let outcomes = [
            ("insert-embedded", Outcome::Ran),
            (
                "tier",
                skipped("S3Proxy is not installed (install: peers/install.sh s3proxy)"),
            ),
            (
                "python",
                skipped("no tidemark package (install: make .venv/installed)"),
            ),
        ];
        verdict(&outcomes, &mut printed).unwrap();
        let printed = String::from_utf8(printed).unwrap();
        assert_eq!(
            printed,
            "skipped 2 workloads:\n  tier: S3Proxy is not installed (install: peers/install.sh \
             s3proxy)\n  python: no tidemark package (install: make .venv/installed)\n"
        );
        // A failure of one that could run is still an error, naming only the failed.
        let outcomes = [
            ("insert-embedded", Outcome::Failed("disk full".into())),
            ("tier", skipped("S3Proxy is not installed")),
        ];
        let error = verdict(&outcomes, &mut Vec::new()).unwrap_err();
        assert_eq!(error.to_string(), "failed: insert-embedded");
        let mut printed = Vec::new();
        verdict(&[("lines", Outcome::Ran)], &mut printed).unwrap();
        assert!(printed.is_empty());
    }
}
