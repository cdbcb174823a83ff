//! An Arrow IPC body as `POST /v1/streams/{s}/events` takes it: any bytes are a batch of the
//! stream's schema or a refusal, never a panic (Arrow's own reader panics on some malformed
//! streams; `tidemark_protocol::arrow` checks every message before it reads them).
#![no_main]

use std::sync::{Arc, OnceLock};

use libfuzzer_sys::fuzz_target;
use tidemark_core::Schema;
use tidemark_protocol::arrow::decode_events;

fn schema() -> &'static Arc<Schema> {
    static SCHEMA: OnceLock<Arc<Schema>> = OnceLock::new();
    SCHEMA.get_or_init(|| {
        let spec = "B:BOOLEAN,I8:BYTE,I16:SHORT,I32:INTEGER,I64:LONG,F:FLOAT,D:DOUBLE,S:STRING,X:BYTES";
        Arc::new(Schema::parse_spec(spec).expect("a valid spec"))
    })
}

fuzz_target!(|data: &[u8]| {
    if let Ok(batch) = decode_events(data, schema()) {
        assert_eq!(batch.columns().len(), schema().len());
        assert_eq!(batch.tstart().len(), batch.len());
        assert!(batch.columns().iter().all(|c| c.len() == batch.len()));
    }
});
