//! Arrow IPC streams of events (`application/vnd.apache.arrow.stream`, what pyarrow, pandas
//! through pyarrow, and polars write), decoded into an [`EventBatch`] of a stream's schema.
//!
//! The bytes are read by Arrow's own stream decoder (`arrow-ipc`); this module maps the
//! columns it finds onto the stream, by name, and checks them:
//! - `tstart` (required, never null) and `tend` (optional): a timestamp of any unit (the
//!   instant it is; a time zone label changes nothing) or an int64 of nanoseconds;
//! - every other column names a field of the stream (case-insensitively, as everywhere) and
//!   has that field's Arrow type, the one SQL answers with ([`arrow_type`]: int32 for
//!   INTEGER, float32 for FLOAT, utf8 for STRING, binary for BYTES...; large_utf8 and
//!   large_binary too), or the `null` type (every value null). A field no column names is
//!   null in every event.
//!
//! Anything else is refused naming the column: values are never converted here (a float64
//! column for a FLOAT field is refused, not rounded), so nothing is stored other than it was
//! sent. Clients cast first, refusing what does not fit (the Python package does).
//!
//! Dictionary and view columns are refused: their values may point at the same bytes many
//! times, so a small body could decode into a huge batch. Plain columns decode into at most
//! about the body's size: the body is copied once into aligned memory, Arrow's arrays are
//! slices of it, and each column's values are copied once more, in bulk, into the batch's
//! own vectors (the engine's columns own their values).

use std::sync::Arc;

use arrow_array::cast::AsArray;
use arrow_array::types::{
    BinaryType, ByteArrayType, Float32Type, Float64Type, Int16Type, Int32Type, Int64Type, Int8Type,
    LargeBinaryType, LargeUtf8Type, TimestampMicrosecondType, TimestampMillisecondType,
    TimestampNanosecondType, TimestampSecondType, Utf8Type,
};
use arrow_array::{Array, ArrowPrimitiveType, OffsetSizeTrait, RecordBatch};
use arrow_buffer::Buffer;
use arrow_ipc::reader::StreamDecoder;
use arrow_schema::{ArrowError, DataType, Schema as ArrowSchema, TimeUnit};
use tidemark_core::{
    Bitmap, Column, ColumnData, EventBatch, FieldType, Schema, Timestamp, VarBinary,
};

/// The media type of an Arrow IPC stream.
pub const MEDIA_TYPE: &str = "application/vnd.apache.arrow.stream";

/// The column every event's start is read from.
const TSTART: &str = "tstart";
/// The column an event's end is read from, where it has one.
const TEND: &str = "tend";

/// Why an Arrow IPC body is not a batch of a stream.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum ArrowEventsError {
    /// Not an Arrow IPC stream, or a damaged one.
    #[error("not a readable Arrow IPC stream: {0}")]
    Malformed(String),
    /// A column that cannot go into the stream; the reason names what would.
    #[error("column {column:?}: {reason}")]
    Column { column: String, reason: String },
    #[error("the Arrow stream has no \"tstart\" column (a timestamp, or an int64 of nanoseconds since the epoch); its columns are {0}")]
    NoTstart(String),
}

/// The Arrow type a field of type `ty` is sent and answered as.
pub fn arrow_type(ty: FieldType) -> DataType {
    match ty {
        FieldType::Boolean => DataType::Boolean,
        FieldType::Byte => DataType::Int8,
        FieldType::Short => DataType::Int16,
        FieldType::Integer => DataType::Int32,
        FieldType::Long => DataType::Int64,
        FieldType::Float => DataType::Float32,
        FieldType::Double => DataType::Float64,
        FieldType::String => DataType::Utf8,
        FieldType::Bytes => DataType::Binary,
    }
}

/// The events of the Arrow IPC stream `body` as one batch of `schema`, all of its record
/// batches in order (a body is appended whole or not at all).
pub fn decode_events(body: &[u8], schema: &Arc<Schema>) -> Result<EventBatch, ArrowEventsError> {
    if body.is_empty() {
        return Err(ArrowEventsError::Malformed("the body is empty".into()));
    }
    check_messages(body)?;
    let mut bytes = Buffer::from(body);
    let mut decoder = StreamDecoder::new();
    let mut events: Option<Events> = None;
    while !bytes.is_empty() {
        let batch = decoder.decode(&mut bytes).map_err(malformed)?;
        if events.is_none() {
            if let Some(arrow_schema) = decoder.schema() {
                events = Some(Events::new(&arrow_schema, schema)?);
            }
        }
        if let Some(batch) = batch {
            let events = events.as_mut().ok_or_else(|| {
                ArrowEventsError::Malformed("a record batch came before the schema".into())
            })?;
            events.push(&batch)?;
        }
    }
    decoder.finish().map_err(malformed)?;
    let events = events.ok_or_else(|| {
        ArrowEventsError::Malformed("the stream ended before its schema message".into())
    })?;
    events.finish(schema)
}

