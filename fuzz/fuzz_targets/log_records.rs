//! Log bytes as recovery reads them: frames, then records, then append bodies.
#![no_main]

use std::sync::Arc;

use libfuzzer_sys::fuzz_target;
use tidemark_core::Schema;
use tidemark_storage::log::read_frames;
use tidemark_storage::record::{decode_append, Record};

fuzz_target!(|data: &[u8]| {
    let schema =
        Arc::new(Schema::parse_spec("S:STRING,I:INTEGER,F:DOUBLE,B:BOOLEAN,X:BYTES").unwrap());
    // Frames (with checksums) at LSN 0, and the bytes taken directly as record payloads so
    // that the record decoders are reached without forging a CRC.
    let (frames, _) = read_frames(data, 0);
    for payload in frames.iter().map(|f| f.1).chain([data]) {
        if let Ok(Record::Append { body, .. }) = Record::decode(payload) {
            let _ = decode_append(body, &schema);
        }
    }
});
