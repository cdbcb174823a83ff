//! `tidemark bench ...`

use std::path::PathBuf;

use anyhow::{bail, Context, Result};
use clap::{Subcommand, ValueEnum};
use tidemark_bench::w1::{self, InsertConfig};
use tidemark_engine::Options;

#[derive(Clone, Copy, PartialEq, Eq, ValueEnum)]
pub enum Target {
    Embedded,
    Server,
    Cluster,
}

#[derive(Subcommand)]
pub enum BenchCommand {
    /// W1: event-store ingest, timed until the last event is durable.
    Insert {
        #[arg(long, value_enum, default_value = "embedded")]
        target: Target,
        /// Event counts, comma-separated.
        #[arg(
            long,
            value_delimiter = ',',
            default_value = "1,100,10000,1000000,10000000"
        )]
        events: Vec<usize>,
        /// Trials per count.
        #[arg(long, default_value_t = 10)]
        trials: usize,
        /// Events per appended batch.
        #[arg(long, default_value_t = 10_000)]
        batch: usize,
        /// Concurrent appenders (their appends share fsyncs).
        #[arg(long, default_value_t = 4)]
        writers: usize,
        /// Directory for insert.csv (the database goes in DIR/data and is removed after).
        #[arg(long, default_value = "bench-out")]
        out: PathBuf,
    },
}

pub fn run(command: BenchCommand) -> Result<()> {
    match command {
        BenchCommand::Insert {
            target,
            events,
            trials,
            batch,
            writers,
            out,
        } => {
            if target != Target::Embedded {
                bail!("only --target embedded exists so far: the server and cluster targets arrive with them");
            }
            if events.is_empty() || trials == 0 || batch == 0 {
                bail!("--events, --trials and --batch must be positive");
            }
            let data_dir = out.join("data");
            if data_dir.exists() {
                std::fs::remove_dir_all(&data_dir)
                    .with_context(|| format!("clearing {}", data_dir.display()))?;
            }
            let config = InsertConfig {
                event_counts: events,
                trials,
                batch_size: batch,
                writers,
                data_dir: data_dir.clone(),
                options: Options::default(),
                progress: true,
            };
            let report = w1::run_embedded(&config)?;
            std::fs::remove_dir_all(&data_dir).ok();
            let csv = w1::write_csv(&out, &report.trials)?;
            println!("W1 insert, target embedded, batches of {batch} events, {writers} appenders, durable (fsync'd) acknowledgements");
            println!(
                "{:>10}  {:>6}  {:>14}  {:>14}  {:>12}",
                "events", "trials", "median ev/s", "max ev/s", "median ms"
            );
            for (count, n, med, max, ms) in w1::summarise(&report.trials) {
                println!("{count:>10}  {n:>6}  {med:>14.0}  {max:>14.0}  {ms:>12.3}");
            }
            if let Some(b) = report.compressed_bytes_per_event {
                println!("compressed size: {b:.2} bytes per event on disk");
            }
            let largest = report.query_events;
            let (bytes, took) = report.physical_limit;
            let limit_rate = largest as f64 / took.as_secs_f64();
            let best_median = w1::summarise(&report.trials)
                .iter()
                .filter(|s| s.0 == largest)
                .map(|s| s.2)
                .next()
                .unwrap_or(0.0);
            println!(
                "physical limit: {:.0} MB of payload written sequentially with an fsync per batch took {:.0} ms ({:.0} MB/s, {:.0} events/s); Tidemark's median is {:.0}% of it",
                bytes as f64 / 1e6,
                took.as_secs_f64() * 1e3,
                bytes as f64 / 1e6 / took.as_secs_f64(),
                limit_rate,
                100.0 * best_median / limit_rate
            );
            for (what, (events, took)) in [
                ("all events", report.full_scan),
                ("the last minute", report.minute_scan),
            ] {
                println!(
                    "scan of {what} (all fields, flushed): {events} events in {:.1} ms ({:.0} events/s)",
                    took.as_secs_f64() * 1e3,
                    events as f64 / took.as_secs_f64()
                );
            }
            println!("flushing the {largest} events of the last trial into compressed segments took {:.0} ms after the last acknowledgement", report.flush_after_ingest.as_secs_f64() * 1e3);
            let ms = |d: std::time::Duration| d.as_secs_f64() * 1e3;
            println!(
                "max(LASTTRADEPRICE) over the last hour in 1-minute buckets, {} events: {:.3} ms first / {:.3} ms median (right after ingest), {:.3} ms / {:.3} ms (flushed)",
                report.query_events,
                ms(report.query_latency_unflushed.0),
                ms(report.query_latency_unflushed.1),
                ms(report.query_latency_flushed.0),
                ms(report.query_latency_flushed.1)
            );
            println!("trials written to {}", csv.display());
        }
    }
    Ok(())
}
