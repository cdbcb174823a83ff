//! `tidemark scan` and `tidemark agg`.

use std::io::{BufWriter, IsTerminal, Write};

use anyhow::{bail, Result};
use clap::{Args, ValueEnum};
use tidemark_engine::{AggregateRequest, ScanRequest, TimeRange};
use tidemark_query::time::{now_ns, parse_duration, parse_instant};
use tidemark_query::{
    parse_aggregation, parse_predicate, run_aggregate, write_csv_batch, write_csv_header,
    write_json_batch, Times,
};

use crate::streams::open;
use crate::DataDir;

/// A time range from the command line.
#[derive(Args)]
pub struct RangeArgs {
    /// Start (inclusive): nanoseconds since the epoch, an RFC 3339 time
    /// (`2026-11-23T19:30:00Z`; `2026-11-23 19:30` is UTC), `now` or `now-1h`.
    #[arg(long, conflicts_with = "last")]
    from: Option<String>,
    /// End (exclusive): as --from, e.g. `now-5m`.
    #[arg(long, conflicts_with = "last")]
    to: Option<String>,
    /// The last DURATION until now, e.g. `1h`.
    #[arg(long)]
    last: Option<String>,
}

impl RangeArgs {
    fn range(&self) -> Result<TimeRange> {
        let now = now_ns();
        if let Some(last) = &self.last {
            return Ok(TimeRange::half_open(
                now - parse_duration(last)?,
                now.saturating_add(1),
            ));
        }
        let from = self
            .from
            .as_deref()
            .map(|t| parse_instant(t, now))
            .transpose()?
            .unwrap_or(i64::MIN);
        match self
            .to
            .as_deref()
            .map(|t| parse_instant(t, now))
            .transpose()?
        {
            Some(to) => Ok(TimeRange::half_open(from, to)),
            None => Ok(TimeRange::new(from, i64::MAX)),
        }
    }
}

/// How times are printed.
#[derive(Clone, Copy, ValueEnum)]
pub enum TimeFormat {
    /// Nanoseconds since the epoch.
    Ns,
    /// RFC 3339 in UTC, e.g. 2026-11-23T19:30:00.000000001Z.
    Rfc3339,
}

impl From<TimeFormat> for Times {
    fn from(format: TimeFormat) -> Times {
        match format {
            TimeFormat::Ns => Times::Nanoseconds,
            TimeFormat::Rfc3339 => Times::Rfc3339,
        }
    }
}

#[derive(Clone, Copy, ValueEnum)]
pub enum ScanFormat {
    Jsonl,
    Csv,
}

#[derive(Args)]
pub struct ScanArgs {
    /// The stream to read.
    stream: String,
    #[command(flatten)]
    range: RangeArgs,
    /// Fields to print, comma-separated (default: all).
    #[arg(long, value_delimiter = ',')]
    fields: Option<Vec<String>>,
    /// A filter like `SYMBOL = AAPL` or `PRICE > 10` (repeat for AND).
    #[arg(long = "where")]
    filters: Vec<String>,
    /// Print at most this many events.
    #[arg(long)]
    limit: Option<usize>,
    /// Output format.
    #[arg(long, value_enum, default_value = "jsonl")]
    format: ScanFormat,
    /// How tstart and tend are printed.
    #[arg(long, value_enum, default_value = "ns")]
    time: TimeFormat,
    #[command(flatten)]
    dir: DataDir,
}

pub fn scan(args: ScanArgs) -> Result<()> {
    let db = open(&args.dir)?;
    let schema = db.stream_info(&args.stream)?.schema;
    let request = ScanRequest {
        range: args.range.range()?,
        fields: args.fields,
        filter: args
            .filters
            .iter()
            .map(|f| parse_predicate(f, &schema))
            .collect::<Result<_, _>>()?,
        ..ScanRequest::default()
    };
    let mut out = BufWriter::new(std::io::stdout().lock());
    let mut left = args.limit.unwrap_or(usize::MAX);
    let mut first = true;
    for batch in db.scan(&args.stream, &request)? {
        if left == 0 {
            break;
        }
        let mut batch = batch?;
        if batch.len() > left {
            batch = batch.take(&(0..left as u32).collect::<Vec<_>>());
        }
        left -= batch.len();
        let written = match args.format {
            ScanFormat::Jsonl => write_json_batch(&batch, args.time.into(), &mut out),
            ScanFormat::Csv => write_csv_batch(&batch, first, args.time.into(), &mut out),
        };
        if let Err(e) = written {
            if e.kind() == std::io::ErrorKind::BrokenPipe {
                return Ok(());
            }
            return Err(e.into());
        }
        first = false;
    }
    if first {
        // Nothing matched: a CSV still gets its header; a person is told.
        match args.format {
            ScanFormat::Csv => write_csv_header(&schema, &mut out)?,
            ScanFormat::Jsonl if std::io::stdout().is_terminal() => {
                eprintln!("no events of {:?} in the range", args.stream)
            }
            ScanFormat::Jsonl => {}
        }
    }
    out.flush().or_else(|e| {
        if e.kind() == std::io::ErrorKind::BrokenPipe {
            Ok(())
        } else {
            Err(e)
        }
    })?;
    Ok(())
}

#[derive(Clone, Copy, ValueEnum)]
pub enum AggFormat {
    Table,
    Jsonl,
}

#[derive(Args)]
pub struct AggArgs {
    /// The stream to aggregate.
    stream: String,
    /// An aggregate like `max:LASTTRADEPRICE`, `avg:PRICE` or `count` (repeatable).
    #[arg(long = "fn", required = true)]
    functions: Vec<String>,
    /// Bucket width, e.g. `1m`; without it the whole range is one row.
    #[arg(long)]
    bucket: Option<String>,
    #[command(flatten)]
    range: RangeArgs,
    /// Output format.
    #[arg(long, value_enum, default_value = "table")]
    format: AggFormat,
    #[command(flatten)]
    dir: DataDir,
}

pub fn agg(args: AggArgs) -> Result<()> {
    let db = open(&args.dir)?;
    let aggregations = args
        .functions
        .iter()
        .map(|f| parse_aggregation(f))
        .collect::<Result<Vec<_>, _>>()?;
    if aggregations.is_empty() {
        bail!("give at least one --fn");
    }
    let request = AggregateRequest {
        range: args.range.range()?,
        bucket_ns: args.bucket.as_deref().map(parse_duration).transpose()?,
        aggregations,
    };
    let table = run_aggregate(&db, &args.stream, &request)?;
    let mut out = std::io::stdout().lock();
    match args.format {
        AggFormat::Table => table.write_text(&mut out)?,
        AggFormat::Jsonl => table.write_json(&mut out)?,
    }
    Ok(())
}
