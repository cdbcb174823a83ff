//! Streams as Arrow: the table schema SQL sees for a stream, and event batches as record
//! batches of it.
//!
//! Every stream is a table with `tstart` (a UTC timestamp in nanoseconds, never null),
//! `tend` (the same, null where an event has no end) and one nullable column per field.

use std::sync::Arc;

use datafusion::arrow::array::{
    ArrayRef, BinaryArray, BooleanArray, Float32Array, Float64Array, Int16Array, Int32Array,
    Int64Array, Int8Array, RecordBatch, RecordBatchOptions, StringArray, TimestampNanosecondArray,
};
use datafusion::arrow::buffer::{BooleanBuffer, Buffer, NullBuffer, OffsetBuffer, ScalarBuffer};
use datafusion::arrow::datatypes::{DataType, Field, Schema as ArrowSchema, SchemaRef, TimeUnit};
use datafusion::arrow::error::ArrowError;
use tidemark_core::{Bitmap, Column, ColumnData, EventBatch, Schema, VarBinary};

/// The start of an event: the column every time range is about.
pub const TSTART: &str = "tstart";
/// The end of an event, where it has one.
pub const TEND: &str = "tend";

/// The SQL type of `tstart` and `tend`.
pub fn time_type() -> DataType {
    DataType::Timestamp(TimeUnit::Nanosecond, Some("UTC".into()))
}

/// The Arrow type of a field: the one Arrow appends are sent in, so answers and appends
/// agree (`tidemark_protocol::arrow`).
pub use tidemark_protocol::arrow::arrow_type;

/// The table a stream of `schema` is: `tstart`, `tend`, then its fields in order.
pub fn table_schema(schema: &Schema) -> SchemaRef {
    let times = [
        Field::new(TSTART, time_type(), false),
        Field::new(TEND, time_type(), true),
    ];
    let fields = schema
        .fields()
        .iter()
        .map(|f| Field::new(&f.name, arrow_type(f.ty), true));
    Arc::new(ArrowSchema::new(
        times.into_iter().chain(fields).collect::<Vec<_>>(),
    ))
}

/// `batch` as a record batch of `schema`, a projection of its stream's table: each column
/// is found in `batch` by name (the scan asked for exactly these fields). Columns without
/// nulls and null masks move into Arrow buffers; a column with nulls is spread to a slot per
/// row (it holds its valid rows' values only), and booleans (packed to bits) and string
/// offsets (u32 to i32) are rebuilt.
pub fn to_record_batch(batch: EventBatch, schema: &SchemaRef) -> Result<RecordBatch, ArrowError> {
    let rows = batch.len();
    let (batch_schema, tstart, tend, columns) = batch.into_parts();
    let mut tstart = Some(tstart);
    let mut tend = Some(tend);
    let mut columns: Vec<Option<Column>> = columns.into_iter().map(Some).collect();
    let arrays = schema
        .fields()
        .iter()
        .map(|field| match field.name().as_str() {
            TSTART => {
                let ts = tstart.take().ok_or_else(|| twice(TSTART))?;
                Ok(Arc::new(
                    TimestampNanosecondArray::new(ScalarBuffer::from(ts), None)
                        .with_timezone("UTC"),
                ) as ArrayRef)
            }
            TEND => match tend.take().ok_or_else(|| twice(TEND))? {
                Some(tend) => {
                    let (ColumnData::Long(ends), valid) = tend.into_dense() else {
                        return Err(ArrowError::SchemaError("tend is not a LONG column".into()));
                    };
                    Ok(Arc::new(
                        TimestampNanosecondArray::new(ScalarBuffer::from(ends), nulls(valid))
                            .with_timezone("UTC"),
                    ) as ArrayRef)
                }
                None => Ok(
                    Arc::new(TimestampNanosecondArray::new_null(rows).with_timezone("UTC"))
                        as ArrayRef,
                ),
            },
            name => {
                let column = batch_schema
                    .index_of(name)
                    .and_then(|index| columns[index].take())
                    .ok_or_else(|| {
                        ArrowError::SchemaError(format!("the scan returned no field {name:?}"))
                    })?;
                to_array(column)
            }
        })
        .collect::<Result<Vec<_>, _>>()?;
    RecordBatch::try_new_with_options(
        schema.clone(),
        arrays,
        &RecordBatchOptions::new().with_row_count(Some(rows)),
    )
}

fn twice(name: &str) -> ArrowError {
    ArrowError::SchemaError(format!("{name} is twice in a scan's schema"))
}

/// The validity as Arrow's null buffer: the bitmap's words are that buffer's layout (least
/// significant bit first, set = valid), so they move rather than being repacked.
fn nulls(validity: Option<Bitmap>) -> Option<NullBuffer> {
    validity.map(|mask| {
        let (words, len) = mask.into_words();
        NullBuffer::new(BooleanBuffer::new(Buffer::from_vec(words), 0, len))
    })
}

