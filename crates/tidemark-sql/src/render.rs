//! Writing answers as they stream: a JSON document, JSON lines, CSV or an Arrow IPC stream,
//! one record batch at a time, so an answer of any size passes in bounded memory.
//!
//! Timestamps are written as RFC 3339 (or nanoseconds, when asked) in text formats and stay
//! Arrow timestamps in Arrow; numbers, booleans and text as JSON and CSV write them
//! elsewhere in Tidemark (the row writers of `tidemark_query::output`).

use std::io::{self, Write};
use std::sync::Arc;

use datafusion::arrow::array::{Array, ArrayRef, AsArray, RecordBatch};
use datafusion::arrow::compute::cast;
use datafusion::arrow::datatypes::{
    DataType, Float32Type, Float64Type, Int16Type, Int32Type, Int64Type, Int8Type, Schema,
    TimeUnit, TimestampNanosecondType, UInt16Type, UInt32Type, UInt64Type, UInt8Type,
};
use datafusion::arrow::error::ArrowError;
use datafusion::arrow::ipc::writer::StreamWriter;
use datafusion::arrow::util::display::{ArrayFormatter, FormatOptions};
use tidemark_core::Value;
use tidemark_query::output::{
    write_csv_header_row, write_csv_row, write_json_array_row, write_json_object_row,
};
use tidemark_query::{Table, Times};

/// How an answer is written.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Format {
    /// `{"columns": [...], "rows": [[...], ...]}`.
    JsonDocument,
    /// One JSON object per row.
    JsonLines,
    /// A header row, then one line per row.
    Csv,
    /// An Arrow IPC stream (`application/vnd.apache.arrow.stream`).
    Arrow,
}

impl Format {
    pub fn media_type(self) -> &'static str {
        match self {
            Format::JsonDocument => "application/json",
            Format::JsonLines => "application/x-ndjson",
            Format::Csv => "text/csv",
            Format::Arrow => "application/vnd.apache.arrow.stream",
        }
    }
}

/// Writes one answer, batch by batch, to `out`.
pub struct AnswerWriter<W: Write> {
    format: Format,
    times: Times,
    columns: Vec<String>,
    rows_written: u64,
    state: State<W>,
}

enum State<W: Write> {
    Text(W),
    Arrow(Box<StreamWriter<W>>),
}

impl<W: Write> AnswerWriter<W> {
    /// Starts the answer (its header, for the formats that have one).
    pub fn begin(format: Format, times: Times, schema: &Schema, mut out: W) -> io::Result<Self> {
        let columns: Vec<String> = schema.fields().iter().map(|f| f.name().clone()).collect();
        let state = match format {
            Format::JsonDocument => {
                out.write_all(b"{\"columns\":")?;
                serde_json::to_writer(&mut out, &columns)?;
                out.write_all(b",\"rows\":[")?;
                State::Text(out)
            }
            Format::Csv => {
                write_csv_header_row(&columns, &mut out)?;
                State::Text(out)
            }
            Format::JsonLines => State::Text(out),
            Format::Arrow => State::Arrow(Box::new(
                StreamWriter::try_new(out, schema).map_err(io_error)?,
            )),
        };
        Ok(AnswerWriter {
            format,
            times,
            columns,
            rows_written: 0,
            state,
        })
    }

    /// Writes the rows of `batch`.
    pub fn write(&mut self, batch: &RecordBatch) -> io::Result<()> {
        let out = match &mut self.state {
            State::Arrow(writer) => return writer.write(batch).map_err(io_error),
            State::Text(out) => out,
        };
        let rows = rows(batch, self.times).map_err(io_error)?;
        for row in rows {
            match self.format {
                Format::JsonDocument => {
                    if self.rows_written > 0 {
                        out.write_all(b",")?;
                    }
                    write_json_array_row(&row, out)?;
                }
                Format::JsonLines => write_json_object_row(&self.columns, &row, out)?,
                Format::Csv => write_csv_row(&row, out)?,
                Format::Arrow => unreachable!("Arrow answers are written by their StreamWriter"),
            }
            self.rows_written += 1;
        }
        Ok(())
    }

    /// Ends the answer and hands back the writer.
    pub fn finish(self) -> io::Result<W> {
        match self.state {
            State::Arrow(mut writer) => {
                writer.finish().map_err(io_error)?;
                writer.into_inner().map_err(io_error)
            }
            State::Text(mut out) => {
                if self.format == Format::JsonDocument {
                    out.write_all(b"]}")?;
                }
                Ok(out)
            }
        }
    }
}

