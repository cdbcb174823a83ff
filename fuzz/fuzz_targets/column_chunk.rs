//! A column chunk as a segment read hands it to the codecs: first byte picks the type,
//! the next two the row count.
#![no_main]

use libfuzzer_sys::fuzz_target;
use tidemark_core::FieldType;
use tidemark_storage::codec::{decode_column, decode_timestamps};

fuzz_target!(|data: &[u8]| {
    if data.len() < 3 {
        return;
    }
    let ty = FieldType::ALL[data[0] as usize % FieldType::ALL.len()];
    let n = u16::from_le_bytes([data[1], data[2]]) as usize;
    let chunk = &data[3..];
    if let Ok(column) = decode_column(chunk, ty, n) {
        assert_eq!(column.len(), n);
    }
    if let Ok(ts) = decode_timestamps(chunk, n) {
        assert_eq!(ts.len(), n);
    }
});
