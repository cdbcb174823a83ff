//! Log bytes as recovery reads them: frames, then commands (and the records of log format
//! 1, read once to upgrade), then append bodies.
#![no_main]

use std::sync::Arc;

use libfuzzer_sys::fuzz_target;
use tidemark_core::command::{self, Command};
use tidemark_core::Schema;
use tidemark_storage::bytes::Reader;
use tidemark_storage::legacy_record::Record;
use tidemark_storage::log::read_frames;

fuzz_target!(|data: &[u8]| {
    let schema =
        Arc::new(Schema::parse_spec("S:STRING,I:INTEGER,F:DOUBLE,B:BOOLEAN,X:BYTES").unwrap());
    let decode_batch = |body: &[u8]| {
        let mut r = Reader::new(body, "batch");
        let _ = tidemark_core::wire::decode_batch(&mut r, &schema);
    };
    // Frames (with checksums) at LSN 0, and the bytes taken directly as payloads so that
    // the decoders are reached without forging a CRC.
    let (frames, _) = read_frames(data, 0);
    for payload in frames.iter().map(|f| f.1).chain([data]) {
        if let Ok(Command::Append { batch, .. }) = command::decode(payload) {
            decode_batch(batch);
        }
        if let Ok(Record::Append { body, .. }) = Record::decode(payload) {
            decode_batch(body);
        }
    }
});
