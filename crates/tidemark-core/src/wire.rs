//! The wire form of an [`EventBatch`]: its columns copied as they are, little-endian, so
//! that encoding and decoding cost a memcpy per column. Log records and the binary
//! protocol both carry batches in this form.
//!
//! ```text
//! batch := u32 n, u32 field count, n × i64 tstart, u8 has tend, [tend column],
//!          field count × column
//! column := u8 type code, u8 validity, [ceil(n/8) bytes validity bitmap], values
//!   validity 0: no nulls, and no bitmap; values for all n rows
//!   validity 1: a bitmap; values for all n rows (the type's default at a null)
//!   validity 2: a bitmap; values for its m valid rows only (the compact form)
//!   fixed-width types: n (or m) × value (BOOLEAN as one byte)
//!   STRING, BYTES: (n + 1) (or m + 1) × u32 offsets, u32 data len, data
//! ```
//!
//! The binary protocol carries the slot-per-row form ([`encode_batch`]), which every
//! client and server reads. Log records and Raft entries carry the compact form
//! ([`encode_batch_compact`]), so that a null costs a bit there as in memory: a request
//! naming one of a thousand fields per event logs its values, not a thousand slots per
//! event. Commands holding it are of command format 4 (`crate::command`), which older
//! builds refuse by its version. Decoding reads all three.
//!
//! Decoding checks everything against the schema the reader already knows (field count,
//! type codes, offsets, bitmap sizes): the bytes are untrusted.

use std::sync::Arc;

use crate::bytes::{put_bytes, put_u32, put_u8, Malformed, Reader, TooLong};
use crate::schema::MAX_FIELDS;
use crate::{Bitmap, Column, ColumnData, EventBatch, FieldType, Schema, VarBinary};

/// Appends the wire form of `batch` to `out`, a slot per row in every column.
pub fn encode_batch(batch: &EventBatch, out: &mut Vec<u8>) -> Result<(), TooLong> {
    encode(batch, Form::SlotPerRow, out)
}

/// Appends the wire form of `batch` to `out`, the columns with nulls in the compact form
/// (values of their valid rows only).
pub fn encode_batch_compact(batch: &EventBatch, out: &mut Vec<u8>) -> Result<(), TooLong> {
    encode(batch, Form::Compact, out)
}

