//! JSON events as `tidemark put` and the HTTP API decode them: parsed strictly (a key given
//! twice is refused), then decoded against a schema.
#![no_main]

use std::sync::Arc;

use libfuzzer_sys::fuzz_target;
use tidemark_core::json::decode_events;
use tidemark_core::Schema;

fuzz_target!(|data: &[u8]| {
    let schema = Arc::new(
        Schema::parse_spec("SYMBOL:STRING,N:INTEGER,P:FLOAT,B:BOOLEAN,X:BYTES,L:LONG").unwrap(),
    );
    let strict = tidemark_core::json::parse_strict(data);
    // Strict parsing accepts a subset of what serde_json does, and the same values.
    match (&strict, serde_json::from_slice::<serde_json::Value>(data)) {
        (Ok(value), Ok(lenient)) => assert_eq!(value, &lenient),
        (Ok(_), Err(e)) => panic!("strict parsing accepted what serde_json refuses: {e}"),
        (Err(_), _) => {}
    }
    let Ok(value) = strict else {
        return;
    };
    let events = match &value {
        serde_json::Value::Array(items) => items.clone(),
        other => vec![other.clone()],
    };
    if let Ok(batch) = decode_events(&schema, &events) {
        assert_eq!(batch.len(), events.len());
    }
});