/// Record batches of one Arrow schema (`arrow`), already in memory, as one batch of `schema`
/// under the same rules as an IPC body: what SQL's `INSERT` and `COPY` store, their values
/// cast to the stream's types first (`tidemark-sql`).
pub fn events_of_batches(
    arrow: &ArrowSchema,
    batches: &[RecordBatch],
    schema: &Arc<Schema>,
) -> Result<EventBatch, ArrowEventsError> {
    let mut events = Events::new(arrow, schema)?;
    for batch in batches {
        if batch.schema().fields() != arrow.fields() {
            return Err(ArrowEventsError::Malformed(
                "the record batches differ in their columns".into(),
            ));
        }
        events.push(batch)?;
    }
    events.finish(schema)
}

/// Checks every message of the stream before Arrow's decoder reads it.
///
/// Arrow's IPC reader (`arrow-ipc` 59) panics on some malformed input where it could return
/// an error: its schema conversion on a type, width or unit it does not know or a missing
/// type table (`convert::get_data_type`), its batch reader on a buffer that lies outside the
/// message body (`Buffer::slice_with_length`). Bytes from the network must not reach it
/// unchecked, so the messages are walked here first, from the same bytes (verified
/// flatbuffers: reading them cannot panic): the first is a schema of the flat types this
/// module takes, every other a record batch, uncompressed, whose buffers lie in its body,
/// aligned, each as long as its column needs.
fn check_messages(body: &[u8]) -> Result<(), ArrowEventsError> {
    let mut at = 0;
    let mut columns: Option<Vec<Layout>> = None;
    while at < body.len() {
        let Some((message, end)) = next_message(body, at)? else {
            break; // The end-of-stream marker.
        };
        match &columns {
            None => columns = Some(check_schema(message)?),
            Some(columns) => check_record_batch(message, columns)?,
        }
        at = end;
    }
    Ok(())
}

/// The message that starts at `at` and where the next one starts; `None` at the
/// end-of-stream marker.
fn next_message(
    body: &[u8],
    at: usize,
) -> Result<Option<(arrow_ipc::Message<'_>, usize)>, ArrowEventsError> {
    let cut = || ArrowEventsError::Malformed("the body ends inside a message".into());
    let word = |at: usize| -> Result<u32, ArrowEventsError> {
        let bytes = body.get(at..at + 4).ok_or_else(cut)?;
        Ok(u32::from_le_bytes([bytes[0], bytes[1], bytes[2], bytes[3]]))
    };
    // A message is [0xFFFFFFFF] <u32 length> <flatbuffer> <body>; the marker is optional
    // (streams before Arrow 1.0), a length of 0 ends the stream.
    let (mut at, mut len) = (at + 4, word(at)?);
    if len == u32::MAX {
        len = word(at)?;
        at += 4;
    }
    if len == 0 {
        return Ok(None);
    }
    let metadata_end = at.checked_add(len as usize).ok_or_else(cut)?;
    let metadata = body.get(at..metadata_end).ok_or_else(cut)?;
    let message = arrow_ipc::root_as_message(metadata)
        .map_err(|e| ArrowEventsError::Malformed(format!("a message's header: {e}")))?;
    if !metadata_end.is_multiple_of(8) {
        return Err(ArrowEventsError::Malformed(
            "a message body that does not start 8-byte aligned".into(),
        ));
    }
    let end = usize::try_from(message.bodyLength())
        .ok()
        .and_then(|len| metadata_end.checked_add(len))
        .filter(|&end| end <= body.len())
        .ok_or_else(cut)?;
    Ok(Some((message, end)))
}

/// How a flat column's values lie in a record batch's body, after its validity bitmap.
#[derive(Debug, Clone, Copy)]
enum Layout {
    /// No buffers at all (the null type).
    Nothing,
    Bits,
    /// Values of this many bytes each.
    Fixed(usize),
    /// Offsets of this many bytes each, then the values they index.
    Offsets(usize),
}

