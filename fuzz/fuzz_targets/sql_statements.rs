//! SQL text as `POST /v1/query` and `tidemark query` run it: parsed, planned and executed
//! against a small stream. Whatever the text, the answer is a table or an error, never a
//! crash (a deep expression once overflowed a worker's stack).
#![no_main]

use std::sync::{Arc, OnceLock};

use libfuzzer_sys::fuzz_target;
use tidemark_core::{BatchBuilder, Schema, Value};
use tidemark_engine::{Db, Options};
use tidemark_query::sql::{run_sql, SqlLimits};

fn db() -> &'static Db {
    static DB: OnceLock<(tempfile::TempDir, Db)> = OnceLock::new();
    &DB.get_or_init(|| {
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
        (dir, db)
    })
    .1
}

fuzz_target!(|data: &[u8]| {
    let Ok(sql) = std::str::from_utf8(data) else {
        return;
    };
    let limits = SqlLimits {
        max_rows: 10_000,
        max_bytes: 1 << 20,
    };
    let _ = run_sql(db(), sql, 100_000_000_000, limits);
});
