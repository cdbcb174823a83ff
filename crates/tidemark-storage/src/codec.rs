//! Compressed encodings of one column of a block ("a chunk").
//!
//! Layout of a chunk (all integers little-endian):
//!
//! ```text
//! u8  encoding      0 EMPTY (no non-null values), 1 PCO, 2 BITS, 3 DICT, 4 VAR
//! u8  validity      0 no nulls, 1 a bitmap of ceil(n/8) bytes follows (bit set = value present),
//!                   2 positions: u32 count, then (count > 0) u32 len + pco(u32 rows with a value)
//! ... bitmap or positions
//! ... payload: only the non-null values, in row order
//!     PCO   u32 len + a pco standalone file of the values (numbers and timestamps)
//!     BITS  packed bits of the values (booleans)
//!     DICT  u32 distinct count, u32 len + pco(u32 value lengths), u32 raw len,
//!           u32 len + lz4(value bytes), u32 len + pco(u32 codes)     (repetitive strings)
//!     VAR   u32 len + pco(u32 value lengths), u32 raw len, u32 len + lz4(value bytes)
//! ```
//!
//! A sparse column (a value in at most one row in [`POSITIONS_BELOW`]) lists the rows that
//! have a value instead of a bit for every row: in a stream of 1,000 fields where each event
//! names one, the bitmaps were 125 bytes per event on disk, the positions are about two.
//!
//! pco is used for every number because it finds delta orders, common multiples and float
//! quantisation by itself; strings are dictionary-coded when at most half of them are
//! distinct (symbols, host names, enum-like labels), else stored as lz4'd bytes.

use pco::standalone::{simple_compress, simple_decompress_into};
use pco::ChunkConfig;
// Fx hashing: dictionary keys are our own data, not an attacker's, and SipHash was a tenth
// of the flush time.
use rustc_hash::FxHashMap;
use tidemark_core::{Bitmap, Column, ColumnData, FieldType, VarBinary};

use crate::bytes::{pack_bits, put_bytes, put_u32, put_u8, unpack_bits, Reader};
use crate::StorageError;

/// A column whose share of rows with a value is below 1 in this lists their positions.
pub const POSITIONS_BELOW: usize = 16;
/// Blocks shorter than this keep a bitmap (at most 16 bytes) whatever the share.
const POSITIONS_MIN_ROWS: usize = 128;

const ALL_VALID: u8 = 0;
const BITMAP: u8 = 1;
const POSITIONS: u8 = 2;

const EMPTY: u8 = 0;
const PCO: u8 = 1;
const BITS: u8 = 2;
const DICT: u8 = 3;
const VAR: u8 = 4;

/// The largest decompressed string payload of one chunk; a bigger claim is corruption.
const MAX_RAW_BYTES: usize = 1 << 30;

/// Encodes `column` as one chunk at pco compression `level` (0–12).
pub fn encode_column(column: &Column, level: usize, out: &mut Vec<u8>) -> Result<(), StorageError> {
    // A column holds the values of its valid rows only: the chunk's payload as it is.
    let present = column.data().len();
    let encoding = if present == 0 {
        EMPTY
    } else {
        match column.data() {
            ColumnData::Boolean(_) => BITS,
            ColumnData::String(_) | ColumnData::Bytes(_) => VAR, // may become DICT below
            _ => PCO,
        }
    };
    let encoding_at = out.len();
    put_u8(out, encoding);
    match column.validity() {
        None => put_u8(out, ALL_VALID),
        Some(mask)
            if mask.len() >= POSITIONS_MIN_ROWS && present * POSITIONS_BELOW < mask.len() =>
        {
            put_u8(out, POSITIONS);
            put_u32(out, present as u32);
            if present > 0 {
                // Rows are u32-indexed (`Bitmap`'s rank); strictly increasing, so pco finds
                // the delta order and stores each gap in a few bits.
                let rows: Vec<u32> = mask.ones(0..mask.len()).map(|row| row as u32).collect();
                put_pco(&rows, level, out)?;
            }
        }
        Some(mask) => {
            put_u8(out, BITMAP);
            mask.write_bytes(out);
        }
    }
    if encoding == EMPTY {
        return Ok(());
    }
    match column.data() {
        ColumnData::Boolean(v) => pack_bits(v, out),
        // pco refuses 8-bit inputs by default; widening costs nothing once compressed.
        ColumnData::Byte(v) => {
            let wide: Vec<i16> = v.iter().map(|&x| i16::from(x)).collect();
            put_pco(&wide, level, out)?
        }
        ColumnData::Short(v) => put_pco(v, level, out)?,
        ColumnData::Integer(v) => put_pco(v, level, out)?,
        ColumnData::Long(v) => put_pco(v, level, out)?,
        ColumnData::Float(v) => put_pco(v, level, out)?,
        ColumnData::Double(v) => put_pco(v, level, out)?,
        ColumnData::String(b) | ColumnData::Bytes(b) => {
            let values: Vec<&[u8]> = (0..b.len()).map(|i| b.get(i)).collect();
            if matches!(column.data(), ColumnData::String(_)) && put_dict(&values, level, out)? {
                out[encoding_at] = DICT;
            } else {
                // The column's buffer already is the concatenation of its present values.
                put_var(b.lengths(), b.data(), level, out)?;
            }
        }
    }
    Ok(())
}