/// The layout of each column of a schema of the flat types this module takes.
fn check_schema(message: arrow_ipc::Message<'_>) -> Result<Vec<Layout>, ArrowEventsError> {
    use arrow_ipc::{Precision, TimeUnit as IpcUnit, Type};
    let schema = message
        .header_as_schema()
        .ok_or_else(|| ArrowEventsError::Malformed("the first message is not a schema".into()))?;
    let fields = schema
        .fields()
        .ok_or_else(|| ArrowEventsError::Malformed("the schema lists no columns".into()))?;
    let mut layouts = Vec::with_capacity(fields.len());
    for field in fields {
        let nested = field.children().is_some_and(|c| !c.is_empty());
        let layout =
            match field.type_type() {
                _ if nested || field.dictionary().is_some() => None,
                Type::Null => Some(Layout::Nothing),
                Type::Bool => Some(Layout::Bits),
                Type::Utf8 | Type::Binary => Some(Layout::Offsets(4)),
                Type::LargeUtf8 | Type::LargeBinary => Some(Layout::Offsets(8)),
                Type::Int => field
                    .type_as_int()
                    .filter(|int| int.is_signed() && [8, 16, 32, 64].contains(&int.bitWidth()))
                    .map(|int| Layout::Fixed(int.bitWidth() as usize / 8)),
                Type::FloatingPoint => field.type_as_floating_point().and_then(|float| match float
                    .precision()
                {
                    Precision::SINGLE => Some(Layout::Fixed(4)),
                    Precision::DOUBLE => Some(Layout::Fixed(8)),
                    _ => None,
                }),
                Type::Timestamp => field
                    .type_as_timestamp()
                    .filter(|ts| {
                        [
                            IpcUnit::SECOND,
                            IpcUnit::MILLISECOND,
                            IpcUnit::MICROSECOND,
                            IpcUnit::NANOSECOND,
                        ]
                        .contains(&ts.unit())
                    })
                    .map(|_| Layout::Fixed(8)),
                _ => None,
            };
        let Some(layout) = layout else {
            let ty = match field.type_type().variant_name() {
                Some(name) => name.to_string(),
                None => format!("type {}", field.type_type().0),
            };
            let shape = if field.dictionary().is_some() {
                "dictionary-encoded "
            } else {
                ""
            };
            return Err(ArrowEventsError::Column {
                column: field.name().unwrap_or_default().to_string(),
                reason: format!(
                    "is {shape}{ty}; a stream's fields take booleans, signed integers, \
                     float32/float64, utf8 and binary (plain or large), times take timestamps"
                ),
            });
        };
        layouts.push(layout);
    }
    Ok(layouts)
}

/// Checks that a record batch's buffers lie in its body and are as large as its columns'
/// lengths need: Arrow's reader assumes both.
fn check_record_batch(
    message: arrow_ipc::Message<'_>,
    columns: &[Layout],
) -> Result<(), ArrowEventsError> {
    let batch = message.header_as_record_batch().ok_or_else(|| {
        ArrowEventsError::Malformed(format!(
            "a {} message; after the schema only record batches are taken (no dictionaries)",
            message.header_type().variant_name().unwrap_or("unknown")
        ))
    })?;
    if batch.compression().is_some() {
        return Err(ArrowEventsError::Malformed(
            "a compressed record batch: send it uncompressed".into(),
        ));
    }
    let body_len = message.bodyLength();
    let mut buffers = batch.buffers().into_iter().flatten();
    let mut next_buffer = || -> Result<usize, ArrowEventsError> {
        let buffer = buffers
            .next()
            .ok_or_else(|| bad_batch("buffers are fewer than its columns need"))?;
        // Arrow reads values in place, as typed slices: they must be 8-byte aligned, as
        // the format requires (writers pad every buffer to 8 bytes or more).
        let inside = buffer.offset() >= 0
            && buffer.offset() % 8 == 0
            && buffer.length() >= 0
            && buffer
                .offset()
                .checked_add(buffer.length())
                .is_some_and(|end| end <= body_len);
        if !inside {
            return Err(bad_batch("buffer lies outside its body"));
        }
        usize::try_from(buffer.length()).map_err(|_| bad_batch("buffer is too long"))
    };
    let nodes = batch
        .nodes()
        .ok_or_else(|| bad_batch("columns are missing"))?;
    if nodes.len() != columns.len() {
        return Err(bad_batch("columns are not the schema's"));
    }
    for (node, layout) in nodes.iter().zip(columns) {
        check_column(node, layout, &mut next_buffer)?;
    }
    Ok(())
}

