//! What a Graphite connection sends, line by line as the server splits it: any bytes are a
//! metric, a refusal, or a blank line, never a panic; a metric holds what a line can say.
#![no_main]

use libfuzzer_sys::fuzz_target;
use tidemark_protocol::graphite::{decode_line, MAX_LINE_BYTES};

fuzz_target!(|data: &[u8]| {
    for line in data.split(|&b| b == b'\n') {
        let Some(Ok(metric)) = decode_line(line, 7) else {
            continue;
        };
        assert!(line.len() <= MAX_LINE_BYTES);
        assert!(!metric.path.is_empty());
        assert!(!metric.path.contains(|c: char| c.is_ascii_whitespace() || c == ';'));
        for (i, (tag, value)) in metric.tags.iter().enumerate() {
            assert!(!tag.is_empty() && !value.is_empty());
            assert!(metric.tags[..i].iter().all(|(earlier, _)| earlier != tag));
        }
    }
});
