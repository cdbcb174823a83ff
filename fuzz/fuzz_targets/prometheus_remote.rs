//! Bodies of the Prometheus remote write and read routes: any bytes are a message or a
//! refusal, never a panic and never more memory than the limit; a decoded message encodes
//! and decodes again.
#![no_main]

use libfuzzer_sys::fuzz_target;
use tidemark_protocol::prometheus::{decode_read, decode_write, encode, inflated_len};

const LIMIT: usize = 1 << 20;

fuzz_target!(|data: &[u8]| {
    if let Ok(request) = decode_write(data, LIMIT) {
        assert!(inflated_len(data).is_ok_and(|n| n <= LIMIT));
        let again = decode_write(&encode(&request), usize::MAX).expect("re-encoded");
        assert_eq!(again.timeseries.len(), request.timeseries.len());
    }
    if let Ok(request) = decode_read(data, LIMIT) {
        let again = decode_read(&encode(&request), usize::MAX).expect("re-encoded");
        assert_eq!(again, request);
    }
});