/// Checks one column of a record batch against its layout, taking its buffers' lengths
/// from `next_buffer` in order.
fn check_column(
    node: &arrow_ipc::FieldNode,
    layout: &Layout,
    next_buffer: &mut impl FnMut() -> Result<usize, ArrowEventsError>,
) -> Result<(), ArrowEventsError> {
    let (Ok(len), Ok(nulls)) = (
        usize::try_from(node.length()),
        usize::try_from(node.null_count()),
    ) else {
        return Err(bad_batch("column length is negative"));
    };
    if nulls > len {
        return Err(bad_batch("column has more nulls than values"));
    }
    let bits = len.div_ceil(8);
    if matches!(layout, Layout::Nothing) {
        return Ok(());
    }
    let validity = next_buffer()?;
    if nulls > 0 && validity < bits {
        return Err(bad_batch("validity bitmap is shorter than its column"));
    }
    // Arrow views a buffer of values as a slice of them whole: its length must be a
    // multiple of theirs.
    let whole = |bytes: usize, width: usize| bytes.is_multiple_of(width);
    match *layout {
        Layout::Nothing => {}
        Layout::Bits => {
            if next_buffer()? < bits {
                return Err(bad_batch("values are fewer than its column's length"));
            }
        }
        Layout::Fixed(width) => {
            let values = next_buffer()?;
            if values < len.saturating_mul(width) || !whole(values, width) {
                return Err(bad_batch("values do not fit its column's length"));
            }
        }
        Layout::Offsets(width) => {
            let offsets = next_buffer()?;
            let needed = if len == 0 {
                0
            } else {
                (len + 1).saturating_mul(width)
            };
            if offsets < needed || !whole(offsets, width) {
                return Err(bad_batch("offsets do not fit its column's length"));
            }
            next_buffer()?; // The values: Arrow checks them against the offsets.
        }
    }
    Ok(())
}

/// A record batch that does not hold what its header says: `what` is wrong.
fn bad_batch(what: &str) -> ArrowEventsError {
    ArrowEventsError::Malformed(format!("a record batch's {what}"))
}

fn malformed(e: ArrowError) -> ArrowEventsError {
    ArrowEventsError::Malformed(e.to_string())
}

/// Where one Arrow column's values go.
#[derive(Debug, Clone, Copy)]
enum Slot {
    Tstart(Time),
    Tend(Time),
    /// The stream field at this index.
    Field(usize),
}

/// How a time column's values become nanoseconds.
#[derive(Debug, Clone, Copy)]
enum Time {
    Timestamp(TimeUnit),
    Nanoseconds,
}

/// The events decoded so far, column by column.
struct Events {
    /// One per column of the Arrow schema, in its order.
    slots: Vec<(String, Slot)>,
    tstart: Vec<Timestamp>,
    tend: Option<Column>,
    /// Per stream field, its type and its pieces (one per record batch that had the column).
    fields: Vec<(FieldType, Vec<Column>)>,
    rows: usize,
}

impl Events {
    /// Matches the Arrow schema's columns with `schema`'s fields; every refusal a column can
    /// earn by its name or type is given here, before any value is read.
    fn new(arrow: &ArrowSchema, schema: &Schema) -> Result<Events, ArrowEventsError> {
        let mut slots = Vec::with_capacity(arrow.fields().len());
        let mut seen_fields = vec![false; schema.len()];
        for column in arrow.fields() {
            let name = column.name().as_str();
            let refuse = |reason: String| ArrowEventsError::Column {
                column: name.to_string(),
                reason,
            };
            let slot = if name.eq_ignore_ascii_case(TSTART) || name.eq_ignore_ascii_case(TEND) {
                let time = match column.data_type() {
                    DataType::Timestamp(unit, _) => Time::Timestamp(*unit),
                    DataType::Int64 => Time::Nanoseconds,
                    other => {
                        return Err(refuse(format!(
                            "is {other}; a time column is a timestamp, or an int64 of nanoseconds since the epoch"
                        )))
                    }
                };
                if name.eq_ignore_ascii_case(TSTART) {
                    Slot::Tstart(time)
                } else {
                    Slot::Tend(time)
                }
            } else {
                let index = schema.index_of(name).ok_or_else(|| {
                    refuse(format!(
                        "the stream has no such field; its fields are {}",
                        schema.to_spec()
                    ))
                })?;
                let field = &schema.fields()[index];
                if !accepts(field.ty, column.data_type()) {
                    return Err(refuse(format!(
                        "is {}; the stream's field {} is {} (Arrow {})",
                        column.data_type(),
                        field.name,
                        field.ty,
                        arrow_type(field.ty)
                    )));
                }
                if std::mem::replace(&mut seen_fields[index], true) {
                    return Err(refuse(format!("field {} is named twice", field.name)));
                }
                Slot::Field(index)
            };
            let twice = slots.iter().any(|(_, other)| {
                matches!(
                    (other, slot),
                    (Slot::Tstart(_), Slot::Tstart(_)) | (Slot::Tend(_), Slot::Tend(_))
                )
            });
            if twice {
                return Err(refuse("is named twice".into()));
            }
            slots.push((name.to_string(), slot));
        }
        if !slots.iter().any(|(_, s)| matches!(s, Slot::Tstart(_))) {
            let names: Vec<&str> = arrow.fields().iter().map(|f| f.name().as_str()).collect();
            return Err(ArrowEventsError::NoTstart(format!("{names:?}")));
        }
        Ok(Events {
            slots,
            tstart: Vec::new(),
            tend: None,
            fields: schema.fields().iter().map(|f| (f.ty, Vec::new())).collect(),
            rows: 0,
        })
    }