/// The bytes [`encode_batch`] writes for `batch` (a slot per row), without writing them.
pub fn encoded_len(batch: &EventBatch) -> usize {
    let n = batch.len();
    let column = |c: &Column| {
        let validity = c.validity().map_or(0, |_| n.div_ceil(8));
        let values = match c.data() {
            ColumnData::Boolean(_) | ColumnData::Byte(_) => n,
            ColumnData::Short(_) => n * 2,
            ColumnData::Integer(_) | ColumnData::Float(_) => n * 4,
            ColumnData::Long(_) | ColumnData::Double(_) => n * 8,
            ColumnData::String(b) | ColumnData::Bytes(b) => (n + 1) * 4 + 4 + b.data_len(),
        };
        2 + validity + values
    };
    4 + 4
        + n * 8
        + 1
        + batch.tend().map_or(0, column)
        + batch.columns().iter().map(column).sum::<usize>()
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Form {
    SlotPerRow,
    Compact,
}

const NO_NULLS: u8 = 0;
const SLOT_PER_ROW: u8 = 1;
const COMPACT: u8 = 2;

fn encode(batch: &EventBatch, form: Form, out: &mut Vec<u8>) -> Result<(), TooLong> {
    out.reserve(batch.heap_bytes() + 16);
    let n = batch.len();
    put_u32(out, n as u32);
    put_u32(out, batch.columns().len() as u32);
    put_fixed(batch.tstart(), out);
    match batch.tend() {
        None => put_u8(out, 0),
        Some(tend) => {
            put_u8(out, 1);
            put_column(tend, form, out)?;
        }
    }
    for column in batch.columns() {
        put_column(column, form, out)?;
    }
    Ok(())
}

/// Reads one batch of `schema` from `r`, leaving `r` just after it.
pub fn decode_batch<E: Malformed>(
    r: &mut Reader<'_, E>,
    schema: &Arc<Schema>,
) -> Result<EventBatch, E> {
    decode(r, schema, false)
}

/// Like [`decode_batch`], but a batch of fewer fields is read as one built before the
/// fields past its own were added to `schema` (which only ever grows at its end), and
/// widened with nulls: what applying a logged append does, since a schema change may be
/// applied between the check of an append and its turn in the log.
pub fn decode_batch_widened<E: Malformed>(
    r: &mut Reader<'_, E>,
    schema: &Arc<Schema>,
) -> Result<EventBatch, E> {
    decode(r, schema, true)
}

fn decode<E: Malformed>(
    r: &mut Reader<'_, E>,
    schema: &Arc<Schema>,
    narrower_allowed: bool,
) -> Result<EventBatch, E> {
    let n = r.u32()? as usize;
    // Each event takes at least 8 bytes (its tstart), which bounds n by the bytes left.
    if n > r.remaining() / 8 {
        return Err(r.corrupt(format!("{n} events cannot fit in {} bytes", r.remaining())));
    }
    let fields = r.count(MAX_FIELDS, "fields")?;
    let fits = fields == schema.len() || (narrower_allowed && fields < schema.len());
    if !fits {
        return Err(r.corrupt(format!("{fields} fields, the stream has {}", schema.len())));
    }
    let tstart = get_fixed::<i64, E>(r, n)?;
    let tend = match r.u8()? {
        0 => None,
        1 => Some(get_column(r, n, FieldType::Long)?),
        other => return Err(r.corrupt(format!("bad tend flag {other}"))),
    };
    let columns = schema.fields()[..fields]
        .iter()
        .map(|f| get_column(r, n, f.ty))
        .chain(
            schema.fields()[fields..]
                .iter()
                .map(|f| Ok(Column::nulls(f.ty, n))),
        )
        .collect::<Result<Vec<_>, _>>()?;
    EventBatch::new(schema.clone(), tstart, tend, columns).map_err(|e| r.corrupt(e.to_string()))
}

/// Fixed-width values written as little-endian bytes.
trait Fixed: Copy + Default {
    const SIZE: usize;
    fn write(self, dst: &mut [u8]);
    fn read(src: &[u8]) -> Self;
}

macro_rules! fixed {
    ($($t:ty),*) => {$(
        impl Fixed for $t {
            const SIZE: usize = std::mem::size_of::<$t>();
            fn write(self, dst: &mut [u8]) {
                dst.copy_from_slice(&self.to_le_bytes());
            }
            fn read(src: &[u8]) -> Self {
                let mut bytes = [0u8; std::mem::size_of::<$t>()];
                bytes.copy_from_slice(src);
                <$t>::from_le_bytes(bytes)
            }
        }
    )*};
}
fixed!(i8, i16, i32, i64, f32, f64, u32);

impl Fixed for bool {
    const SIZE: usize = 1;
    fn write(self, dst: &mut [u8]) {
        dst[0] = u8::from(self);
    }
    fn read(src: &[u8]) -> Self {
        src[0] != 0
    }
}

fn put_fixed<T: Fixed>(values: &[T], out: &mut Vec<u8>) {
    let start = out.len();
    out.resize(start + values.len() * T::SIZE, 0);
    for (dst, &v) in out[start..].chunks_exact_mut(T::SIZE).zip(values) {
        v.write(dst);
    }
}

fn get_fixed<T: Fixed, E: Malformed>(r: &mut Reader<E>, n: usize) -> Result<Vec<T>, E> {
    let bytes = r.take(
        n.checked_mul(T::SIZE)
            .ok_or_else(|| r.corrupt("count overflows"))?,
    )?;
    Ok(bytes.chunks_exact(T::SIZE).map(T::read).collect())
}

fn put_column(column: &Column, form: Form, out: &mut Vec<u8>) -> Result<(), TooLong> {
    put_u8(out, column.field_type().code());
    let Some(mask) = column.validity() else {
        put_u8(out, NO_NULLS);
        return put_values(column.data(), out);
    };
    match form {
        Form::Compact => {
            put_u8(out, COMPACT);
            mask.write_bytes(out);
            put_values(column.data(), out)
        }
        Form::SlotPerRow => {
            put_u8(out, SLOT_PER_ROW);
            mask.write_bytes(out);
            put_values(column.dense().as_ref(), out)
        }
    }
}

fn put_values(values: &ColumnData, out: &mut Vec<u8>) -> Result<(), TooLong> {
    match values {
        ColumnData::Boolean(v) => put_fixed(v, out),
        ColumnData::Byte(v) => put_fixed(v, out),
        ColumnData::Short(v) => put_fixed(v, out),
        ColumnData::Integer(v) => put_fixed(v, out),
        ColumnData::Long(v) => put_fixed(v, out),
        ColumnData::Float(v) => put_fixed(v, out),
        ColumnData::Double(v) => put_fixed(v, out),
        ColumnData::String(b) | ColumnData::Bytes(b) => {
            put_fixed(b.offsets(), out);
            put_bytes(out, b.data())?;
        }
    }
    Ok(())
}

fn get_column<E: Malformed>(r: &mut Reader<E>, n: usize, ty: FieldType) -> Result<Column, E> {
    let code = r.u8()?;
    if code != ty.code() {
        return Err(r.corrupt(format!("column type code {code}, the schema says {ty}")));
    }
    let form = r.u8()?;
    let validity = match form {
        NO_NULLS => None,
        SLOT_PER_ROW | COMPACT => Some(
            Bitmap::from_bytes(r.take(n.div_ceil(8))?, n).ok_or_else(|| r.corrupt("bad bitmap"))?,
        ),
        other => return Err(r.corrupt(format!("bad validity flag {other}"))),
    };
    // How many values follow: one per row, or (compact) one per valid row.
    let values = match (&validity, form) {
        (Some(mask), COMPACT) => mask.count_ones(),
        _ => n,
    };
    let data = match ty {
        FieldType::Boolean => ColumnData::Boolean(get_fixed(r, values)?),
        FieldType::Byte => ColumnData::Byte(get_fixed(r, values)?),
        FieldType::Short => ColumnData::Short(get_fixed(r, values)?),
        FieldType::Integer => ColumnData::Integer(get_fixed(r, values)?),
        FieldType::Long => ColumnData::Long(get_fixed(r, values)?),
        FieldType::Float => ColumnData::Float(get_fixed(r, values)?),
        FieldType::Double => ColumnData::Double(get_fixed(r, values)?),
        FieldType::String | FieldType::Bytes => {
            let offsets = get_fixed::<u32, E>(r, values + 1)?;
            let data = r.bytes()?.to_vec();
            let values =
                VarBinary::from_parts(offsets, data).map_err(|e| r.corrupt(e.to_string()))?;
            if ty == FieldType::String {
                ColumnData::String(values)
            } else {
                ColumnData::Bytes(values)
            }
        }
    };
    match form {
        COMPACT => Column::new(data, validity),
        _ => Column::from_dense(data, validity),
    }
    .map_err(|e| r.corrupt(e.to_string()))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::{BatchBuilder, Field, Value};

    fn decoded(bytes: &[u8], schema: &Arc<Schema>) -> Result<EventBatch, String> {
        let mut r: Reader<'_, crate::command::CommandError> = Reader::new(bytes, "batch");
        let batch = decode_batch(&mut r, schema).map_err(|e| e.to_string())?;
        r.finish().map_err(|e| e.to_string())?;
        Ok(batch)
    }

    #[test]
    fn the_compact_form_costs_a_bit_per_null_and_reads_as_the_slot_per_row_form() {
        let schema = Arc::new(Schema::parse_spec("A:DOUBLE,B:STRING,C:LONG").unwrap());
        let n = 10_000;
        let mut builder = BatchBuilder::new(schema.clone(), n);
        for i in 0..n {
            // One row in a hundred names A, one in a thousand B; C is never null.
            let a = if i % 100 == 0 {
                Value::Double(i as f64)
            } else {
                Value::Null
            };
            let b = if i % 1000 == 0 {
                Value::String(format!("s{i}"))
            } else {
                Value::Null
            };
            builder
                .push_row(i as i64, None, &[a, b, Value::Long(i as i64)])
                .unwrap();
        }
        let batch = builder.finish();
        let (mut per_row, mut compact) = (Vec::new(), Vec::new());
        encode_batch(&batch, &mut per_row).unwrap();
        encode_batch_compact(&batch, &mut compact).unwrap();
        assert_eq!(encoded_len(&batch), per_row.len());
        assert_eq!(decoded(&per_row, &schema).unwrap(), batch);
        assert_eq!(decoded(&compact, &schema).unwrap(), batch);
        // tstart and C: 16 bytes an event in both; A and B: a bit a null, not a slot.
        let dense_nulls = n * (8 + 4) - (n / 100) * 8 - (n / 1000) * 4;
        assert!(
            per_row.len() - compact.len() >= dense_nulls - 2 * n / 8 - 64,
            "{} vs {}",
            per_row.len(),
            compact.len()
        );
        assert!(
            compact.len() < n * 16 + 2 * (n / 8) + 2_000,
            "{}",
            compact.len()
        );
    }

    #[test]
    fn a_compact_column_must_hold_exactly_its_valid_values() {
        let schema = Arc::new(Schema::parse_spec("A:LONG").unwrap());
        let mut builder = BatchBuilder::new(schema.clone(), 3);
        for (t, v) in [(1, Value::Long(5)), (2, Value::Null), (3, Value::Long(7))] {
            builder.push_row(t, None, &[v]).unwrap();
        }
        let mut bytes = Vec::new();
        encode_batch_compact(&builder.finish(), &mut bytes).unwrap();
        // Two values for the two valid rows; one more or one less is refused.
        let values = bytes.len() - 16;
        let short = &bytes[..values + 8];
        assert!(decoded(short, &schema).is_err());
        let mut long = bytes.clone();
        long.extend_from_slice(&9i64.to_le_bytes());
        assert!(decoded(&long, &schema).is_err());
        // The flag says which form: read as slot-per-row, the values are one short.
        let flag = bytes.len() - 16 - 1 - 1;
        assert_eq!(bytes[flag], COMPACT);
        bytes[flag] = SLOT_PER_ROW;
        assert!(decoded(&bytes, &schema).is_err());
        bytes[flag] = 3;
        assert!(decoded(&bytes, &schema).is_err());
    }

    #[test]
    fn a_batch_of_an_earlier_schema_is_widened_only_where_asked() {
        let old = Arc::new(Schema::parse_spec("A:LONG").unwrap());
        let mut builder = BatchBuilder::new(old.clone(), 2);
        builder.push_row(1, None, &[Value::Long(10)]).unwrap();
        builder.push_row(2, None, &[Value::Long(20)]).unwrap();
        let batch = builder.finish();
        let mut bytes = Vec::new();
        encode_batch(&batch, &mut bytes).unwrap();
        let new = Arc::new(
            old.with_added(&[
                Field::new("B", FieldType::String),
                Field::new("C", FieldType::Double),
            ])
            .unwrap(),
        );
        let mut strict: Reader<'_, crate::command::CommandError> = Reader::new(&bytes, "batch");
        assert!(decode_batch(&mut strict, &new).is_err());
        let mut lenient: Reader<'_, crate::command::CommandError> = Reader::new(&bytes, "batch");
        let widened = decode_batch_widened(&mut lenient, &new).unwrap();
        assert_eq!(widened, batch.clone().widened(new.clone()).unwrap());
        assert_eq!(
            widened.row(1),
            vec![Value::Long(20), Value::Null, Value::Null]
        );
        // Never narrower than the batch: a batch of more fields than the schema is corrupt.
        let mut wider: Reader<'_, crate::command::CommandError> = Reader::new(&bytes, "batch");
        let none = Arc::new(Schema::new(Vec::new()).unwrap());
        assert!(decode_batch_widened(&mut wider, &none).is_err());
    }
}
