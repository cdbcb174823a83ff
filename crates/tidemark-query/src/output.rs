//! Rendering results: aligned text tables, JSON lines and CSV.

use std::io::{self, Write};

use tidemark_core::json::event_to_json;
use tidemark_core::time::format_instant;
use tidemark_core::{EventBatch, Schema, Value};

/// A small result: named columns and rows of values.
#[derive(Debug, Clone, PartialEq)]
pub struct Table {
    pub columns: Vec<String>,
    pub rows: Vec<Vec<Value>>,
}

impl Table {
    /// Columns padded to their widest cell, numbers right-aligned.
    pub fn write_text(&self, out: &mut impl Write) -> io::Result<()> {
        let cells: Vec<Vec<String>> = self
            .rows
            .iter()
            .map(|r| r.iter().map(|v| v.to_string()).collect())
            .collect();
        let widths: Vec<usize> = self
            .columns
            .iter()
            .enumerate()
            .map(|(i, c)| {
                cells
                    .iter()
                    .map(|r| r[i].chars().count())
                    .chain([c.chars().count()])
                    .max()
                    .unwrap_or(0)
            })
            .collect();
        let line = |out: &mut dyn Write, values: &[String], numeric: &[bool]| -> io::Result<()> {
            let parts: Vec<String> = values
                .iter()
                .zip(&widths)
                .zip(numeric)
                .map(|((v, &w), &num)| {
                    if num {
                        format!("{v:>w$}")
                    } else {
                        format!("{v:<w$}")
                    }
                })
                .collect();
            writeln!(out, "{}", parts.join("  ").trim_end())
        };
        let numeric: Vec<bool> = (0..self.columns.len())
            .map(|i| {
                self.rows
                    .iter()
                    .all(|r| !matches!(r[i], Value::String(_) | Value::Bytes(_)))
            })
            .collect();
        line(out, &self.columns, &vec![false; self.columns.len()])?;
        let rule: Vec<String> = widths.iter().map(|&w| "-".repeat(w)).collect();
        line(out, &rule, &vec![false; widths.len()])?;
        for row in &cells {
            line(out, row, &numeric)?;
        }
        Ok(())
    }

    /// The table with its time columns (`ts`, `tstart`, `tend`, `bucket`, and aggregates of
    /// `ts` such as `min(ts)`) written as `times` says.
    pub fn with_times(mut self, times: Times) -> Table {
        if times == Times::Nanoseconds {
            return self;
        }
        let time_columns: Vec<usize> = (0..self.columns.len())
            .filter(|&i| is_time_column(&self.columns[i]))
            .collect();
        for row in &mut self.rows {
            for &i in &time_columns {
                if let Value::Long(ns) = row[i] {
                    row[i] = Value::String(times.format(ns));
                }
            }
        }
        self
    }

    /// One JSON object per row.
    pub fn write_json(&self, out: &mut impl Write) -> io::Result<()> {
        for row in &self.rows {
            write_json_object_row(&self.columns, row, out)?;
        }
        Ok(())
    }

    /// CSV with a header row; see [`csv_value`] for how values are written.
    pub fn write_csv(&self, out: &mut impl Write) -> io::Result<()> {
        write_csv_header_row(&self.columns, out)?;
        for row in &self.rows {
            write_csv_row(row, out)?;
        }
        Ok(())
    }
}

/// A row as a JSON object keyed by `columns`, and a newline: one line of JSON lines.
pub fn write_json_object_row(
    columns: &[String],
    row: &[Value],
    out: &mut impl Write,
) -> io::Result<()> {
    let object: serde_json::Map<String, serde_json::Value> = columns
        .iter()
        .cloned()
        .zip(row.iter().map(Value::to_json))
        .collect();
    serde_json::to_writer(&mut *out, &object)?;
    out.write_all(b"\n")
}

/// A row as a JSON array: one row of the HTTP API's `{"columns", "rows"}` document.
pub fn write_json_array_row(row: &[Value], out: &mut impl Write) -> io::Result<()> {
    let cells: Vec<serde_json::Value> = row.iter().map(Value::to_json).collect();
    Ok(serde_json::to_writer(out, &cells)?)
}

/// The header line of a CSV answer.
pub fn write_csv_header_row(columns: &[String], out: &mut impl Write) -> io::Result<()> {
    let header: Vec<String> = columns.iter().map(|c| csv_cell(c)).collect();
    writeln!(out, "{}", header.join(","))
}

/// A row as a CSV line; see [`csv_value`] for how values are written.
pub fn write_csv_row(row: &[Value], out: &mut impl Write) -> io::Result<()> {
    let cells: Vec<String> = row.iter().map(csv_value).collect();
    writeln!(out, "{}", cells.join(","))
}

/// Writes a batch as JSON lines (`{"tstart":..,"tend":..,"FIELD":..}`).
pub fn write_json_batch(batch: &EventBatch, times: Times, out: &mut impl Write) -> io::Result<()> {
    for row in 0..batch.len() {
        let mut event = event_to_json(batch, row);
        if times == Times::Rfc3339 {
            format_event_times(&mut event);
        }
        writeln!(out, "{event}")?;
    }
    Ok(())
}

/// An event's `tstart` and `tend` (as [`event_to_json`] gives them) as RFC 3339 text.
pub fn format_event_times(event: &mut serde_json::Value) {
    for key in ["tstart", "tend"] {
        if let Some(ns) = event.get(key).and_then(serde_json::Value::as_i64) {
            event[key] = format_instant(ns).into();
        }
    }
}