    fn push(&mut self, batch: &RecordBatch) -> Result<(), ArrowEventsError> {
        let rows = batch.num_rows();
        for ((name, slot), array) in self.slots.iter().zip(batch.columns()) {
            let refuse = |reason: String| ArrowEventsError::Column {
                column: name.clone(),
                reason,
            };
            match *slot {
                Slot::Tstart(time) => {
                    if array.null_count() > 0 {
                        return Err(refuse(format!(
                            "{} nulls; every event needs its start",
                            array.null_count()
                        )));
                    }
                    nanoseconds(array.as_ref(), time, &mut self.tstart).map_err(refuse)?;
                }
                Slot::Tend(time) => {
                    let mut ends = Vec::with_capacity(rows);
                    nanoseconds(array.as_ref(), time, &mut ends).map_err(refuse)?;
                    let piece =
                        Column::from_dense(ColumnData::Long(ends), validity(array.as_ref()))
                            .map_err(|e| refuse(e.to_string()))?;
                    let tend = self
                        .tend
                        .get_or_insert_with(|| Column::nulls(FieldType::Long, self.rows));
                    tend.extend_from(&piece, 0..rows)
                        .map_err(|e| refuse(e.to_string()))?;
                }
                Slot::Field(index) => {
                    let (ty, pieces) = &mut self.fields[index];
                    let piece = if *array.data_type() == DataType::Null {
                        Column::nulls(*ty, rows)
                    } else {
                        column(array.as_ref()).map_err(refuse)?
                    };
                    pieces.push(piece);
                }
            }
        }
        self.rows += rows;
        // Columns absent from this batch but present in an earlier one cannot happen (one
        // schema per IPC stream); a tend column keeps pace by construction.
        debug_assert_eq!(self.tstart.len(), self.rows);
        Ok(())
    }

    fn finish(self, schema: &Arc<Schema>) -> Result<EventBatch, ArrowEventsError> {
        let rows = self.rows;
        let columns = self
            .fields
            .into_iter()
            .map(|(ty, pieces)| joined(pieces, ty, rows))
            .collect::<Result<Vec<_>, _>>()?;
        EventBatch::new(schema.clone(), self.tstart, self.tend, columns).map_err(|e| {
            ArrowEventsError::Column {
                column: TEND.into(),
                reason: e.to_string(),
            }
        })
    }
}

/// Whether a column of Arrow type `arrow` can go into a field of type `ty` as it is.
fn accepts(ty: FieldType, arrow: &DataType) -> bool {
    *arrow == DataType::Null
        || *arrow == arrow_type(ty)
        || matches!(
            (ty, arrow),
            (FieldType::String, DataType::LargeUtf8) | (FieldType::Bytes, DataType::LargeBinary)
        )
}

/// The pieces of one field, one column of `rows` values (nulls where no piece was sent).
fn joined(pieces: Vec<Column>, ty: FieldType, rows: usize) -> Result<Column, ArrowEventsError> {
    let mut pieces = pieces.into_iter();
    let Some(mut whole) = pieces.next() else {
        return Ok(Column::nulls(ty, rows));
    };
    for piece in pieces {
        let len = piece.len();
        whole
            .extend_from(&piece, 0..len)
            .map_err(|e| ArrowEventsError::Malformed(e.to_string()))?;
    }
    Ok(whole)
}

fn validity(array: &dyn Array) -> Option<Bitmap> {
    array.logical_nulls().map(|nulls| nulls.iter().collect())
}

/// Appends a time column's values to `out` as nanoseconds since the epoch.
fn nanoseconds(array: &dyn Array, time: Time, out: &mut Vec<Timestamp>) -> Result<(), String> {
    let values = match time {
        Time::Nanoseconds => array.as_primitive_opt::<Int64Type>().map(|a| a.values()),
        Time::Timestamp(TimeUnit::Nanosecond) => array
            .as_primitive_opt::<TimestampNanosecondType>()
            .map(|a| a.values()),
        Time::Timestamp(TimeUnit::Microsecond) => array
            .as_primitive_opt::<TimestampMicrosecondType>()
            .map(|a| a.values()),
        Time::Timestamp(TimeUnit::Millisecond) => array
            .as_primitive_opt::<TimestampMillisecondType>()
            .map(|a| a.values()),
        Time::Timestamp(TimeUnit::Second) => array
            .as_primitive_opt::<TimestampSecondType>()
            .map(|a| a.values()),
    };
    let values: &[i64] = values.ok_or_else(|| unlike_schema(array))?;
    let per_unit: i64 = match time {
        Time::Nanoseconds | Time::Timestamp(TimeUnit::Nanosecond) => 1,
        Time::Timestamp(TimeUnit::Microsecond) => 1_000,
        Time::Timestamp(TimeUnit::Millisecond) => 1_000_000,
        Time::Timestamp(TimeUnit::Second) => 1_000_000_000,
    };
    if per_unit == 1 {
        out.extend_from_slice(values);
        return Ok(());
    }
    out.reserve(values.len());
    for (row, &value) in values.iter().enumerate() {
        // A null's slot may hold anything: it must not refuse the batch.
        let ns = match value.checked_mul(per_unit) {
            Some(ns) => ns,
            None if array.is_null(row) => 0,
            None => {
                return Err(format!(
                    "row {row}: {value} is beyond what nanoseconds since the epoch can hold (years 1677 to 2262)"
                ))
            }
        };
        out.push(ns);
    }
    Ok(())
}