impl AnswerWriter<Vec<u8>> {
    /// The bytes written so far, leaving the buffer empty (to send an answer as it grows).
    pub fn take_output(&mut self) -> Vec<u8> {
        match &mut self.state {
            State::Text(out) => std::mem::take(out),
            State::Arrow(writer) => std::mem::take(writer.get_mut()),
        }
    }
}

fn io_error(e: ArrowError) -> io::Error {
    io::Error::other(e)
}

/// Appends the rows of `batch` to `table` (for answers printed as an aligned table).
pub fn append_to_table(
    table: &mut Table,
    batch: &RecordBatch,
    times: Times,
) -> Result<(), ArrowError> {
    table.rows.extend(rows(batch, times)?);
    Ok(())
}

/// The rows of `batch` as values: timestamps per `times`, other types the SQL engine may
/// produce (dates, intervals, decimals, lists) as Arrow displays them.
pub fn rows(batch: &RecordBatch, times: Times) -> Result<Vec<Vec<Value>>, ArrowError> {
    let mut columns = batch
        .columns()
        .iter()
        .map(|column| cells(column, times).map(Vec::into_iter))
        .collect::<Result<Vec<_>, _>>()?;
    // Each cell moves from its column into its row (every column has num_rows cells).
    Ok((0..batch.num_rows())
        .map(|_| {
            columns
                .iter_mut()
                .map(|c| c.next().unwrap_or(Value::Null))
                .collect()
        })
        .collect())
}

fn cells(column: &ArrayRef, times: Times) -> Result<Vec<Value>, ArrowError> {
    macro_rules! primitive {
        ($ty:ty, $variant:expr) => {
            column
                .as_primitive::<$ty>()
                .iter()
                .map(|v| v.map_or(Value::Null, $variant))
                .collect()
        };
    }
    Ok(match column.data_type() {
        DataType::Null => vec![Value::Null; column.len()],
        DataType::Boolean => column
            .as_boolean()
            .iter()
            .map(|v| v.map_or(Value::Null, Value::Boolean))
            .collect(),
        DataType::Int8 => primitive!(Int8Type, Value::Byte),
        DataType::Int16 => primitive!(Int16Type, Value::Short),
        DataType::Int32 => primitive!(Int32Type, Value::Integer),
        DataType::Int64 => primitive!(Int64Type, Value::Long),
        DataType::UInt8 => primitive!(UInt8Type, |v| Value::Long(i64::from(v))),
        DataType::UInt16 => primitive!(UInt16Type, |v| Value::Long(i64::from(v))),
        DataType::UInt32 => primitive!(UInt32Type, |v| Value::Long(i64::from(v))),
        DataType::UInt64 => primitive!(UInt64Type, |v: u64| i64::try_from(v)
            .map_or(Value::Double(v as f64), Value::Long)),
        DataType::Float32 => primitive!(Float32Type, Value::Float),
        DataType::Float64 => primitive!(Float64Type, Value::Double),
        DataType::Utf8 | DataType::LargeUtf8 | DataType::Utf8View => {
            let text = cast(column, &DataType::Utf8)?;
            text.as_string::<i32>()
                .iter()
                .map(|v| v.map_or(Value::Null, |s| Value::String(s.to_string())))
                .collect()
        }
        DataType::Binary | DataType::LargeBinary | DataType::BinaryView => {
            let bytes = cast(column, &DataType::Binary)?;
            bytes
                .as_binary::<i32>()
                .iter()
                .map(|v| v.map_or(Value::Null, |b| Value::Bytes(b.to_vec())))
                .collect()
        }
        DataType::Timestamp(_, zone) => {
            let ns = cast(
                column,
                &DataType::Timestamp(TimeUnit::Nanosecond, zone.clone()),
            )?;
            ns.as_primitive::<TimestampNanosecondType>()
                .iter()
                .map(|v| v.map_or(Value::Null, |ns| time_value(ns, times)))
                .collect()
        }
        _ => {
            let options = FormatOptions::default().with_null("");
            let formatter = ArrayFormatter::try_new(column.as_ref(), &options)?;
            (0..column.len())
                .map(|row| {
                    if column.is_null(row) {
                        Value::Null
                    } else {
                        Value::String(formatter.value(row).to_string())
                    }
                })
                .collect()
        }
    })
}

fn time_value(ns: i64, times: Times) -> Value {
    match times {
        Times::Nanoseconds => Value::Long(ns),
        Times::Rfc3339 => Value::String(times.format(ns)),
    }
}

/// An empty table of `schema`'s columns.
pub fn empty_table(schema: &Arc<Schema>) -> Table {
    Table {
        columns: schema.fields().iter().map(|f| f.name().clone()).collect(),
        rows: Vec::new(),
    }
}
