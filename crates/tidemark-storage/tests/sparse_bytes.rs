//! Issue 42: columns hold only the values of their valid rows in memory, and nothing of that
//! may show in the bytes they are written as. The wire form of a batch with nulls and each
//! of its columns' segment chunks are pinned to the bytes the slot-per-row columns wrote
//! (`golden/`, written by this test on the code before the change with
//! `TIDEMARK_WRITE_GOLDEN=1`). `chunks.hex` was written again when a chunk of a sparse
//! column (NONE, RARE and LATE below) began to list its rows instead of a bitmap (segment
//! version 3); the other columns' chunks kept their bytes.

use std::path::PathBuf;
use std::sync::Arc;

use tidemark_core::wire::encode_batch;
use tidemark_core::{BatchBuilder, EventBatch, FieldType, Schema, Value};
use tidemark_storage::codec::encode_column;

/// 150 events over every type: columns always, never, rarely and often null, across the
/// 64-bit words of a bitmap, with a `tend` that is sometimes absent.
fn batch() -> EventBatch {
    let schema = Arc::new(
        Schema::parse_spec(
            "B:BOOLEAN,I8:BYTE,I16:SHORT,I32:INTEGER,I64:LONG,F:FLOAT,D:DOUBLE,S:STRING,X:BYTES,\
             FULL:LONG,NONE:DOUBLE,RARE:STRING",
        )
        .unwrap(),
    );
    let mut builder = BatchBuilder::new(schema, 150);
    let mut seed = 0x2545_f491_4f6c_dd1du64;
    for row in 0..150i64 {
        seed ^= seed << 13;
        seed ^= seed >> 7;
        seed ^= seed << 17;
        let present = |bit: u32| seed >> bit & 3 != 0;
        let v = (seed >> 20) as i64;
        let pick = |bit: u32, value: Value| if present(bit) { value } else { Value::Null };
        let values = vec![
            pick(0, Value::Boolean(v % 2 == 0)),
            pick(2, Value::Byte(v as i8)),
            pick(4, Value::Short(v as i16)),
            pick(6, Value::Integer(v as i32)),
            pick(8, Value::Long(v)),
            pick(10, Value::Float(v as f32 / 7.0)),
            pick(12, Value::Double(v as f64 / 3.0)),
            pick(14, Value::String(format!("host-{}", v % 5))),
            pick(16, Value::Bytes(vec![v as u8; (v % 4) as usize])),
            Value::Long(row),
            Value::Null,
            if row % 67 == 3 {
                Value::String(format!("rare {row}"))
            } else {
                Value::Null
            },
        ];
        let tend = present(18).then_some(row * 10 + 5);
        builder.push_row(row * 10, tend, &values).unwrap();
    }
    builder.finish()
}

fn golden(name: &str, bytes: &[u8]) {
    let path = PathBuf::from(env!("CARGO_MANIFEST_DIR"))
        .join("tests/golden")
        .join(name);
    let hex: String = bytes.iter().map(|b| format!("{b:02x}")).collect();
    if std::env::var_os("TIDEMARK_WRITE_GOLDEN").is_some() {
        std::fs::write(&path, &hex).unwrap();
    }
    let want = std::fs::read_to_string(&path).unwrap();
    assert!(hex == want.trim(), "{name}: the bytes changed");
}

#[test]
fn a_batch_with_nulls_is_written_as_before() {
    let batch = batch();
    let mut wire = Vec::new();
    encode_batch(&batch, &mut wire).unwrap();
    golden("wire.hex", &wire);
    let widened = batch
        .clone()
        .widened(Arc::new(
            batch
                .schema()
                .with_added(&[tidemark_core::Field::new("LATE", FieldType::Integer)])
                .unwrap(),
        ))
        .unwrap();
    let mut wire = Vec::new();
    encode_batch(&widened, &mut wire).unwrap();
    golden("wire-widened.hex", &wire);

    let mut chunks = Vec::new();
    for column in widened.columns().iter().chain(widened.tend()) {
        encode_column(column, 3, &mut chunks).unwrap();
    }
    golden("chunks.hex", &chunks);
}
