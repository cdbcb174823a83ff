//! What a PostgreSQL client sends as `COPY ... FROM STDIN` data, in either format and with
//! options chosen by the first bytes: any bytes are rows or a refusal naming a line, never a
//! panic; rows are of equal length and hold no more than was sent.
#![no_main]

use arrow_array::Array;
use libfuzzer_sys::fuzz_target;
use tidemark_protocol::pg_copy::{decode, CopyFormat, CopyOptions};

fuzz_target!(|data: &[u8]| {
    let Some((&[shape, delimiter, quote, escape, columns], rest)) = data.split_first_chunk::<5>()
    else {
        return;
    };
    let format = if shape & 1 == 0 { CopyFormat::Text } else { CopyFormat::Csv };
    let mut options = CopyOptions::new(format);
    options.header = shape & 2 != 0;
    if shape & 4 != 0 {
        options.delimiter = delimiter & 0x7f;
        options.quote = quote & 0x7f;
        options.escape = escape & 0x7f;
    }
    if shape & 8 != 0 {
        options.null = "NULL".into();
    }
    let columns = usize::from(columns % 8) + 1;
    if let Ok(decoded) = decode(rest, &options, columns) {
        assert_eq!(decoded.len(), columns);
        let rows = decoded[0].len();
        assert!(decoded.iter().all(|c| c.len() == rows));
        let bytes: usize = decoded.iter().map(|c| c.value_data().len()).sum();
        assert!(bytes <= rest.len());
    }
});
