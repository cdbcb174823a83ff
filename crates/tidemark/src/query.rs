//! `tidemark query "SELECT ..."`: SQL against a server or a data directory.

use std::io::{BufWriter, Write};

use anyhow::Result;
use clap::{Args, ValueEnum};
use futures::StreamExt;
use tidemark_engine::Engine;
use tidemark_query::Times;
use tidemark_sql::{render, AnswerWriter, Format, SqlOptions};

use crate::data_dir::DataDir;
use crate::remote::Remote;
use crate::streams::open;
use crate::table::{table_of, TimeFormat};

#[derive(Clone, Copy, ValueEnum)]
pub enum QueryFormat {
    Table,
    Jsonl,
    Csv,
}

#[derive(Args)]
pub struct QueryArgs {
    /// The query, e.g. "SELECT max(PRICE) FROM ticks WHERE ts > now() - INTERVAL '1 hour'".
    sql: String,
    #[command(flatten)]
    remote: Remote,
    /// Output format.
    #[arg(long, value_enum, default_value = "table")]
    format: QueryFormat,
    /// How time columns (ts, bucket, min(ts), ...) are printed [default: rfc3339 in a
    /// table, ns in jsonl and csv].
    #[arg(long, value_enum)]
    time: Option<TimeFormat>,
    #[command(flatten)]
    dir: DataDir,
}

pub fn run(args: QueryArgs) -> Result<()> {
    let times = match (args.time, args.format) {
        (Some(time), _) => time.into(),
        (None, QueryFormat::Table) => Times::Rfc3339,
        (None, _) => Times::Nanoseconds,
    };
    let mut out = BufWriter::new(std::io::stdout().lock());
    match args.remote.client()? {
        Some(client) => {
            let time = match times {
                Times::Rfc3339 => "rfc3339",
                Times::Nanoseconds => "ns",
            };
            let table = table_of(&client.query_with_times(&args.sql, time)?)?;
            match args.format {
                QueryFormat::Table => table.write_text(&mut out)?,
                QueryFormat::Jsonl => table.write_json(&mut out)?,
                QueryFormat::Csv => table.write_csv(&mut out)?,
            }
        }
        None => {
            let db = open(&args.dir)?;
            let runtime = tokio::runtime::Builder::new_multi_thread()
                .worker_threads(2)
                .enable_all()
                .build()?;
            runtime.block_on(print_answer(&db, &args.sql, args.format, times, &mut out))?;
        }
    }
    out.flush()?;
    Ok(())
}

/// Runs `sql` on the database and prints its answer: JSON lines and CSV as the batches
/// come, a table once all rows are in (its columns are as wide as their widest cell).
async fn print_answer(
    db: &Engine,
    sql: &str,
    format: QueryFormat,
    times: Times,
    out: &mut impl Write,
) -> Result<()> {
    let mut batches = tidemark_sql::query(db, sql, SqlOptions::default()).await?;
    let schema = batches.schema();
    let format = match format {
        QueryFormat::Table => {
            let mut table = render::empty_table(&schema);
            while let Some(batch) = batches.next().await {
                render::append_to_table(&mut table, &batch?, times)?;
            }
            return Ok(table.write_text(out)?);
        }
        QueryFormat::Jsonl => Format::JsonLines,
        QueryFormat::Csv => Format::Csv,
    };
    let mut writer = AnswerWriter::begin(format, times, &schema)?;
    while let Some(batch) = batches.next().await {
        writer.write(&batch?)?;
        for piece in writer.take_output() {
            out.write_all(&piece)?;
        }
    }
    for piece in writer.finish()? {
        out.write_all(&piece)?;
    }
    Ok(())
}
