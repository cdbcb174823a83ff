//! Bodies of the InfluxDB write routes, as the server decodes them: any text is points or a
//! refusal naming a line of it, never a panic — and exactly what InfluxData's own parser
//! makes of it (`reference`): the same points, or a refusal of the same line.
#![no_main]

use libfuzzer_sys::fuzz_target;
use tidemark_protocol::line_protocol::{decode, reference, Precision};

fuzz_target!(|data: &[u8]| {
    let Ok(body) = std::str::from_utf8(data) else {
        return;
    };
    let lines = body.split('\n').count();
    for precision in [Precision::Nanoseconds, Precision::Hours] {
        let decoded = decode(body, precision, 1);
        match &decoded {
            Ok(points) => {
                assert!(points.len() <= lines);
                for point in points {
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
        let expected = reference::decode(body, precision, 1);
        // NaN never equals itself: compare the points' debug forms.
        assert_eq!(
            format!("{:?}", decoded.map_err(|e| e.line)),
            format!("{:?}", expected.map_err(|e| e.line)),
            "{body:?}"
        );
    }
});
