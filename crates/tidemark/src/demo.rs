//! `tidemark demo`: the first thing to run on a new machine.

use std::path::Path;
use std::time::Instant;

use anyhow::Result;
use clap::Args;
use indicatif::{ProgressBar, ProgressStyle};
use tidemark_bench::w1;
use tidemark_core::AggFn;
use tidemark_engine::{AggregateRequest, Aggregation, TimeRange};
use tidemark_query::time::now_ns;
use tidemark_query::{run_aggregate, Times};

use crate::data_dir::{DataDir, DEFAULT_DATA_DIR};
use crate::streams::open_or_create_for_demo;

#[derive(Args)]
pub struct DemoArgs {
    /// How many events to ingest.
    #[arg(long, default_value_t = 1_000_000)]
    events: usize,
    #[command(flatten)]
    dir: DataDir,
}

pub fn run(args: DemoArgs) -> Result<()> {
    let db = open_or_create_for_demo(&args.dir)?;
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
    let table = run_aggregate(&db, w1::STREAM, &request)?.with_times(Times::Rfc3339);
    let took = started.elapsed();
    println!(
        "\nlast hour of {} in 1-minute buckets ({:.3} ms):\n",
        w1::STREAM,
        took.as_secs_f64() * 1e3
    );
    table.write_text(&mut std::io::stdout().lock())?;
    // The command as it can be pasted: on the directory the demo wrote, whichever it was.
    println!(
        "\ntry: {}",
        follow_up(
            &args.dir.data_dir,
            &[
                "agg",
                w1::STREAM,
                "--fn",
                "max:LASTTRADEPRICE",
                "--bucket",
                "1m",
                "--last",
                "1h"
            ]
        )
    );
    db.close()?;
    Ok(())
}

/// `tidemark ARGS --data-dir DIR` as a shell takes it; the option left out for the default
/// directory, which the command finds alone.
fn follow_up(dir: &Path, args: &[&str]) -> String {
    let mut words: Vec<String> = std::iter::once("tidemark")
        .chain(args.iter().copied())
        .map(shell_word)
        .collect();
    if dir != Path::new(DEFAULT_DATA_DIR) {
        words.push("--data-dir".into());
        words.push(shell_word(&dir.to_string_lossy()));
    }
    words.join(" ")
}

/// `word` quoted for a POSIX shell when it holds anything but plain characters.
fn shell_word(word: &str) -> String {
    let plain = |c: char| c.is_ascii_alphanumeric() || "-_./:=,@%+".contains(c);
    if !word.is_empty() && word.chars().all(plain) {
        word.to_string()
    } else {
        format!("'{}'", word.replace('\'', "'\\''"))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_follow_up_names_the_directory_unless_it_is_the_default() {
        assert_eq!(
            follow_up(Path::new("tidemark-data"), &["agg", "W1"]),
            "tidemark agg W1"
        );
        assert_eq!(
            follow_up(Path::new("/tmp/demo"), &["agg", "W1"]),
            "tidemark agg W1 --data-dir /tmp/demo"
        );
        assert_eq!(
            follow_up(Path::new("my data/it's"), &["agg"]),
            "tidemark agg --data-dir 'my data/it'\\''s'"
        );
    }
}