/// Encodes timestamps (never null) as a PCO chunk.
pub fn encode_timestamps(ts: &[i64], level: usize, out: &mut Vec<u8>) -> Result<(), StorageError> {
    put_u8(out, if ts.is_empty() { EMPTY } else { PCO });
    put_u8(out, 0);
    if !ts.is_empty() {
        put_pco(ts, level, out)?;
    }
    Ok(())
}

/// Decodes timestamps written by [`encode_timestamps`]; there must be exactly `n`.
pub fn decode_timestamps(bytes: &[u8], n: usize) -> Result<Vec<i64>, StorageError> {
    let column = decode_column(bytes, FieldType::Long, n)?;
    match (column.validity(), column.data()) {
        (None, ColumnData::Long(v)) => Ok(v.clone()),
        _ => Err(StorageError::corrupt(
            "timestamp chunk",
            "timestamps cannot be null",
        )),
    }
}

/// Decodes a chunk written by [`encode_column`] for a column of type `ty` with `n` rows.
pub fn decode_column(bytes: &[u8], ty: FieldType, n: usize) -> Result<Column, StorageError> {
    let mut r = Reader::new(bytes, "column chunk");
    let encoding = r.u8()?;
    let validity = get_validity(&mut r, n)?;
    let present = validity.as_ref().map_or(n, Bitmap::count_ones);
    let expected = match (present, ty) {
        (0, _) => EMPTY,
        (_, FieldType::Boolean) => BITS,
        (_, FieldType::String) if encoding == DICT => DICT,
        (_, FieldType::String | FieldType::Bytes) => VAR,
        _ => PCO,
    };
    if encoding != expected {
        return Err(r.corrupt(format!(
            "encoding {encoding} for {present} {ty} values, expected {expected}"
        )));
    }
    // The payload is the values of the valid rows: a column's values as they are.
    let data = get_values(&mut r, ty, encoding, present)?;
    r.finish()?;
    Column::new(data, validity).map_err(|e| StorageError::corrupt("column chunk", e.to_string()))
}

/// A chunk's validity for a block of `n` rows: none (all valid), a bitmap, or the rows
/// holding a value.
fn get_validity(r: &mut Reader<'_>, n: usize) -> Result<Option<Bitmap>, StorageError> {
    Ok(match r.u8()? {
        ALL_VALID => None,
        BITMAP => Some(
            Bitmap::from_bytes(r.take(n.div_ceil(8))?, n)
                .ok_or_else(|| r.corrupt("validity bitmap has the wrong size"))?,
        ),
        POSITIONS => {
            let count = r.u32()? as usize;
            if count > n {
                return Err(r.corrupt(format!("{count} positions in a block of {n} rows")));
            }
            let rows: Vec<u32> = get_pco(r, count)?;
            Some(
                Bitmap::from_ones(rows.into_iter().map(|row| row as usize), n)
                    .ok_or_else(|| r.corrupt("positions out of order or past the block"))?,
            )
        }
        other => return Err(r.corrupt(format!("unknown validity flag {other}"))),
    })
}

