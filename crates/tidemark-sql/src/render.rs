//! Writing answers as they stream: a JSON document, JSON lines, CSV or an Arrow IPC stream,
//! one record batch at a time, so an answer of any size passes in bounded memory.
//!
//! Timestamps are written as RFC 3339 (or nanoseconds, when asked) in text formats and stay
//! Arrow timestamps in Arrow; numbers, booleans and text as JSON and CSV write them
//! elsewhere in Tidemark (the row writers of `tidemark_query::output`).

use std::io;
use std::sync::Arc;

use bytes::Bytes;
use datafusion::arrow::array::{Array, ArrayRef, AsArray, RecordBatch};
use datafusion::arrow::buffer::Buffer;
use datafusion::arrow::compute::cast;
use datafusion::arrow::datatypes::{
    DataType, Float32Type, Float64Type, Int16Type, Int32Type, Int64Type, Int8Type, Schema,
    TimeUnit, TimestampNanosecondType, UInt16Type, UInt32Type, UInt64Type, UInt8Type,
};
use datafusion::arrow::error::ArrowError;
use datafusion::arrow::ipc::writer::StreamEncoder;
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

/// Arrow buffers at least this large go out as they are, shared with the batch that holds
/// them; smaller pieces (message headers, padding, null masks of short batches) are copied
/// together so an answer is not sent in slivers.
const SHARED_PIECE_BYTES: usize = 64 * 1024;

/// Encodes one answer, batch by batch, into pieces of bytes the caller sends in order
/// ([`AnswerWriter::take_output`]): an answer of any size passes in bounded memory, and an
/// Arrow answer's column buffers reach the socket without being copied on the way.
pub struct AnswerWriter {
    format: Format,
    times: Times,
    columns: Vec<String>,
    rows_written: u64,
    arrow: Option<StreamEncoder>,
    /// Bytes not yet in `pieces`: text, and Arrow's small pieces.
    copied: Vec<u8>,
    pieces: Vec<Bytes>,
}

impl AnswerWriter {
    /// Starts the answer (its header, for the formats that have one).
    pub fn begin(format: Format, times: Times, schema: &Schema) -> io::Result<Self> {
        let columns: Vec<String> = schema.fields().iter().map(|f| f.name().clone()).collect();
        let mut copied = Vec::new();
        let mut arrow = None;
        match format {
            Format::JsonDocument => {
                copied.extend_from_slice(b"{\"columns\":");
                serde_json::to_writer(&mut copied, &columns)?;
                copied.extend_from_slice(b",\"rows\":[");
            }
            Format::Csv => write_csv_header_row(&columns, &mut copied)?,
            Format::JsonLines => {}
            Format::Arrow => arrow = Some(StreamEncoder::try_new(schema).map_err(io_error)?),
        }
        Ok(AnswerWriter {
            format,
            times,
            columns,
            rows_written: 0,
            arrow,
            copied,
            pieces: Vec::new(),
        })
    }

    /// Writes the rows of `batch`.
    pub fn write(&mut self, batch: &RecordBatch) -> io::Result<()> {
        if let Some(encoder) = &mut self.arrow {
            let buffers = encoder.encode(batch).map_err(io_error)?;
            self.put_arrow(buffers);
            return Ok(());
        }
        let out = &mut self.copied;
        for row in rows(batch, self.times).map_err(io_error)? {
            match self.format {
                Format::JsonDocument => {
                    if self.rows_written > 0 {
                        out.push(b',');
                    }
                    write_json_array_row(&row, out)?;
                }
                Format::JsonLines => write_json_object_row(&self.columns, &row, out)?,
                Format::Csv => write_csv_row(&row, out)?,
                Format::Arrow => unreachable!("Arrow answers are written by their encoder"),
            }
            self.rows_written += 1;
        }
        Ok(())
    }

    /// The bytes written so far, in order, leaving none (to send an answer as it grows).
    pub fn take_output(&mut self) -> Vec<Bytes> {
        self.seal_copied();
        std::mem::take(&mut self.pieces)
    }

    /// Ends the answer: the bytes not taken yet, in order.
    pub fn finish(mut self) -> io::Result<Vec<Bytes>> {
        match self.arrow.take() {
            Some(encoder) => {
                let buffers = encoder.finish().map_err(io_error)?;
                self.put_arrow(buffers);
            }
            None if self.format == Format::JsonDocument => self.copied.extend_from_slice(b"]}"),
            None => {}
        }
        Ok(self.take_output())
    }