/// Writes a batch as CSV rows (`tstart,tend,FIELD..`), with a header when `header` is set.
/// Nulls are empty cells.
pub fn write_csv_batch(
    batch: &EventBatch,
    header: bool,
    times: Times,
    out: &mut impl Write,
) -> io::Result<()> {
    if header {
        write_csv_header(batch.schema(), out)?;
    }
    for row in 0..batch.len() {
        let mut cells = vec![
            times.format(batch.tstart()[row]),
            batch
                .tend_at(row)
                .map(|t| times.format(t))
                .unwrap_or_default(),
        ];
        cells.extend(batch.columns().iter().map(|c| csv_value(&c.value(row))));
        writeln!(out, "{}", cells.join(","))?;
    }
    Ok(())
}

/// The CSV header of a stream's events: `tstart,tend,FIELD..`.
pub fn write_csv_header(schema: &Schema, out: &mut impl Write) -> io::Result<()> {
    let mut names = vec!["tstart".to_string(), "tend".to_string()];
    names.extend(schema.fields().iter().map(|f| csv_cell(&f.name)));
    writeln!(out, "{}", names.join(","))
}

/// Whether a result column holds event times, by its name.
fn is_time_column(name: &str) -> bool {
    let name = name.trim().to_ascii_lowercase();
    let time = |n: &str| matches!(n, "ts" | "tstart" | "tend" | "bucket");
    time(&name)
        || name
            .split_once('(')
            .and_then(|(f, arg)| Some((f, arg.strip_suffix(')')?)))
            .is_some_and(|(f, arg)| matches!(f, "min" | "max" | "first" | "last") && time(arg))
}

/// How event times are written: nanoseconds since the epoch (for programs) or RFC 3339 in
/// UTC (for people).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Times {
    Nanoseconds,
    Rfc3339,
}

impl Times {
    pub fn format(self, ns: i64) -> String {
        match self {
            Times::Nanoseconds => ns.to_string(),
            Times::Rfc3339 => format_instant(ns),
        }
    }
}

/// A value as a CSV cell: a null is an empty cell and an empty string a quoted one (`""`),
/// so the two stay apart; infinities and NaN are written as JSON writes them (`Infinity`,
/// `-Infinity`, `NaN`), BYTES as base64.
pub fn csv_value(value: &Value) -> String {
    match value {
        Value::Null => String::new(),
        Value::String(s) if s.is_empty() => "\"\"".to_string(),
        Value::Float(_) | Value::Double(_) | Value::Bytes(_) => match value.to_json() {
            serde_json::Value::String(s) => csv_cell(&s),
            other => other.to_string(),
        },
        v => csv_cell(&v.to_string()),
    }
}

/// A CSV cell: quoted (with doubled quotes) when it holds a comma, quote or line break.
pub fn csv_cell(text: &str) -> String {
    if text.contains([',', '"', '\n', '\r']) {
        format!("\"{}\"", text.replace('"', "\"\""))
    } else {
        text.to_string()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::Arc;
    use tidemark_core::{BatchBuilder, Schema};

    #[test]
    fn time_columns_are_written_as_asked() {
        let table = Table {
            columns: vec![
                "ts".into(),
                "max(ts)".into(),
                "N".into(),
                "count(ts)".into(),
            ],
            rows: vec![vec![
                Value::Long(0),
                Value::Long(1_000_000_000),
                Value::Long(5),
                Value::Long(2),
            ]],
        };
        assert_eq!(table.clone().with_times(Times::Nanoseconds), table);
        let people = table.with_times(Times::Rfc3339);
        assert_eq!(
            people.rows[0],
            vec![
                Value::String("1970-01-01T00:00:00Z".into()),
                Value::String("1970-01-01T00:00:01Z".into()),
                Value::Long(5),
                Value::Long(2)
            ]
        );
    }

    #[test]
    fn renders() {
        let table = Table {
            columns: vec!["bucket".into(), "max(P)".into()],
            rows: vec![
                vec![Value::String("a".into()), Value::Float(1.5)],
                vec![Value::String("bb".into()), Value::Null],
                vec![Value::String("".into()), Value::Float(f32::NEG_INFINITY)],
            ],
        };
        let mut text = Vec::new();
        table.write_text(&mut text).unwrap();
        assert_eq!(
            String::from_utf8(text).unwrap(),
            "bucket  max(P)\n------  ------\na          1.5\nbb        null\n          -inf\n"
        );
        let mut json = Vec::new();
        table.write_json(&mut json).unwrap();
        assert!(String::from_utf8(json)
            .unwrap()
            .starts_with("{\"bucket\":\"a\",\"max(P)\":1.5}"));

        let mut csv = Vec::new();
        table.write_csv(&mut csv).unwrap();
        assert_eq!(
            String::from_utf8(csv).unwrap(),
            "bucket,max(P)\na,1.5\nbb,\n\"\",-Infinity\n"
        );
        let mut row = Vec::new();
        write_json_array_row(&table.rows[1], &mut row).unwrap();
        assert_eq!(String::from_utf8(row).unwrap(), "[\"bb\",null]");

        let schema = Arc::new(Schema::parse_spec("S:STRING,N:LONG").unwrap());
        let mut b = BatchBuilder::new(schema, 2);
        b.push_row(1, Some(2), &[Value::String("x,\"y\"".into()), Value::Null])
            .unwrap();
        let mut csv = Vec::new();
        write_csv_batch(&b.finish(), true, Times::Nanoseconds, &mut csv).unwrap();
        assert_eq!(
            String::from_utf8(csv).unwrap(),
            "tstart,tend,S,N\n1,2,\"x,\"\"y\"\"\",\n"
        );
    }
}
