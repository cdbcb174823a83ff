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
        // An ACK that decodes encodes back to itself, its positions (and their flag) included.
        if let Ok(ack @ Response::Ack { .. }) = Response::decode(&frame) {
            let mut again = Vec::new();
            ack.encode(frame.request_id, &mut again).unwrap();
            let (frame, _) = decode_frame(&again, 1 << 20).unwrap().unwrap();
            assert_eq!(Response::decode(&frame), Ok(ack));
        }
        rest = &rest[used..];
    }
});
