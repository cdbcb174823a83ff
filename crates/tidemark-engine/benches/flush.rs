//! How long a checkpoint takes to write one small segment for each of many streams (the
//! W3 shape: 64 KiB batches spread over 2000 streams leave about one batch per stream in
//! memory when the flush starts), with each segment in a file of its own and with the
//! small segments sharing pack files (the default): `cargo bench -p tidemark-engine --bench
//! flush`.

use std::sync::Arc;
use std::time::{Duration, Instant};

use criterion::{criterion_group, criterion_main, Criterion, Throughput};
use tidemark_core::{BatchBuilder, EventBatch, Schema, Value};
use tidemark_engine::{Db, Options};

const STREAMS: usize = 500;
const EVENTS: usize = 64;
const PAYLOAD: usize = 1024;

fn batch(schema: &Arc<Schema>, round: u64) -> EventBatch {
    let mut b = BatchBuilder::new(schema.clone(), EVENTS);
    for i in 0..EVENTS {
        let tstart = (round as usize * EVENTS + i) as i64;
        let payload = vec![b'A' + (i % 26) as u8; PAYLOAD];
        b.push_row(tstart, None, &[Value::Bytes(payload)])
            .expect("the batch matches its schema");
    }
    b.finish()
}

fn flush_many_streams(c: &mut Criterion) {
    let mut group = c.benchmark_group("flush");
    group.sample_size(10);
    group.measurement_time(Duration::from_secs(20));
    group.throughput(Throughput::Bytes((STREAMS * EVENTS * PAYLOAD) as u64));
    for (layout, pack_below_bytes) in [
        ("own files", 0),
        ("packs", Options::default().pack_below_bytes),
    ] {
        // Flushes only when asked; compaction stays on, as in a server, so every fourth
        // round also merges each stream's segments.
        let options = Options {
            memtable_bytes: 1 << 40,
            max_unflushed_bytes: 1 << 40,
            pack_below_bytes,
            ..Options::default()
        };
        flush_rounds(&mut group, layout, options);
    }
    group.finish();
}

fn flush_rounds(
    group: &mut criterion::BenchmarkGroup<'_, criterion::measurement::WallTime>,
    layout: &str,
    options: Options,
) {
    let dir = tempfile::tempdir().expect("a temporary directory");
    let db = Db::open(dir.path(), options).expect("the database opens");
    let schema = Arc::new(Schema::parse_spec("PAYLOAD:BYTES").expect("a valid spec"));
    let names: Vec<String> = (0..STREAMS).map(|s| format!("s{s}")).collect();
    for name in &names {
        db.create_stream(name, (*schema).clone())
            .expect("the stream is new");
    }
    let mut round = 0;
    let name = format!("{STREAMS} streams, one 64 KiB batch each, {layout}");
    group.bench_function(name, |b| {
        b.iter_custom(|iterations| {
            let mut flushing = Duration::ZERO;
            for _ in 0..iterations {
                round += 1;
                for name in &names {
                    db.append(name, batch(&schema, round))
                        .expect("the append succeeds");
                }
                let started = Instant::now();
                db.flush().expect("the flush succeeds");
                flushing += started.elapsed();
            }
            flushing
        })
    });
}

criterion_group!(benches, flush_many_streams);
criterion_main!(benches);