    fn put_arrow(&mut self, buffers: Vec<Buffer>) {
        for buffer in buffers {
            if buffer.len() >= SHARED_PIECE_BYTES {
                self.seal_copied();
                self.pieces.push(Bytes::from_owner(SharedBuffer(buffer)));
            } else {
                self.copied.extend_from_slice(buffer.as_slice());
            }
        }
    }

    fn seal_copied(&mut self) {
        if !self.copied.is_empty() {
            self.pieces
                .push(Bytes::from(std::mem::take(&mut self.copied)));
        }
    }
}

/// An Arrow buffer as the owner of a [`Bytes`] (Arrow's `Buffer` is an `AsRef<[u8]>` only
/// by reference).
struct SharedBuffer(Buffer);

impl AsRef<[u8]> for SharedBuffer {
    fn as_ref(&self) -> &[u8] {
        self.0.as_slice()
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

#[cfg(test)]
mod tests {
    use datafusion::arrow::array::{Int64Array, StringArray};
    use datafusion::arrow::datatypes::Field;
    use datafusion::arrow::ipc::reader::StreamReader;

    use super::*;

    fn batch(schema: &Arc<Schema>, rows: i64, base: i64) -> RecordBatch {
        let values = Int64Array::from_iter_values((0..rows).map(|i| base + i * 7));
        let names =
            StringArray::from_iter((0..rows).map(|i| (i % 3 != 0).then(|| format!("s{i}"))));
        RecordBatch::try_new(schema.clone(), vec![Arc::new(values), Arc::new(names)]).unwrap()
    }

    fn schema() -> Arc<Schema> {
        Arc::new(Schema::new(vec![
            Field::new("v", DataType::Int64, false),
            Field::new("s", DataType::Utf8, true),
        ]))
    }

    #[test]
    fn an_arrow_answer_reads_back_as_its_batches_and_shares_their_large_buffers() {
        let schema = schema();
        // 800 KB of int64 (shared with the batch) and a few hundred bytes of strings.
        let batches = [batch(&schema, 100_000, 0), batch(&schema, 40, -5)];
        let mut writer = AnswerWriter::begin(Format::Arrow, Times::Nanoseconds, &schema).unwrap();
        let mut pieces = writer.take_output();
        for b in &batches {
            writer.write(b).unwrap();
            pieces.extend(writer.take_output());
        }
        pieces.extend(writer.finish().unwrap());

        let values = batches[0].column(0).to_data().buffers()[0].as_ptr();
        assert!(
            pieces.iter().any(|p| p.as_ptr() == values),
            "the large column went out copied"
        );
        assert!(pieces.iter().all(|p| !p.is_empty()));

        let stream = pieces.concat();
        let read: Vec<RecordBatch> = StreamReader::try_new(stream.as_slice(), None)
            .unwrap()
            .collect::<Result<_, _>>()
            .unwrap();
        assert_eq!(read, batches);
    }

    #[test]
    fn an_arrow_answer_without_batches_is_a_stream_of_its_schema() {
        let schema = schema();
        let writer = AnswerWriter::begin(Format::Arrow, Times::Nanoseconds, &schema).unwrap();
        let stream = writer.finish().unwrap().concat();
        let reader = StreamReader::try_new(stream.as_slice(), None).unwrap();
        assert_eq!(reader.schema(), schema);
        assert_eq!(reader.count(), 0);
    }

    #[test]
    fn a_json_answer_is_one_document_across_batches() {
        let schema = schema();
        let mut writer =
            AnswerWriter::begin(Format::JsonDocument, Times::Nanoseconds, &schema).unwrap();
        let mut pieces = Vec::new();
        for b in [batch(&schema, 2, 10), batch(&schema, 1, 20)] {
            writer.write(&b).unwrap();
            pieces.extend(writer.take_output());
        }
        pieces.extend(writer.finish().unwrap());
        let answer: serde_json::Value = serde_json::from_slice(&pieces.concat()).unwrap();
        assert_eq!(
            answer,
            serde_json::json!({"columns": ["v", "s"], "rows": [[10, null], [17, "s1"], [20, null]]})
        );
    }
}
