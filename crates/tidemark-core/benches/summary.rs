//! Summarising one W1-like batch of 65,536 events (a STRING symbol, an INTEGER and a FLOAT
//! field, a tenth of the floats null): every append does it on every replica without the
//! STRING's bounds ("appended"), a flush keeps them ("flushed"). The typed pass of
//! `FieldSummary::of_rows` next to adding the rows one by one (`FieldSummary::add_row`),
//! which gives the same answer: `cargo bench -p tidemark-core --bench summary`.

use criterion::{criterion_group, criterion_main, Criterion, Throughput};
use tidemark_core::{Bounds, Column, FieldSummary, FieldType, Value};

const N: usize = 65_536;

fn columns() -> (Vec<i64>, Vec<Column>) {
    let mut rng = fastrand::Rng::with_seed(0x2545_f491_4f6c_dd1d);
    let tstart: Vec<i64> = (0..N as i64)
        .map(|i| 1_700_000_000_000_000 + i * 100)
        .collect();
    const SYMBOLS: [&str; 8] = [
        "AAPL", "MSFT", "GOOG", "AMZN", "NVDA", "META", "TSLA", "BRK",
    ];
    let mut symbol = Column::with_capacity(FieldType::String, N);
    let mut kind = Column::with_capacity(FieldType::Integer, N);
    let mut price = Column::with_capacity(FieldType::Float, N);
    for _ in 0..N {
        let r = rng.u64(..);
        symbol
            .push_value(&Value::String(SYMBOLS[(r % 8) as usize].into()))
            .expect("a STRING");
        kind.push_value(&Value::Integer((r % 8) as i32))
            .expect("an INTEGER");
        let value = if r.is_multiple_of(10) {
            Value::Null
        } else {
            Value::Float((r >> 40) as f32 / 100.0)
        };
        price.push_value(&value).expect("a FLOAT");
    }
    (tstart, vec![symbol, kind, price])
}

fn summarise(c: &mut Criterion) {
    let (tstart, columns) = columns();
    let mut group = c.benchmark_group("summary");
    group.throughput(Throughput::Elements(N as u64));
    for (name, bounds) in [("appended", Bounds::Skipped), ("flushed", Bounds::Kept)] {
        group.bench_function(format!("of_rows (typed pass, {name})"), |b| {
            b.iter(|| {
                columns
                    .iter()
                    .map(|c| FieldSummary::of_rows(c, &tstart, 0..N, bounds))
                    .collect::<Vec<_>>()
            })
        });
    }
    group.bench_function("add_row (row by row)", |b| {
        b.iter(|| {
            columns
                .iter()
                .map(|c| {
                    let mut s = FieldSummary::default();
                    for (row, &ts) in tstart.iter().enumerate() {
                        s.add_row(c, row, ts, Bounds::Kept);
                    }
                    s
                })
                .collect::<Vec<_>>()
        })
    });
    group.finish();
}

criterion_group!(benches, summarise);
criterion_main!(benches);
