//! SQL text as `POST /v1/query` and `tidemark query` run it: parsed, planned by DataFusion
//! and executed against a small stream. Whatever the text, the answer is batches or an
//! error, never a crash (a deep expression once overflowed a worker's stack).
#![no_main]

use std::sync::{Arc, OnceLock};

use futures::StreamExt;
use libfuzzer_sys::fuzz_target;
use tidemark_core::{BatchBuilder, Schema, Value};
use tidemark_engine::{Db, Options};
use tidemark_sql::SqlOptions;

struct Fixture {
    _dir: tempfile::TempDir,
    db: Db,
    runtime: tokio::runtime::Runtime,
}

fn fixture() -> &'static Fixture {
    static FIXTURE: OnceLock<Fixture> = OnceLock::new();
    FIXTURE.get_or_init(|| {
        let dir = tempfile::tempdir().unwrap();
        let db = Db::open(dir.path(), Options::default()).unwrap();
        let schema = Arc::new(Schema::parse_spec("S:STRING,I:LONG,F:DOUBLE,B:BYTES").unwrap());
        db.create_stream("t", (*schema).clone()).unwrap();
        let mut batch = BatchBuilder::new(schema, 64);
        for i in 0..64i64 {
            let values = [
                Value::String(format!("s{}", i % 5)),
                if i % 7 == 0 { Value::Null } else { Value::Long(i) },
                Value::Double(i as f64 / 3.0),
                Value::Bytes(vec![i as u8]),
            ];
            batch.push_row(i * 1_000_000_000, None, &values).unwrap();
        }
        db.append("t", batch.finish()).unwrap();
        let runtime = tokio::runtime::Builder::new_multi_thread()
            .worker_threads(1)
            .enable_all()
            .build()
            .unwrap();
        Fixture {
            _dir: dir,
            db,
            runtime,
        }
    })
}

fuzz_target!(|data: &[u8]| {
    let Ok(sql) = std::str::from_utf8(data) else {
        return;
    };
    let fixture = fixture();
    let options = SqlOptions {
        memory_bytes: 16 << 20,
        ..SqlOptions::default()
    };
    fixture.runtime.block_on(async {
        if let Ok(mut batches) = tidemark_sql::query(&fixture.db, sql, options).await {
            // A cross join can be asked to produce more rows than any test could wait for:
            // a few batches are enough to run every operator.
            for _ in 0..16 {
                match batches.next().await {
                    Some(Ok(_)) => {}
                    _ => break,
                }
            }
        }
    });
});
