//! Answers as tables, shared by `tidemark query`, `scan` and `agg`: how times are printed,
//! and a server's `{"columns", "rows"}` answer read back into a [`Table`].
//!
//! Must never know about: which command asked, or how a table is printed.

use anyhow::{bail, Result};
use clap::ValueEnum;
use serde_json::Value as Json;
use tidemark_core::Value;
use tidemark_query::{Table, Times};

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

/// The server's `{"columns", "rows"}` as a table.
pub fn table_of(answer: &Json) -> Result<Table> {
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