/// A record batch whose column is not of its schema's type: Arrow's decoder does not make
/// one, but a refusal costs nothing where a panic would cost the server.
fn unlike_schema(array: &dyn Array) -> String {
    format!(
        "a {} array unlike the stream's schema message",
        array.data_type()
    )
}

/// One Arrow array (of a type [`accepts`] allowed) as a column.
fn column(array: &dyn Array) -> Result<Column, String> {
    fn values<T: ArrowPrimitiveType>(array: &dyn Array) -> Option<Vec<T::Native>> {
        array.as_primitive_opt::<T>().map(|a| a.values().to_vec())
    }
    fn var<T: ByteArrayType>(array: &dyn Array) -> Result<Option<VarBinary>, String> {
        let values = array.as_bytes_opt::<T>();
        values
            .map(|a| var_binary(a.value_offsets(), a.value_data()))
            .transpose()
    }
    let data = match array.data_type() {
        DataType::Boolean => array
            .as_boolean_opt()
            .map(|a| ColumnData::Boolean(a.values().iter().collect())),
        DataType::Int8 => values::<Int8Type>(array).map(ColumnData::Byte),
        DataType::Int16 => values::<Int16Type>(array).map(ColumnData::Short),
        DataType::Int32 => values::<Int32Type>(array).map(ColumnData::Integer),
        DataType::Int64 => values::<Int64Type>(array).map(ColumnData::Long),
        DataType::Float32 => values::<Float32Type>(array).map(ColumnData::Float),
        DataType::Float64 => values::<Float64Type>(array).map(ColumnData::Double),
        DataType::Utf8 => var::<Utf8Type>(array)?.map(ColumnData::String),
        DataType::LargeUtf8 => var::<LargeUtf8Type>(array)?.map(ColumnData::String),
        DataType::Binary => var::<BinaryType>(array)?.map(ColumnData::Bytes),
        DataType::LargeBinary => var::<LargeBinaryType>(array)?.map(ColumnData::Bytes),
        other => return Err(format!("{other} columns are not taken")),
    };
    let data = data.ok_or_else(|| unlike_schema(array))?;
    // Arrow keeps a slot per row; the column keeps the valid rows' values.
    Column::from_dense(data, validity(array)).map_err(|e| e.to_string())
}

/// Arrow's offsets (from wherever the array's slice starts) rebased to 0 as the engine's,
/// with the bytes they span. Arrow checked them against the data when it read the batch.
fn var_binary<O: OffsetSizeTrait>(offsets: &[O], data: &[u8]) -> Result<VarBinary, String> {
    let (Some(first), Some(last)) = (offsets.first(), offsets.last()) else {
        return Ok(VarBinary::with_capacity(0, 0));
    };
    let (first, last) = (first.as_usize(), last.as_usize());
    let rebased = offsets
        .iter()
        .map(|o| {
            let from_first = o
                .as_usize()
                .checked_sub(first)
                .ok_or("offsets going back")?;
            u32::try_from(from_first).map_err(|_| "more than 4 GiB of values in one column")
        })
        .collect::<Result<Vec<u32>, _>>()?;
    let bytes = data.get(first..last).ok_or("offsets beyond the values")?;
    VarBinary::from_parts(rebased, bytes.to_vec()).map_err(|e| e.to_string())
}

#[cfg(test)]
mod tests {
    use arrow_array::{
        ArrayRef, BinaryArray, BooleanArray, DictionaryArray, Float32Array, Float64Array,
        Int16Array, Int32Array, Int64Array, Int8Array, LargeStringArray, NullArray, StringArray,
        TimestampMicrosecondArray, TimestampNanosecondArray, TimestampSecondArray,
    };
    use arrow_ipc::writer::StreamWriter;
    use arrow_schema::Field;
    use tidemark_core::Value;

    use super::*;

