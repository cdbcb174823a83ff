//! Bodies of the InfluxDB write routes, as the server decodes them: any text is points or a
//! refusal naming a line of it, never a panic.
#![no_main]

use libfuzzer_sys::fuzz_target;
use tidemark_protocol::line_protocol::{decode, Precision};

fuzz_target!(|data: &[u8]| {
    let Ok(body) = std::str::from_utf8(data) else {
        return;
    };
    let lines = body.split('\n').count();
    for precision in [Precision::Nanoseconds, Precision::Hours] {
        match decode(body, precision, 1) {
            Ok(points) => {
                assert!(points.len() <= lines);
                for point in &points {
                    assert!(!point.fields.is_empty());
                    for (i, (key, _)) in point.fields.iter().enumerate() {
                        assert!(point.fields[..i].iter().all(|(k, _)| k != key));
                    }
                    for (i, (key, _)) in point.tags.iter().enumerate() {
                        assert!(point.tags[..i].iter().all(|(k, _)| k != key));
                    }
                }
            }
            Err(error) => assert!((1..=lines).contains(&error.line), "{error}"),
        }
    }
});
