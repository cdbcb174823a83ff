//! `tidemark put`: JSON lines or CSV into a stream, in batches, with a progress bar.

use std::fs::File;
use std::io::{self, BufRead, BufReader, Read};
use std::path::PathBuf;
use std::sync::Arc;

use anyhow::{bail, Context, Result};
use clap::{Args, ValueEnum};
use indicatif::{ProgressBar, ProgressStyle};
use tidemark_client::HttpClient;
use tidemark_core::json::decode_event_into;
use tidemark_core::{BatchBuilder, EventBatch, Schema, Value};
use tidemark_engine::Db;
use tidemark_query::spec::literal;

use crate::data_dir::DataDir;
use crate::remote::{self, Remote};
use crate::streams::open_or_create;

#[derive(Clone, Copy, ValueEnum)]
pub enum Format {
    Jsonl,
    Csv,
}

#[derive(Args)]
pub struct PutArgs {
    /// The stream to append to.
    stream: String,
    /// Input file; standard input if absent.
    file: Option<PathBuf>,
    /// Input format (default: csv for *.csv files, else jsonl).
    #[arg(long, value_enum)]
    format: Option<Format>,
    /// Events per appended batch.
    #[arg(long, default_value_t = 10_000)]
    batch: usize,
    #[command(flatten)]
    dir: DataDir,
    #[command(flatten)]
    remote: Remote,
}

/// Where the batches go: the data directory, or a server (`--server`).
enum Destination {
    Local(Db),
    Server(HttpClient),
}

impl Destination {
    fn append(&self, stream: &str, batch: EventBatch) -> Result<u64> {
        match self {
            Destination::Local(db) => Ok(db.append(stream, batch)?.events as u64),
            Destination::Server(client) => remote::append(client, stream, &batch),
        }
    }
}

/// Counts bytes read so the progress bar can follow a file.
struct Counted<R> {
    inner: R,
    bar: ProgressBar,
}

impl<R: Read> Read for Counted<R> {
    fn read(&mut self, buf: &mut [u8]) -> io::Result<usize> {
        let n = self.inner.read(buf)?;
        self.bar.inc(n as u64);
        Ok(n)
    }
}

pub fn run(args: PutArgs) -> Result<()> {
    let (destination, schema) = match args.remote.client()? {
        Some(client) => {
            let schema = remote::stream_info(&client, &args.stream)?.schema;
            (Destination::Server(client), schema)
        }
        None => {
            let db = open_or_create(&args.dir)?;
            let schema = db.stream_info(&args.stream)?.schema;
            (Destination::Local(db), schema)
        }
    };
    let format = args.format.unwrap_or(match &args.file {
        Some(p) if p.extension().is_some_and(|e| e.eq_ignore_ascii_case("csv")) => Format::Csv,
        _ => Format::Jsonl,
    });
    let (input, bar): (Box<dyn Read>, ProgressBar) = match &args.file {
        Some(path) => {
            let file = File::open(path).with_context(|| format!("opening {}", path.display()))?;
            let bar = ProgressBar::new(file.metadata()?.len());
            if let Ok(style) = ProgressStyle::with_template(
                "[{bar:40}] {bytes}/{total_bytes} ({bytes_per_sec}, {eta}) {msg}",
            ) {
                bar.set_style(style.progress_chars("=> "));
            }
            (Box::new(file), bar)
        }
        None => {
            let spinner = ProgressBar::new_spinner();
            spinner.enable_steady_tick(std::time::Duration::from_millis(200));
            (Box::new(io::stdin().lock()), spinner)
        }
    };
    let reader = BufReader::with_capacity(
        1 << 20,
        Counted {
            inner: input,
            bar: bar.clone(),
        },
    );
    let mut sink = Sink {
        destination: &destination,
        stream: &args.stream,
        batch: args.batch.max(1),
        builder: BatchBuilder::new(schema.clone(), 0),
        stored: 0,
        bar: bar.clone(),
    };
    let outcome = match format {
        Format::Jsonl => put_jsonl(reader, &mut sink),
        Format::Csv => put_csv(reader, &schema, &mut sink),
    }
    .and_then(|()| sink.flush());
    bar.finish_and_clear();
    match outcome {
        Ok(()) => {
            println!("stored {} events in {:?}", sink.stored, args.stream);
            Ok(())
        }
        Err(e) => Err(e.context(format!(
            "{} events were stored before the error (each batch is all or nothing)",
            sink.stored
        ))),
    }
}

