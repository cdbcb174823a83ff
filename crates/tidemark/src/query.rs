//! `tidemark query "SELECT ..."`: the SQL subset against a server or a data directory.

use std::io::{BufWriter, Write};

use anyhow::{bail, Result};
use clap::{Args, ValueEnum};
use serde_json::Value as Json;
use tidemark_core::Value;
use tidemark_query::sql::{run_sql, SqlLimits};
use tidemark_query::time::now_ns;
use tidemark_query::{Table, Times};

use crate::read::TimeFormat;
use crate::remote::Remote;
use crate::streams::open;
use crate::DataDir;

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
    let table = match args.remote.client()? {
        Some(client) => table_of(&client.query(&args.sql)?)?,
        None => {
            let db = open(&args.dir)?;
            run_sql(&db, &args.sql, now_ns(), SqlLimits::default())?
        }
    };
    let times = match (args.time, args.format) {
        (Some(time), _) => time.into(),
        (None, QueryFormat::Table) => Times::Rfc3339,
        (None, _) => Times::Nanoseconds,
    };
    let table = table.with_times(times);
    let mut out = BufWriter::new(std::io::stdout().lock());
    match args.format {
        QueryFormat::Table => table.write_text(&mut out)?,
        QueryFormat::Jsonl => table.write_json(&mut out)?,
        QueryFormat::Csv => table.write_csv(&mut out)?,
    }
    out.flush()?;
    Ok(())
}

/// The server's `{"columns", "rows"}` as a table.
pub(crate) fn table_of(answer: &Json) -> Result<Table> {
    let (Some(columns), Some(rows)) = (answer["columns"].as_array(), answer["rows"].as_array())
    else {
        bail!("unexpected answer from the server: {answer}");
    };
    let value = |cell: &Json| match cell {
        Json::Null => Value::Null,
        Json::Bool(b) => Value::Boolean(*b),
        Json::Number(n) => n.as_i64().map_or_else(
            || Value::Double(n.as_f64().unwrap_or(f64::NAN)),
            Value::Long,
        ),
        Json::String(s) => Value::String(s.clone()),
        other => Value::String(other.to_string()),
    };
    Ok(Table {
        columns: columns
            .iter()
            .map(|c| c.as_str().unwrap_or_default().to_string())
            .collect(),
        rows: rows
            .iter()
            .map(|r| {
                r.as_array()
                    .map(|r| r.iter().map(value).collect())
                    .unwrap_or_default()
            })
            .collect(),
    })
}