/// A chunk's `present` values of type `ty`, written with `encoding` (checked by the caller).
fn get_values(
    r: &mut Reader<'_>,
    ty: FieldType,
    encoding: u8,
    present: usize,
) -> Result<ColumnData, StorageError> {
    Ok(match ty {
        FieldType::Boolean => {
            let bits = if present == 0 {
                Vec::new()
            } else {
                unpack_bits(r.take(present.div_ceil(8))?, present)
                    .ok_or_else(|| r.corrupt("boolean bits have the wrong size"))?
            };
            ColumnData::Boolean(bits)
        }
        FieldType::Byte => {
            let wide: Vec<i16> = get_pco(r, present)?;
            let narrow = wide
                .into_iter()
                .map(i8::try_from)
                .collect::<Result<Vec<i8>, _>>()
                .map_err(|_| r.corrupt("BYTE value out of range"))?;
            ColumnData::Byte(narrow)
        }
        FieldType::Short => ColumnData::Short(get_pco(r, present)?),
        FieldType::Integer => ColumnData::Integer(get_pco(r, present)?),
        FieldType::Long => ColumnData::Long(get_pco(r, present)?),
        FieldType::Float => ColumnData::Float(get_pco(r, present)?),
        FieldType::Double => ColumnData::Double(get_pco(r, present)?),
        FieldType::String | FieldType::Bytes => {
            let values = match encoding {
                EMPTY => VarBinary::default(),
                DICT => get_dict(r, present)?,
                _ => get_var(r, present)?,
            };
            if ty == FieldType::String {
                ColumnData::String(values)
            } else {
                ColumnData::Bytes(values)
            }
        }
    })
}

fn put_pco<T: pco::data_types::Number>(
    values: &[T],
    level: usize,
    out: &mut Vec<u8>,
) -> Result<(), StorageError> {
    let config = ChunkConfig::default().with_compression_level(level.min(12));
    let compressed =
        simple_compress(values, &config).map_err(|e| StorageError::Encode(e.to_string()))?;
    put_bytes(out, &compressed)?;
    Ok(())
}

fn get_pco<T: pco::data_types::Number>(r: &mut Reader, n: usize) -> Result<Vec<T>, StorageError> {
    if n == 0 {
        return Ok(Vec::new());
    }
    let bytes = r.bytes()?;
    // Into a buffer of exactly the count we expect: pco's own allocation would trust the
    // count in the (untrusted) pco header, which asked for 32 GiB under fuzzing.
    let mut values = vec![T::default(); n];
    let progress =
        simple_decompress_into(bytes, &mut values).map_err(|e| r.corrupt(format!("pco: {e}")))?;
    if progress.n_processed != n || !progress.finished {
        return Err(r.corrupt(format!(
            "{} values decoded, {n} expected",
            progress.n_processed
        )));
    }
    Ok(values)
}

/// Dictionary-encodes `values` if at most half are distinct; returns whether it did.
fn put_dict(values: &[&[u8]], level: usize, out: &mut Vec<u8>) -> Result<bool, StorageError> {
    let mut ids: FxHashMap<&[u8], u32> = FxHashMap::default();
    let mut dict: Vec<&[u8]> = Vec::new();
    let mut codes = Vec::with_capacity(values.len());
    for &v in values {
        let next = dict.len() as u32;
        let code = *ids.entry(v).or_insert(next);
        if code == next {
            dict.push(v);
            if dict.len() * 2 > values.len() {
                return Ok(false);
            }
        }
        codes.push(code);
    }
    put_u32(out, dict.len() as u32);
    put_var(
        dict.iter().map(|v| v.len() as u32),
        &dict.concat(),
        level,
        out,
    )?;
    put_pco(&codes, level, out)?;
    Ok(true)
}

