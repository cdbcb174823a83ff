//! `tidemark demo`: the first thing to run on a new machine.

use std::time::Instant;

use anyhow::Result;
use clap::Args;
use indicatif::{ProgressBar, ProgressStyle};
use tidemark_bench::w1;
use tidemark_core::AggFn;
use tidemark_engine::{AggregateRequest, Aggregation, TimeRange};
use tidemark_query::run_aggregate;
use tidemark_query::time::now_ns;

use crate::streams::open_or_create;
use crate::DataDir;

#[derive(Args)]
pub struct DemoArgs {
    /// How many events to ingest.
    #[arg(long, default_value_t = 1_000_000)]
    events: usize,
    #[command(flatten)]
    dir: DataDir,
}

pub fn run(args: DemoArgs) -> Result<()> {
    let db = open_or_create(&args.dir)?;
    db.create_stream(w1::STREAM, w1::schema())?;
    println!(
        "stream {:?} ({}) in {}",
        w1::STREAM,
        w1::schema(),
        args.dir.data_dir.display()
    );
    let batches = w1::generate(args.events, 10_000, now_ns(), now_ns() as u64);
    let bar = ProgressBar::new(args.events as u64);
    if let Ok(style) = ProgressStyle::with_template(
        "ingesting [{bar:40}] {human_pos}/{human_len} events ({per_sec})",
    ) {
        bar.set_style(style.progress_chars("=> "));
    }
    let started = Instant::now();
    for batch in batches {
        let ack = db.append(w1::STREAM, batch)?;
        bar.inc(ack.events as u64);
    }
    bar.finish_and_clear();
    let seconds = started.elapsed().as_secs_f64();
    println!(
        "ingested {} events in {:.2} s ({:.0} durable events/s, one appender)",
        args.events,
        seconds,
        args.events as f64 / seconds
    );
    let now = now_ns();
    let request = AggregateRequest {
        range: TimeRange::half_open(now - 3_600_000_000_000, now + 1),
        bucket_ns: Some(60_000_000_000),
        aggregations: vec![
            Aggregation::count(),
            Aggregation::new(AggFn::Min, "LASTTRADEPRICE"),
            Aggregation::new(AggFn::Max, "LASTTRADEPRICE"),
            Aggregation::new(AggFn::Avg, "LASTTRADEPRICE"),
        ],
    };
    let started = Instant::now();
    let table = run_aggregate(&db, w1::STREAM, &request)?;
    let took = started.elapsed();
    println!(
        "\nlast hour of {} in 1-minute buckets ({:.3} ms):\n",
        w1::STREAM,
        took.as_secs_f64() * 1e3
    );
    table.write_text(&mut std::io::stdout().lock())?;
    println!(
        "\ntry: tidemark agg {} --fn max:LASTTRADEPRICE --bucket 1m --last 1h",
        w1::STREAM
    );
    db.close()?;
    Ok(())
}