/// One column as an Arrow array of [`arrow_type`] of its field type.
pub fn to_array(column: Column) -> Result<ArrayRef, ArrowError> {
    // Arrow keeps a slot per row: the values are spread over the rows here, a column at a
    // time.
    let (data, validity) = column.into_dense();
    let nulls = nulls(validity);
    Ok(match data {
        ColumnData::Boolean(v) => Arc::new(BooleanArray::new(BooleanBuffer::from(v), nulls)),
        ColumnData::Byte(v) => Arc::new(Int8Array::new(ScalarBuffer::from(v), nulls)),
        ColumnData::Short(v) => Arc::new(Int16Array::new(ScalarBuffer::from(v), nulls)),
        ColumnData::Integer(v) => Arc::new(Int32Array::new(ScalarBuffer::from(v), nulls)),
        ColumnData::Long(v) => Arc::new(Int64Array::new(ScalarBuffer::from(v), nulls)),
        ColumnData::Float(v) => Arc::new(Float32Array::new(ScalarBuffer::from(v), nulls)),
        ColumnData::Double(v) => Arc::new(Float64Array::new(ScalarBuffer::from(v), nulls)),
        ColumnData::String(v) => {
            let (offsets, data) = var_parts(v)?;
            debug_assert!(std::str::from_utf8(data.as_slice()).is_ok());
            // SAFETY: a column's STRING values are UTF-8 split at character boundaries —
            // `Column::new` refuses anything else, and every other way of building a column
            // pushes whole `&str`s or copies values of such a column — and `var_parts`'
            // offsets are checked to lie within `data`. Checking the text again here cost
            // ~3% of a `SELECT *` (issue 25's read path).
            Arc::new(unsafe { StringArray::new_unchecked(offsets, data, nulls) })
        }
        ColumnData::Bytes(v) => {
            let (offsets, data) = var_parts(v)?;
            Arc::new(BinaryArray::try_new(offsets, data, nulls)?)
        }
    })
}

/// The offsets and bytes of `values` as Arrow's, the offsets checked to run from 0 up to
/// the end of the bytes (`OffsetBuffer::new` and the comparison below).
fn var_parts(values: VarBinary) -> Result<(OffsetBuffer<i32>, Buffer), ArrowError> {
    let (offsets, data) = values.into_parts();
    // VarBinary keeps its offsets starting at 0 and non-decreasing: the last is the largest.
    let end = offsets.last().copied().unwrap_or(0);
    if i32::try_from(end).is_err() {
        return Err(ArrowError::ComputeError(
            "more than 2 GiB of strings in one batch".into(),
        ));
    }
    // Reuses the allocation (u32 and i32 have one layout); every offset fits, as `end` does.
    let offsets: Vec<i32> = offsets.into_iter().map(|o| o as i32).collect();
    if end as usize != data.len() {
        return Err(ArrowError::ComputeError(format!(
            "string offsets end at {end} of {} bytes",
            data.len()
        )));
    }
    // Panics on negative or decreasing offsets, which VarBinary never holds.
    let offsets = OffsetBuffer::new(ScalarBuffer::from(offsets));
    Ok((offsets, Buffer::from_vec(data)))
}

#[cfg(test)]
mod tests {
    use datafusion::arrow::array::Array;
    use tidemark_core::{BatchBuilder, Value};

    use super::*;

    #[test]
    fn every_field_type_and_null_survives_the_conversion() {
        let schema = Arc::new(
            Schema::parse_spec("B:BOOLEAN,I8:BYTE,I16:SHORT,I32:INTEGER,I64:LONG,F:FLOAT,D:DOUBLE,S:STRING,X:BYTES")
                .unwrap(),
        );
        let mut builder = BatchBuilder::new(schema.clone(), 2);
        let row = [
            Value::Boolean(true),
            Value::Byte(-1),
            Value::Short(300),
            Value::Integer(-70_000),
            Value::Long(1 << 40),
            Value::Float(1.5),
            Value::Double(f64::NAN),
            Value::String("héllo".into()),
            Value::Bytes(vec![0, 255]),
        ];
        builder.push_row(5, Some(9), &row).unwrap();
        builder.push_row(7, None, &vec![Value::Null; 9]).unwrap();
        let batch = builder.finish();
        let table = table_schema(&schema);
        let record = to_record_batch(batch, &table).unwrap();
        assert_eq!(record.num_rows(), 2);
        assert_eq!(record.num_columns(), 11);
        for (i, value) in row.iter().enumerate() {
            let column = record.column(i + 2);
            assert_eq!(column.data_type(), table.field(i + 2).data_type());
            assert!(column.is_valid(0), "{value:?}");
            assert!(column.is_null(1), "null of {value:?}");
        }
        let tend = record.column(1);
        assert!(tend.is_valid(0) && tend.is_null(1));
        let strings = record
            .column(9)
            .as_any()
            .downcast_ref::<StringArray>()
            .unwrap();
        assert_eq!(strings.value(0), "héllo");
    }

    #[test]
    fn a_projection_without_columns_keeps_the_row_count() {
        let schema = Arc::new(Schema::parse_spec("V:LONG").unwrap());
        let mut builder = BatchBuilder::new(schema.clone(), 3);
        for ts in 0..3 {
            builder.push_row(ts, None, &[Value::Long(ts)]).unwrap();
        }
        let empty = Arc::new(table_schema(&schema).project(&[]).unwrap());
        let record = to_record_batch(builder.finish(), &empty).unwrap();
        assert_eq!((record.num_rows(), record.num_columns()), (3, 0));
    }
}
