//! Bodies of the Prometheus remote write and read routes: any bytes are a message or a
//! refusal, never a panic and never more memory than the limit; a decoded message encodes
//! and decodes again.
#![no_main]

use libfuzzer_sys::fuzz_target;
use tidemark_protocol::prometheus::{
    decode_read, decode_write, decode_write_inflated, encode, inflate, inflated_len,
    write_request_bytes, TimeSeries,
};

const LIMIT: usize = 1 << 20;

fuzz_target!(|data: &[u8]| {
    // What a server admits before decoding: walked without a panic, and whatever bytes the
    // request inflates to, as raw protobuf too.
    for bytes in [inflate(data, LIMIT).ok(), Some(data.to_vec())]
        .into_iter()
        .flatten()
    {
        let walked = write_request_bytes(&bytes);
        if let (Ok(request), Ok(admitted)) = (decode_write_inflated(&bytes), walked) {
            let series = request.timeseries.len() * std::mem::size_of::<TimeSeries>();
            assert!(
                admitted >= series,
                "{admitted} admitted for {series} bytes of series"
            );
        }
    }
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