fn get_dict(r: &mut Reader, n: usize) -> Result<VarBinary, StorageError> {
    let distinct = r.count(n, "dictionary entries")?;
    let dict = get_var(r, distinct)?;
    let codes: Vec<u32> = get_pco(r, n)?;
    // Each entry's (start, end) in the dictionary's bytes, found once per entry.
    let spans: Vec<(usize, usize)> = dict
        .offsets()
        .windows(2)
        .map(|w| (w[0] as usize, w[1] as usize))
        .collect();
    let mut bytes = 0usize;
    for &code in &codes {
        let (start, end) = spans
            .get(code as usize)
            .ok_or_else(|| r.corrupt("dictionary code out of range"))?;
        bytes += end - start;
    }
    if bytes > MAX_RAW_BYTES {
        return Err(r.corrupt("dictionary expands past 1 GiB"));
    }
    // Short values (symbols, tags: the columns dictionaries are for) are copied as one move
    // of WORD bytes each, over a dictionary padded by WORD: a copy of unknown length per
    // value was the largest single cost of decoding such a column (a `SELECT *` profile).
    const WORD: usize = 8;
    let mut padded = Vec::with_capacity(dict.data_len() + WORD);
    padded.extend_from_slice(dict.data());
    padded.extend_from_slice(&[0; WORD]);
    let mut data = vec![0u8; bytes + WORD];
    let mut offsets = Vec::with_capacity(n + 1);
    offsets.push(0u32);
    let mut at = 0;
    for code in codes {
        // Every code was checked above.
        let (start, end) = spans[code as usize];
        let len = end - start;
        if len <= WORD {
            data[at..at + WORD].copy_from_slice(&padded[start..start + WORD]);
        } else {
            data[at..at + len].copy_from_slice(&padded[start..end]);
        }
        at += len;
        // The total is under 1 GiB (checked above), so every offset fits u32.
        offsets.push(at as u32);
    }
    debug_assert_eq!(at, bytes);
    data.truncate(bytes);
    VarBinary::from_parts(offsets, data).map_err(|e| r.corrupt(e.to_string()))
}

/// Value lengths (pco), then the values' concatenation `raw` compressed with lz4 straight
/// into `out` (a chunk of wide values is copied once here, not three times).
fn put_var(
    lengths: impl Iterator<Item = u32>,
    raw: &[u8],
    level: usize,
    out: &mut Vec<u8>,
) -> Result<(), StorageError> {
    let too_long = || StorageError::Encode("chunk over 4 GiB".into());
    let lengths: Vec<u32> = lengths.collect();
    put_pco(&lengths, level, out)?;
    put_u32(out, u32::try_from(raw.len()).map_err(|_| too_long())?);
    // put_bytes's layout (u32 length, bytes), with the length patched in after compressing.
    let length_at = out.len();
    put_u32(out, 0);
    let start = out.len();
    out.resize(
        start + lz4_flex::block::get_maximum_output_size(raw.len()),
        0,
    );
    let written = lz4_flex::block::compress_into(raw, &mut out[start..])
        .map_err(|e| StorageError::Encode(format!("lz4: {e}")))?;
    out.truncate(start + written);
    let written = u32::try_from(written).map_err(|_| too_long())?;
    out[length_at..start].copy_from_slice(&written.to_le_bytes());
    Ok(())
}