    fn ipc(batches: &[RecordBatch]) -> Vec<u8> {
        let mut out = Vec::new();
        let mut writer = StreamWriter::try_new(&mut out, &batches[0].schema()).unwrap();
        for batch in batches {
            writer.write(batch).unwrap();
        }
        writer.finish().unwrap();
        drop(writer);
        out
    }

    fn batch(columns: Vec<(&str, ArrayRef)>) -> RecordBatch {
        RecordBatch::try_from_iter(columns).unwrap()
    }

    fn every_type() -> Arc<Schema> {
        Arc::new(
            Schema::parse_spec(
                "B:BOOLEAN,I8:BYTE,I16:SHORT,I32:INTEGER,I64:LONG,F:FLOAT,D:DOUBLE,S:STRING,X:BYTES",
            )
            .unwrap(),
        )
    }

    fn refusal(body: &[u8], schema: &Arc<Schema>) -> ArrowEventsError {
        match decode_events(body, schema) {
            Ok(batch) => panic!("took {} events", batch.len()),
            Err(e) => e,
        }
    }

    fn every_type_batch() -> RecordBatch {
        batch(vec![
            (
                "tstart",
                Arc::new(TimestampMicrosecondArray::from(vec![1, 2, 3]).with_timezone("+05:00")),
            ),
            (
                "TEND",
                Arc::new(TimestampNanosecondArray::from(vec![
                    Some(5_000),
                    None,
                    Some(3_000),
                ])),
            ),
            (
                "b",
                Arc::new(BooleanArray::from(vec![Some(true), None, Some(false)])),
            ),
            (
                "I8",
                Arc::new(Int8Array::from(vec![Some(-1), Some(127), None])),
            ),
            (
                "I16",
                Arc::new(Int16Array::from(vec![None, Some(300), Some(-300)])),
            ),
            (
                "I32",
                Arc::new(Int32Array::from(vec![Some(-70_000), None, Some(1)])),
            ),
            (
                "I64",
                Arc::new(Int64Array::from(vec![Some(1 << 40), Some(i64::MIN), None])),
            ),
            (
                "F",
                Arc::new(Float32Array::from(vec![
                    Some(1.5),
                    Some(f32::INFINITY),
                    None,
                ])),
            ),
            (
                "D",
                Arc::new(Float64Array::from(vec![Some(f64::NAN), None, Some(-0.0)])),
            ),
            (
                "S",
                Arc::new(LargeStringArray::from(vec![
                    Some("héllo ✓"),
                    Some(""),
                    None,
                ])),
            ),
            (
                "X",
                Arc::new(BinaryArray::from(vec![
                    Some(&[0u8, 255][..]),
                    None,
                    Some(&[][..]),
                ])),
            ),
        ])
    }

    #[test]
    fn every_field_type_with_nulls_arrives_as_sent() {
        let schema = every_type();
        let sent = every_type_batch();
        let got = decode_events(&ipc(&[sent]), &schema).unwrap();
        assert_eq!(got.tstart(), &[1_000, 2_000, 3_000]);
        assert_eq!(got.tend_at(0), Some(5_000));
        assert_eq!(got.tend_at(1), None);
        let mut first = got.row(0);
        // NaN is not equal to itself: checked apart.
        assert!(matches!(first.remove(6), Value::Double(d) if d.is_nan()));
        assert_eq!(
            first,
            vec![
                Value::Boolean(true),
                Value::Byte(-1),
                Value::Null,
                Value::Integer(-70_000),
                Value::Long(1 << 40),
                Value::Float(1.5),
                Value::String("héllo ✓".into()),
                Value::Bytes(vec![0, 255]),
            ]
        );
        assert_eq!(
            got.row(1),
            vec![
                Value::Null,
                Value::Byte(127),
                Value::Short(300),
                Value::Null,
                Value::Long(i64::MIN),
                Value::Float(f32::INFINITY),
                Value::Null,
                Value::String(String::new()),
                Value::Null,
            ]
        );
        assert_eq!(got.row(2)[8], Value::Bytes(vec![]));
        assert_eq!(got.row(2)[7], Value::Null);
    }

    #[test]
    fn fields_without_a_column_are_null_and_batches_join_in_order() {
        let schema = Arc::new(Schema::parse_spec("A:INTEGER,S:STRING,N:DOUBLE").unwrap());
        let piece = |ts: Vec<i64>, a: Vec<i32>, s: Vec<&str>| {
            let rows = ts.len();
            batch(vec![
                ("tstart", Arc::new(Int64Array::from(ts)) as ArrayRef),
                ("s", Arc::new(StringArray::from(s))),
                ("a", Arc::new(Int32Array::from(a))),
                ("n", Arc::new(NullArray::new(rows))),
            ])
        };
        let first = piece(vec![10, 20], vec![1, 2], vec!["x", "y"]);
        let second = piece(vec![5], vec![3], vec!["z"]);
        let got = decode_events(&ipc(&[first, second]), &schema).unwrap();
        assert_eq!(got.tstart(), &[10, 20, 5]);
        assert_eq!(got.tend(), None);
        assert_eq!(
            got.row(2),
            vec![Value::Integer(3), Value::String("z".into()), Value::Null]
        );
        assert_eq!(got.column(2).null_count(), 3);
    }

