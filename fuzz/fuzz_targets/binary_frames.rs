//! Bytes from a binary-protocol connection, as the server reads them: frames, requests, and
//! the batches inside APPEND requests (checked against a fixed stream schema).
#![no_main]

use std::sync::Arc;

use libfuzzer_sys::fuzz_target;
use tidemark_core::Schema;
use tidemark_protocol::{decode_append_batch, decode_frame, Request, Response};

fuzz_target!(|data: &[u8]| {
    let schema = Arc::new(Schema::parse_spec("SYMBOL:STRING,N:INTEGER,P:DOUBLE,B:BOOLEAN").unwrap());
    let mut rest = data;
    while let Ok(Some((frame, used))) = decode_frame(rest, 1 << 20) {
        assert!(used <= rest.len() && used >= tidemark_protocol::HEADER_LEN);
        if let Ok(Request::Append { schema: spec, batch, .. }) = Request::decode(&frame) {
            if let Ok(decoded) = decode_append_batch(spec, batch, &schema) {
                assert_eq!(decoded.tstart().len(), decoded.len());
            }
        }
        let _ = Response::decode(&frame);
        rest = &rest[used..];
    }
});