fn get_var(r: &mut Reader, n: usize) -> Result<VarBinary, StorageError> {
    let lengths: Vec<u32> = get_pco(r, n)?;
    let raw_len = r.u32()? as usize;
    let compressed = r.bytes()?;
    let total: u64 = lengths.iter().map(|&l| u64::from(l)).sum();
    if raw_len > MAX_RAW_BYTES || total != raw_len as u64 {
        return Err(r.corrupt(format!(
            "value lengths add up to {total}, payload says {raw_len}"
        )));
    }
    // lz4 expands at most ~255-fold: a larger claim is a lie that would size an allocation.
    if raw_len > compressed.len().saturating_mul(255).saturating_add(64) {
        return Err(r.corrupt(format!(
            "{raw_len} bytes cannot come from {} bytes of lz4",
            compressed.len()
        )));
    }
    let raw = lz4_flex::block::decompress(compressed, raw_len)
        .map_err(|e| r.corrupt(format!("lz4: {e}")))?;
    if raw.len() != raw_len {
        return Err(r.corrupt("lz4 payload has the wrong length"));
    }
    let mut offsets = Vec::with_capacity(n + 1);
    offsets.push(0u32);
    let mut end = 0u32;
    for l in lengths {
        end += l;
        offsets.push(end);
    }
    VarBinary::from_parts(offsets, raw).map_err(|e| r.corrupt(e.to_string()))
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;
    use tidemark_core::Value;

    fn round_trip(column: &Column) -> Column {
        let mut out = Vec::new();
        encode_column(column, 4, &mut out).unwrap();
        decode_column(&out, column.field_type(), column.len()).unwrap()
    }

    fn assert_same(a: &Column, b: &Column) {
        assert_eq!(a.len(), b.len());
        for i in 0..a.len() {
            assert!(
                a.value(i).same_as(&b.value(i)),
                "row {i}: {:?} vs {:?}",
                a.value(i),
                b.value(i)
            );
        }
    }

    fn value_strategy(ty: FieldType) -> BoxedStrategy<Value> {
        let v = match ty {
            FieldType::Boolean => any::<bool>().prop_map(Value::Boolean).boxed(),
            FieldType::Byte => any::<i8>().prop_map(Value::Byte).boxed(),
            FieldType::Short => any::<i16>().prop_map(Value::Short).boxed(),
            FieldType::Integer => any::<i32>().prop_map(Value::Integer).boxed(),
            FieldType::Long => prop_oneof![
                Just(i64::MIN),
                Just(i64::MAX),
                Just(0i64),
                any::<i64>(),
                -1000i64..1000
            ]
            .prop_map(Value::Long)
            .boxed(),
            FieldType::Float => prop_oneof![
                Just(f32::NAN),
                Just(f32::INFINITY),
                Just(f32::NEG_INFINITY),
                Just(-0.0f32),
                any::<f32>()
            ]
            .prop_map(Value::Float)
            .boxed(),
            FieldType::Double => prop_oneof![
                Just(f64::NAN),
                Just(-f64::NAN),
                Just(f64::INFINITY),
                Just(f64::NEG_INFINITY),
                Just(-0.0f64),
                any::<f64>(),
                (0u32..100).prop_map(|x| f64::from(x) * 0.25)
            ]
            .prop_map(Value::Double)
            .boxed(),
            FieldType::String => prop_oneof![
                Just(String::new()),
                Just("ÄÖÜ😀漢字".to_string()),
                "[a-c]{0,2}",
                any::<String>()
            ]
            .prop_map(Value::String)
            .boxed(),
            FieldType::Bytes => proptest::collection::vec(any::<u8>(), 0..20)
                .prop_map(Value::Bytes)
                .boxed(),
        };
        prop_oneof![1 => Just(Value::Null), 4 => v].boxed()
    }

    fn column_strategy() -> impl Strategy<Value = Column> {
        (
            proptest::sample::select(FieldType::ALL.to_vec()),
            0usize..300,
            0u8..3,
        )
            .prop_flat_map(|(ty, n, density)| {
                let value = match density {
                    0 => Just(Value::Null).boxed(),
                    // Sparse: few enough values that the chunk lists their positions.
                    1 => prop_oneof![40 => Just(Value::Null), 1 => value_strategy(ty)].boxed(),
                    _ => value_strategy(ty),
                };
                proptest::collection::vec(value, n).prop_map(move |values| {
                    let mut c = Column::empty(ty);
                    for v in &values {
                        c.push_value(v).unwrap();
                    }
                    c
                })
            })
    }

    proptest! {
        #[test]
        fn every_type_round_trips(column in column_strategy()) {
            let back = round_trip(&column);
            assert_same(&column, &back);
            prop_assert_eq!(column.validity(), back.validity());
        }

        #[test]
        fn timestamps_round_trip(ts in proptest::collection::vec(any::<i64>(), 0..500)) {
            let mut out = Vec::new();
            encode_timestamps(&ts, 8, &mut out).unwrap();
            prop_assert_eq!(decode_timestamps(&out, ts.len()).unwrap(), ts);
        }

        #[test]
        fn garbage_never_panics(bytes in proptest::collection::vec(any::<u8>(), 0..200),
                                ty in proptest::sample::select(FieldType::ALL.to_vec()),
                                n in 0usize..50) {
            let _ = decode_column(&bytes, ty, n);
        }
    }

    fn sparse_column(rows: usize, every: usize) -> Column {
        let mut c = Column::empty(FieldType::Double);
        for i in 0..rows {
            if i % every == 3 {
                c.push_value(&Value::Double(1.5)).unwrap();
            } else {
                c.push_null();
            }
        }
        c
    }

    #[test]
    fn a_sparse_column_lists_its_positions_instead_of_a_bit_per_row() {
        let c = sparse_column(65_536, 1000);
        let mut out = Vec::new();
        encode_column(&c, 4, &mut out).unwrap();
        assert_eq!(out[1], POSITIONS);
        // A bitmap alone would be 8 KiB; 66 values and their rows take a few dozen bytes.
        assert!(out.len() < 200, "{} bytes", out.len());
        assert_same(&c, &round_trip(&c));
        // A column with no value in the block costs its count, not a bit per row.
        let mut empty = Column::empty(FieldType::Double);
        (0..65_536).for_each(|_| empty.push_null());
        let mut out = Vec::new();
        encode_column(&empty, 4, &mut out).unwrap();
        assert_eq!((out[0], out[1], out.len()), (EMPTY, POSITIONS, 6));
        assert_same(&empty, &round_trip(&empty));
        // Denser than 1 in POSITIONS_BELOW: the bitmap.
        let dense = sparse_column(4096, 4);
        let mut out = Vec::new();
        encode_column(&dense, 4, &mut out).unwrap();
        assert_eq!(out[1], BITMAP);
    }

    #[test]
    fn positions_that_are_not_rows_of_the_block_are_refused() {
        let chunk = |count: u32, rows: &[u32]| {
            let mut out = vec![PCO, POSITIONS];
            put_u32(&mut out, count);
            put_pco(rows, 4, &mut out).unwrap();
            put_pco(&vec![1.0f64; rows.len()], 4, &mut out).unwrap();
            out
        };
        assert!(decode_column(&chunk(2, &[3, 9]), FieldType::Double, 200).is_ok());
        for (count, rows, what) in [
            (2, &[9u32, 3][..], "out of order"),
            (2, &[3, 3], "repeated"),
            (2, &[3, 200], "past the block"),
            (300, &[3, 9], "more than the rows"),
        ] {
            assert!(
                decode_column(&chunk(count, rows), FieldType::Double, 200).is_err(),
                "{what}"
            );
        }
    }

    #[test]
    fn repetitive_strings_use_a_dictionary() {
        let mut c = Column::empty(FieldType::String);
        for i in 0..10_000 {
            c.push_value(&Value::String(["AAPL", "MSFT", "GOOG"][i % 3].into()))
                .unwrap();
        }
        let mut out = Vec::new();
        encode_column(&c, 4, &mut out).unwrap();
        assert_eq!(out[0], DICT);
        assert!(out.len() < 10_000, "{} bytes for 10k symbols", out.len());
        assert_same(&c, &round_trip(&c));
    }

    #[test]
    fn dictionary_values_of_every_length_around_the_word_round_trip() {
        // get_dict copies values of up to 8 bytes as one 8-byte move: lengths on both
        // sides of it, and the last entry of the dictionary (its padding), must come back.
        let entries = [
            "",
            "a",
            "1234567",
            "12345678",
            "123456789",
            "ü漢字😀 and longer than a word",
        ];
        let mut c = Column::empty(FieldType::String);
        for i in 0..5_000 {
            c.push_value(&Value::String(
                entries[(i * 7 + i / 3) % entries.len()].into(),
            ))
            .unwrap();
        }
        c.push_null();
        let mut out = Vec::new();
        encode_column(&c, 4, &mut out).unwrap();
        assert_eq!(out[0], DICT);
        assert_same(&c, &round_trip(&c));
    }

    #[test]
    fn a_pco_header_cannot_size_the_allocation() {
        // Found by `cargo fuzz run column_chunk`: a pco header claiming 2^32 numbers made
        // the decoder ask for 32 GiB. Decoding must trust only the row count we know.
        let chunk = [
            0x1, 0x0, 0x12, 0x0, 0x0, 0x0, 0x70, 0x63, 0x6f, 0x21, 0x2, 0x66, 0xbe, 0x1, 0x0, 0x46,
            0x1, 0x0, 0x0, 0xe7, 0x0, 0x0, 0x0, 0x0, 0x0,
        ];
        assert!(decode_timestamps(&chunk, 0xed).is_err());
        assert!(decode_column(&chunk, FieldType::Long, 0xed).is_err());
    }

    #[test]
    fn highly_repetitive_strings_still_decode() {
        // The lz4 expansion bound must leave room for what lz4 really achieves.
        let mut c = Column::empty(FieldType::Bytes);
        for _ in 0..64 {
            c.push_value(&Value::Bytes(vec![b'a'; 60_000])).unwrap();
        }
        assert_same(&c, &round_trip(&c));
    }

    #[test]
    fn wrong_row_count_is_refused() {
        let mut c = Column::empty(FieldType::Long);
        for i in 0..10 {
            c.push_value(&Value::Long(i)).unwrap();
        }
        let mut out = Vec::new();
        encode_column(&c, 4, &mut out).unwrap();
        assert!(decode_column(&out, FieldType::Long, 11).is_err());
        assert!(decode_column(&out, FieldType::Double, 10).is_err());
    }
}
