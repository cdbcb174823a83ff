//! Encode and decode speed of the column codecs on one W1-like block of 65,536 events:
//! `cargo bench -p tidemark-storage --bench codecs`.

use criterion::{criterion_group, criterion_main, Criterion, Throughput};
use tidemark_core::{Column, FieldType, Value};
use tidemark_storage::codec::{decode_column, decode_timestamps, encode_column, encode_timestamps};

const N: usize = 65_536;
const LEVEL: usize = 4;

fn columns() -> (Vec<i64>, Vec<Column>) {
    let mut state = 0x2545_f491_4f6c_dd1du64;
    let mut next = move || {
        state ^= state << 13;
        state ^= state >> 7;
        state ^= state << 17;
        state
    };
    let ts: Vec<i64> = (0..N as i64)
        .map(|i| 1_700_000_000_000_000_000 + i * 100_000)
        .collect();
    let symbols = [
        "AAPL", "MSFT", "GOOG", "AMZN", "NVDA", "META", "TSLA", "BRK",
    ];
    let mut symbol = Column::with_capacity(FieldType::String, N);
    let mut kind = Column::with_capacity(FieldType::Integer, N);
    let mut price = Column::with_capacity(FieldType::Float, N);
    let mut p = 100.0f32;
    for _ in 0..N {
        let r = next();
        p = (p + ((r % 21) as f32 - 10.0) * 0.01).max(0.01);
        symbol
            .push_value(&Value::String(
                symbols[(r >> 8) as usize % symbols.len()].into(),
            ))
            .ok();
        kind.push_value(&Value::Integer((r >> 16) as i32 % 8)).ok();
        price
            .push_value(&Value::Float((p * 100.0).round() / 100.0))
            .ok();
    }
    (ts, vec![symbol, kind, price])
}

fn codecs(c: &mut Criterion) {
    let (ts, columns) = columns();
    let mut group = c.benchmark_group("codec");
    group.throughput(Throughput::Elements(N as u64));

    let mut encoded = Vec::new();
    encode_timestamps(&ts, LEVEL, &mut encoded).expect("encode");
    group.bench_function("encode tstart (pco)", |b| {
        b.iter(|| {
            let mut out = Vec::new();
            encode_timestamps(&ts, LEVEL, &mut out).expect("encode");
            out
        })
    });
    group.bench_function("decode tstart (pco)", |b| {
        b.iter(|| decode_timestamps(&encoded, N).expect("decode"))
    });

    for (name, column) in [
        "SYMBOL (dictionary)",
        "SECURITYTYPE (pco)",
        "LASTTRADEPRICE (pco)",
    ]
    .iter()
    .zip(&columns)
    {
        let mut encoded = Vec::new();
        encode_column(column, LEVEL, &mut encoded).expect("encode");
        let ty = column.field_type();
        group.bench_function(format!("encode {name}"), |b| {
            b.iter(|| {
                let mut out = Vec::new();
                encode_column(column, LEVEL, &mut out).expect("encode");
                out
            })
        });
        group.bench_function(format!("decode {name}"), |b| {
            b.iter(|| decode_column(&encoded, ty, N).expect("decode"))
        });
    }
    group.finish();
}

criterion_group!(benches, codecs);
criterion_main!(benches);