    #[test]
    fn refusals_name_the_column_and_what_it_should_be() {
        let schema = Arc::new(Schema::parse_spec("PRICE:FLOAT,SYMBOL:STRING").unwrap());
        let ts = || Arc::new(Int64Array::from(vec![1, 2])) as ArrayRef;
        let cases: Vec<(Vec<(&str, ArrayRef)>, &str)> =
            vec![
            (
                vec![("tstart", ts()), ("price", Arc::new(Float64Array::from(vec![1.0, 2.0])))],
                "column \"price\": is Float64; the stream's field PRICE is FLOAT (Arrow Float32)",
            ),
            (
                vec![("tstart", ts()), ("volume", Arc::new(Int32Array::from(vec![1, 2])))],
                "column \"volume\": the stream has no such field",
            ),
            (
                vec![("price", Arc::new(Float32Array::from(vec![1.0, 2.0])))],
                "no \"tstart\" column",
            ),
            (
                vec![("tstart", Arc::new(StringArray::from(vec!["a", "b"])))],
                "column \"tstart\": is Utf8; a time column is a timestamp",
            ),
            (
                vec![("tstart", Arc::new(Int64Array::from(vec![Some(1), None])))],
                "column \"tstart\": 1 nulls",
            ),
            (
                vec![
                    ("tstart", ts()),
                    ("symbol", Arc::new(StringArray::from(vec!["a", "b"]))),
                    ("SYMBOL", Arc::new(StringArray::from(vec!["a", "b"]))),
                ],
                "field SYMBOL is named twice",
            ),
            (
                vec![
                    ("tstart", ts()),
                    (
                        "symbol",
                        Arc::new(DictionaryArray::<arrow_array::types::Int8Type>::from_iter([
                            "a", "a",
                        ])),
                    ),
                ],
                "column \"symbol\": is dictionary-encoded Utf8",
            ),
            (
                vec![
                    ("tstart", Arc::new(TimestampSecondArray::from(vec![1, i64::MAX]))),
                ],
                "row 1: 9223372036854775807 is beyond",
            ),
            (
                vec![("tstart", ts()), ("tend", Arc::new(Int64Array::from(vec![0, 5])))],
                "tend",
            ),
        ];
        for (columns, expected) in cases {
            let error = refusal(&ipc(&[batch(columns)]), &schema).to_string();
            assert!(
                error.contains(expected),
                "{error:?} should say {expected:?}"
            );
        }
    }

    #[test]
    fn bytes_that_are_not_a_whole_ipc_stream_are_refused() {
        let schema = Arc::new(Schema::parse_spec("A:INTEGER").unwrap());
        let good = ipc(&[batch(vec![
            (
                "tstart",
                Arc::new(Int64Array::from(vec![1, 2, 3])) as ArrayRef,
            ),
            ("a", Arc::new(Int32Array::from(vec![1, 2, 3]))),
        ])]);
        assert_eq!(decode_events(&good, &schema).unwrap().len(), 3);
        for body in [&b""[..], b"[{\"tstart\": 1}]", &good[..good.len() / 2]] {
            assert!(matches!(
                refusal(body, &schema),
                ArrowEventsError::Malformed(_)
            ));
        }
        // Every cut and every changed byte is refused or decodes: never a panic.
        let all_types = ipc(&[every_type_batch()]);
        for (body, schema) in [(good, schema), (all_types, every_type())] {
            for at in 0..body.len() {
                let _ = decode_events(&body[..at], &schema);
                for change in [0x01, 0x80, 0xA5, 0xFF] {
                    let mut changed = body.clone();
                    changed[at] ^= change;
                    let _ = decode_events(&changed, &schema);
                }
            }
        }
    }

    #[test]
    fn accepted_types_are_the_sql_types_and_their_large_forms() {
        for ty in FieldType::ALL {
            assert!(accepts(ty, &arrow_type(ty)));
            assert!(accepts(ty, &DataType::Null));
            let others = FieldType::ALL.into_iter().filter(|&other| other != ty);
            for other in others {
                assert!(!accepts(ty, &arrow_type(other)), "{ty} took {other}");
            }
        }
        assert!(accepts(FieldType::String, &DataType::LargeUtf8));
        assert!(!accepts(FieldType::String, &DataType::Utf8View));
        let _ = Field::new("unused", DataType::Null, true);
    }
}
