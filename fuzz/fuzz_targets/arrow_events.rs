//! An Arrow IPC body as `POST /v1/streams/{s}/events` takes it: any bytes are a batch of the
//! stream's schema or a refusal, never a panic (Arrow's own reader panics on some malformed
//! streams; `tidemark_protocol::arrow` checks every message before it reads them).
//!
//! Random bytes rarely get past a flatbuffer's verification, so most inputs are read as
//! changes to a valid body of every field type instead: (position, xor) pairs applied to it,
//! then a cut. That reaches the schema and batch checks within seconds.
#![no_main]

use std::sync::{Arc, OnceLock};

use arrow_array::{
    ArrayRef, BinaryArray, BooleanArray, Float32Array, Float64Array, Int16Array, Int32Array,
    Int64Array, Int8Array, LargeStringArray, NullArray, RecordBatch, StringArray,
    TimestampMicrosecondArray,
};
use arrow_ipc::writer::StreamWriter;
use libfuzzer_sys::fuzz_target;
use tidemark_core::Schema;
use tidemark_protocol::arrow::decode_events;

fn schema() -> &'static Arc<Schema> {
    static SCHEMA: OnceLock<Arc<Schema>> = OnceLock::new();
    SCHEMA.get_or_init(|| {
        let spec = "B:BOOLEAN,I8:BYTE,I16:SHORT,I32:INTEGER,I64:LONG,F:FLOAT,D:DOUBLE,S:STRING,X:BYTES,N:LONG";
        Arc::new(Schema::parse_spec(spec).expect("a valid spec"))
    })
}

/// Two valid bodies: two record batches of every type, nulls included; two of a large
/// string column.
fn valid_bodies() -> &'static [Vec<u8>; 2] {
    static BODIES: OnceLock<[Vec<u8>; 2]> = OnceLock::new();
    BODIES.get_or_init(|| {
        let batch = RecordBatch::try_from_iter([
            ("tstart", Arc::new(TimestampMicrosecondArray::from(vec![1, 2, 3])) as ArrayRef),
            ("tend", Arc::new(Int64Array::from(vec![Some(5_000), None, Some(9_000)]))),
            ("B", Arc::new(BooleanArray::from(vec![Some(true), None, Some(false)]))),
            ("I8", Arc::new(Int8Array::from(vec![Some(1), None, Some(-1)]))),
            ("I16", Arc::new(Int16Array::from(vec![300, -300, 0]))),
            ("I32", Arc::new(Int32Array::from(vec![None, Some(7), Some(8)]))),
            ("I64", Arc::new(Int64Array::from(vec![i64::MIN, 0, i64::MAX]))),
            ("F", Arc::new(Float32Array::from(vec![1.5, f32::NAN, 0.0]))),
            ("D", Arc::new(Float64Array::from(vec![Some(2.5), None, Some(f64::INFINITY)]))),
            ("S", Arc::new(StringArray::from(vec![Some("héllo"), None, Some("")]))),
            ("X", Arc::new(BinaryArray::from(vec![Some(&b"\x00\xff"[..]), Some(b""), None]))),
            ("N", Arc::new(NullArray::new(3))),
        ])
        .expect("a valid batch");
        let large = RecordBatch::try_from_iter([
            ("tstart", Arc::new(TimestampMicrosecondArray::from(vec![4])) as ArrayRef),
            ("S", Arc::new(LargeStringArray::from(vec!["wide"]))),
        ])
        .expect("a valid batch");
        [batch, large].map(|batch| {
            let mut out = Vec::new();
            let mut writer = StreamWriter::try_new(&mut out, &batch.schema()).expect("a writer");
            writer.write(&batch).expect("written");
            writer.write(&batch).expect("written");
            writer.finish().expect("finished");
            drop(writer);
            out
        })
    })
}

fn check(body: &[u8]) {
    if let Ok(batch) = decode_events(body, schema()) {
        assert_eq!(batch.columns().len(), schema().len());
        assert_eq!(batch.tstart().len(), batch.len());
        assert!(batch.columns().iter().all(|c| c.len() == batch.len()));
    }
}

fuzz_target!(|data: &[u8]| {
    let Some((&mode, rest)) = data.split_first() else {
        return;
    };
    if mode % 4 == 0 {
        check(rest);
        return;
    }
    let [every_type, large] = valid_bodies();
    let mut body = match mode % 4 {
        1 => every_type.clone(),
        2 => large.clone(),
        // Two streams back to back: what follows the first one's end must be refused.
        _ => [every_type.as_slice(), large.as_slice()].concat(),
    };
    let mut changes = rest.chunks_exact(3);
    for change in &mut changes {
        let at = usize::from(u16::from_le_bytes([change[0], change[1]])) % body.len();
        body[at] ^= change[2];
    }
    let cut = changes
        .remainder()
        .first()
        .map_or(0, |&c| usize::from(c) % body.len().min(64));
    check(&body[..body.len() - cut]);
});