struct Sink<'a> {
    destination: &'a Destination,
    stream: &'a str,
    batch: usize,
    builder: BatchBuilder,
    stored: u64,
    bar: ProgressBar,
}

impl Sink<'_> {
    fn flush(&mut self) -> Result<()> {
        if self.builder.is_empty() {
            return Ok(());
        }
        let schema = self.builder.schema().clone();
        let batch =
            std::mem::replace(&mut self.builder, BatchBuilder::new(schema, self.batch)).finish();
        self.stored += self.destination.append(self.stream, batch)?;
        self.bar.set_message(format!("{} events", self.stored));
        Ok(())
    }

    fn maybe_flush(&mut self) -> Result<()> {
        if self.builder.len() >= self.batch {
            self.flush()?;
        }
        Ok(())
    }
}

fn put_jsonl(reader: impl BufRead, sink: &mut Sink) -> Result<()> {
    for (i, line) in reader.lines().enumerate() {
        let line = line.with_context(|| format!("reading line {}", i + 1))?;
        if line.trim().is_empty() {
            continue;
        }
        let event = tidemark_core::json::parse_strict(line.as_bytes())
            .with_context(|| format!("line {}: not JSON", i + 1))?;
        let row = sink.builder.len();
        decode_event_into(&mut sink.builder, &event, row)
            .with_context(|| format!("line {}", i + 1))?;
        sink.maybe_flush()?;
    }
    Ok(())
}

/// CSV with a header row naming `tstart`, optionally `tend`, and every field; empty cells
/// are nulls.
fn put_csv(reader: impl Read, schema: &Arc<Schema>, sink: &mut Sink) -> Result<()> {
    let mut csv = csv::ReaderBuilder::new()
        .has_headers(true)
        .from_reader(reader);
    let headers = csv.headers()?.clone();
    let column_of = |name: &str| {
        headers
            .iter()
            .position(|h| h.trim().eq_ignore_ascii_case(name))
    };
    let Some(tstart) = column_of("tstart") else {
        bail!("the CSV header has no tstart column");
    };
    let tend = column_of("tend");
    let fields = schema
        .fields()
        .iter()
        .map(|f| {
            column_of(&f.name)
                .with_context(|| format!("the CSV header has no column for field {:?}", f.name))
        })
        .collect::<Result<Vec<_>>>()?;
    let known = fields.len() + 1 + usize::from(tend.is_some());
    if headers.len() != known {
        bail!("the CSV header has columns that are not in the schema ({schema})");
    }
    for (i, record) in csv.records().enumerate() {
        let line = i + 2;
        let record = record.with_context(|| format!("line {line}"))?;
        let cell = |c: usize| record.get(c).unwrap_or("");
        let ts = csv_timestamp(cell(tstart))
            .with_context(|| format!("line {line}: tstart {:?}", cell(tstart)))?;
        let end = match tend.map(cell).map(str::trim) {
            None | Some("") => None,
            Some(t) => Some(csv_timestamp(t).with_context(|| format!("line {line}: tend {t:?}"))?),
        };
        let values = schema
            .fields()
            .iter()
            .zip(&fields)
            .map(|(f, &c)| {
                if cell(c).is_empty() {
                    Ok(Value::Null)
                } else {
                    literal(cell(c), f.ty)
                }
            })
            .collect::<Result<Vec<_>, _>>()
            .with_context(|| format!("line {line}"))?;
        sink.builder
            .push_row(ts, end, &values)
            .with_context(|| format!("line {line}"))?;
        sink.maybe_flush()?;
    }
    Ok(())
}

/// A CSV time cell: nanoseconds since the epoch, or an RFC 3339 time (UTC without a zone).
fn csv_timestamp(cell: &str) -> Result<i64> {
    let cell = cell.trim();
    if let Ok(ns) = cell.parse() {
        return Ok(ns);
    }
    Ok(tidemark_core::time::parse_rfc3339(cell)?)
}
