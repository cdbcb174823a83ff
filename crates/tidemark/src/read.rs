//! `tidemark scan` and `tidemark agg`.

use std::io::{BufWriter, IsTerminal, Write};

use anyhow::{bail, Result};
use clap::{Args, ValueEnum};
use tidemark_engine::{AggregateRequest, TimeRange};
use tidemark_query::time::{now_ns, parse_duration};
use tidemark_query::{
    parse_aggregation, run_aggregate, write_events, EventFormat, EventQuery, EventsError, Times,
};

use crate::data_dir::DataDir;
use crate::remote::Remote;
use crate::streams::open;
use crate::table::{table_of, TimeFormat};

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
    fn query(&self) -> EventQuery {
        EventQuery {
            from: self.from.clone(),
            to: self.to.clone(),
            last: self.last.clone(),
            ..EventQuery::default()
        }
    }

    fn range(&self) -> Result<TimeRange> {
        Ok(self.query().range(now_ns())?)
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
    #[command(flatten)]
    remote: Remote,
}

pub fn scan(args: ScanArgs) -> Result<()> {
    let query = EventQuery {
        fields: args.fields.clone(),
        filters: args.filters.clone(),
        limit: args.limit,
        ..args.range.query()
    };
    let format = match args.format {
        ScanFormat::Jsonl => EventFormat::Jsonl,
        ScanFormat::Csv => EventFormat::Csv,
    };
    let mut out = BufWriter::new(std::io::stdout().lock());
    let written = match args.remote.client()? {
        Some(client) => {
            let text = client.scan(
                &args.stream,
                &scan_params(&query, args.time),
                format == EventFormat::Csv,
            )?;
            out.write_all(text.as_bytes())
                .map(|()| {
                    text.lines()
                        .count()
                        .saturating_sub(usize::from(format == EventFormat::Csv))
                        as u64
                })
                .map_err(EventsError::Io)
        }
        None => {
            let db = open(&args.dir)?;
            let schema = db.stream_schema(&args.stream)?;
            let request = query.request(&schema, now_ns())?;
            write_events(
                db.scan(&args.stream, &request)?,
                &query.output_schema(&schema)?,
                query.limit,
                format,
                args.time.into(),
                &mut out,
            )
        }
    };
    let written = match written.and_then(|n| out.flush().map(|()| n).map_err(EventsError::Io)) {
        Ok(n) => n,
        // The reader went away (`| head`): what it took was printed.
        Err(EventsError::Io(e)) if e.kind() == std::io::ErrorKind::BrokenPipe => return Ok(()),
        Err(e) => return Err(e.into()),
    };
    if written == 0 && format == EventFormat::Jsonl && std::io::stdout().is_terminal() {
        eprintln!("no events of {:?} in the range", args.stream);
    }
    Ok(())
}

/// The SQL a server runs for an aggregate request: the same columns as [`run_aggregate`]'s
/// table (`bucket`, then `max(FIELD)`, `count(*)`, ...).
fn aggregate_sql(stream: &str, request: &AggregateRequest) -> String {
    // Plain names unquoted, so that the columns are named as run_aggregate names them.
    let quote = |name: &str| {
        let plain = name.starts_with(|c: char| c.is_ascii_alphabetic() || c == '_')
            && name.chars().all(|c| c.is_ascii_alphanumeric() || c == '_');
        if plain {
            name.to_string()
        } else {
            format!("\"{}\"", name.replace('"', "\"\""))
        }
    };
    let mut columns = Vec::new();
    if let Some(width) = request.bucket_ns {
        columns.push(format!("time_bucket('{width}ns', ts) AS bucket"));
    }
    for a in &request.aggregations {
        let field = a.field.as_deref().map_or_else(|| "*".to_string(), quote);
        columns.push(format!("{}({field})", a.func));
    }
    let mut conditions = Vec::new();
    if request.range.min > i64::MIN {
        conditions.push(format!("ts >= {}", request.range.min));
    }
    if request.range.max < i64::MAX {
        conditions.push(format!("ts <= {}", request.range.max));
    }
    let mut sql = format!("SELECT {} FROM {}", columns.join(", "), quote(stream));
    if !conditions.is_empty() {
        sql += &format!(" WHERE {}", conditions.join(" AND "));
    }
    if request.bucket_ns.is_some() {
        sql += " GROUP BY bucket ORDER BY bucket";
    }
    sql
}

/// The query parameters of `GET /v1/streams/{s}/events` for `query`.
fn scan_params(query: &EventQuery, time: TimeFormat) -> Vec<(&'static str, String)> {
    let mut params = Vec::new();
    for (key, value) in [
        ("from", &query.from),
        ("to", &query.to),
        ("last", &query.last),
    ] {
        if let Some(value) = value {
            params.push((key, value.clone()));
        }
    }
    if let Some(fields) = &query.fields {
        params.push(("fields", fields.join(",")));
    }
    params.extend(query.filters.iter().map(|f| ("where", f.clone())));
    if let Some(limit) = query.limit {
        params.push(("limit", limit.to_string()));
    }
    if let TimeFormat::Rfc3339 = time {
        params.push(("time", "rfc3339".to_string()));
    }
    params
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
    /// How bucket starts are printed [default: rfc3339 in a table, ns in jsonl], the rule
    /// of `scan` and `query`.
    #[arg(long, value_enum)]
    time: Option<TimeFormat>,
    #[command(flatten)]
    dir: DataDir,
    #[command(flatten)]
    remote: Remote,
}

pub fn agg(args: AggArgs) -> Result<()> {
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
    // One rule for every command: people read RFC 3339, programs nanoseconds.
    let times = match (args.time, args.format) {
        (Some(time), _) => time.into(),
        (None, AggFormat::Table) => Times::Rfc3339,
        (None, AggFormat::Jsonl) => Times::Nanoseconds,
    };
    // Both ways give nanoseconds, written here alike.
    let table = match args.remote.client()? {
        Some(client) => {
            let sql = aggregate_sql(&args.stream, &request);
            table_of(&client.query_with_times(&sql, "ns")?)?
        }
        None => {
            let db = open(&args.dir)?;
            run_aggregate(&db, &args.stream, &request)?
        }
    }
    .with_times(times);
    let mut out = std::io::stdout().lock();
    match args.format {
        AggFormat::Table => table.write_text(&mut out)?,
        AggFormat::Jsonl => table.write_json(&mut out)?,
    }
    Ok(())
}
