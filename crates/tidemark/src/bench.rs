//! `tidemark bench ...`: the workloads of `workloads.md`, each a subcommand, and `all`. The
//! runs live in `tidemark_bench::runner`; this is their command line and dispatch.

use std::path::PathBuf;

use clap::Subcommand;
use tidemark_bench::runner::{self, clear_summary};

#[derive(Subcommand)]
pub enum BenchCommand {
    /// W1: event-store ingest, timed until the last event is durable.
    Insert(runner::insert::InsertArgs),
    /// W3: 64 KiB batches to 1, 100 or 2000 streams at fixed rates and at max; latency
    /// percentiles end to end and server-side.
    Append(runner::append::AppendArgs),
    /// W5: consumers following 1, 100 or 2000 streams at half the disk's limit (latency
    /// from due to received), 1, 10 and 100 consumers catching up on one stream (aggregate
    /// MB/s), and memory per idle subscription.
    Consume(runner::consume::ConsumeArgs),
    /// W2: recorded host metrics replayed at 54,000 points/s (after a backfilled hour);
    /// server CPU, RSS, ingest lag, bits per point, and two bucketed max queries.
    Metrics(runner::metrics::MetricsArgs),
    /// W1's events as InfluxDB line protocol over HTTP (5,000 lines a request, several
    /// connections) to Tidemark, QuestDB and InfluxDB 1.6, each acknowledged durable.
    Lines(runner::lines::LinesArgs),
    /// W4: producers send 3,000-byte messages through `tidemark agent` to a server; msg/s,
    /// MB/s, spool peak, lost and duplicated (read back and checked), latencies, agent CPU.
    Pipeline(runner::pipeline::PipelineArgs),
    /// Tiering: W1's events over a day moved to S3Proxy (`peers/install.sh s3proxy`);
    /// upload MB/s, bucket bytes per event, a day's per-minute aggregate (requests to the
    /// bucket), a cold and a warm 1-minute scan.
    Tier(runner::tier::TierArgs),
    /// A W1 DataFrame (10M rows) appended durably through the Python package and read back
    /// into pandas and Arrow, beside the questdb Python client into QuestDB.
    Python(runner::python::PythonArgs),
    /// The queries analysts and dashboards send (and the shapes issue 46 found slow) over
    /// 1M trades and 200k quotes, timed on a Tidemark server and on DuckDB in memory.
    Sql(runner::sql::SqlArgs),
    /// Records this host's /proc metrics (CPU, memory, disks, network, vmstat) once a second
    /// into a gzip'd CSV, the kind of file `bench metrics` replays.
    RecordMetrics(runner::metrics::RecordArgs),
    /// Every workload in turn (W1 embedded, server and cluster; W2; W3; W5; lines; W4 pipeline; tier; python; sql), each in its own folder
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
            runner::insert::run(args)
        }
        BenchCommand::Append(args) => {
            clear_summary(&args.out)?;
            runner::append::run(args)
        }
        BenchCommand::Consume(args) => {
            clear_summary(&args.out)?;
            runner::consume::run(args)
        }
        BenchCommand::Metrics(args) => {
            clear_summary(&args.out)?;
            runner::metrics::run(args)
        }
        BenchCommand::Lines(args) => {
            clear_summary(&args.out)?;
            runner::lines::run(args)
        }
        BenchCommand::Pipeline(args) => {
            clear_summary(&args.out)?;
            runner::pipeline::run(args)
        }
        BenchCommand::Tier(args) => {
            clear_summary(&args.out)?;
            runner::tier::run(args)
        }
        BenchCommand::Python(args) => {
            clear_summary(&args.out)?;
            runner::python::run(args)
        }
        BenchCommand::Sql(args) => {
            clear_summary(&args.out)?;
            runner::sql::run(args)
        }
        BenchCommand::RecordMetrics(args) => runner::metrics::record(args),
        BenchCommand::All { quick, peers, out } => runner::all::all(quick, &peers, &out),
    }
}
