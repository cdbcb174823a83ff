//! The fixed cost of a small SQL query: W2's "max of one series in 1-minute buckets over the
//! last hour" over a stream of a flushed hour (3,600 events), end to end through
//! `tidemark_sql::query` (parse, resolve, plan, the summary aggregate, collect). The engine
//! answers from summaries in microseconds, so what this measures is the SQL layer's own
//! overhead: `cargo bench -p tidemark-sql --bench small_query`. `plain plan` is the same
//! query with the summary rule off (DataFusion's aggregate over a scan); `planned before`
//! takes the statement's plan from a [`PlanCache`], as the server does for repeated text.

use criterion::{criterion_group, criterion_main, Criterion};
use futures::StreamExt;
use tidemark_core::{BatchBuilder, Schema, Value};
use tidemark_engine::{Db, Options};
use tidemark_sql::{PlanCache, SqlOptions};

const SQL: &str = "SELECT time_bucket('1 minute', ts) AS bucket, max(\"cpu\") FROM host \
                   WHERE ts >= now() - INTERVAL '1 hour' GROUP BY bucket";

fn small_query(c: &mut Criterion) {
    let dir = tempfile::tempdir().expect("a temporary directory");
    let db = Db::open(dir.path(), Options::default()).expect("a database");
    let schema = Schema::parse_spec("cpu:DOUBLE").expect("a schema");
    db.create_stream("host", schema.clone()).expect("a stream");
    let now = tidemark_core::time::now_ns();
    let mut batch = BatchBuilder::new(schema.into(), 3600);
    for i in 0..3600i64 {
        let ts = now - (3600 - i) * 1_000_000_000;
        batch
            .push_row(ts, None, &[Value::Double((i % 100) as f64)])
            .expect("an event");
    }
    db.append("host", batch.finish()).expect("an append");
    db.flush().expect("a flush");
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .expect("a runtime");
    let plans = PlanCache::new(16);
    let run = |options: SqlOptions, cache: Option<&PlanCache>| {
        runtime.block_on(async {
            let mut batches = match cache {
                Some(plans) => tidemark_sql::query_with(plans, &db, SQL, options).await,
                None => tidemark_sql::query(&db, SQL, options).await,
            }
            .expect("planned");
            let mut rows = 0;
            while let Some(batch) = batches.next().await {
                rows += batch.expect("a batch").num_rows();
            }
            assert!(rows >= 60, "an hour of minutes");
        })
    };
    let mut group = c.benchmark_group("w2 one series, one hour");
    group.bench_function("summaries", |b| b.iter(|| run(SqlOptions::default(), None)));
    group.bench_function("summaries, planned before", |b| {
        b.iter(|| run(SqlOptions::default(), Some(&plans)))
    });
    group.bench_function("plain plan", |b| {
        b.iter(|| {
            run(
                SqlOptions {
                    summaries: false,
                    ..SqlOptions::default()
                },
                None,
            )
        })
    });
    group.finish();
}

criterion_group!(benches, small_query);
criterion_main!(benches);
