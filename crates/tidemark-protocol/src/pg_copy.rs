//! The rows of PostgreSQL's `COPY ... FROM STDIN`, as `psql`'s `\copy` and drivers send
//! them: its `text` format (tab-separated, `\N` for null, backslash escapes) and its `csv`
//! format, decoded into one Arrow string column per column copied. What the text of a value
//! means (a number, a time) is SQL's to say (`tidemark-sql` casts the columns); this module
//! only splits the bytes into values and nulls, as PostgreSQL's `COPY` does.
//!
//! Written by hand because the distinction the formats hinge on is not one a CSV crate
//! exposes: in `csv`, an unquoted empty value is NULL and a quoted one (`""`) is the empty
//! string; in `text`, `\N` is NULL only when it is the whole value as sent, before escapes.
//!
//! Every byte is untrusted: a value that is not UTF-8, a row with too few or too many
//! values, an unterminated quoted value, a delimiter that is not one ASCII byte, all are
//! refusals naming the line (counted from 1, the header included), never a panic. Output is
//! at most about the input's size (each value's bytes are copied once).

use arrow_array::builder::StringBuilder;
use arrow_array::StringArray;

/// How the rows are written (`COPY ... WITH (FORMAT ...)`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum CopyFormat {
    Text,
    Csv,
}

/// The options of a `COPY ... FROM STDIN` that shape its bytes, with PostgreSQL's defaults
/// ([`CopyOptions::new`]).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct CopyOptions {
    pub format: CopyFormat,
    /// Between values: tab in `text`, a comma in `csv`.
    pub delimiter: u8,
    /// The text of a null value: `\N` in `text`, the unquoted empty value in `csv`.
    pub null: String,
    /// The first line names the columns and is skipped.
    pub header: bool,
    /// `csv` only: what quotes a value (`"`).
    pub quote: u8,
    /// `csv` only: what escapes a quote inside a quoted value (by default the quote itself:
    /// `""`).
    pub escape: u8,
}

impl CopyOptions {
    /// PostgreSQL's defaults for `format`.
    pub fn new(format: CopyFormat) -> CopyOptions {
        match format {
            CopyFormat::Text => CopyOptions {
                format,
                delimiter: b'\t',
                null: "\\N".into(),
                header: false,
                quote: b'"',
                escape: b'"',
            },
            CopyFormat::Csv => CopyOptions {
                format,
                delimiter: b',',
                null: String::new(),
                header: false,
                quote: b'"',
                escape: b'"',
            },
        }
    }
}

/// Why the bytes are not rows of the columns copied.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum CopyError {
    /// A row that does not fit; `line` counts from 1 (a quoted value may span lines: the
    /// line its row starts on).
    #[error("COPY data, line {line}: {reason}")]
    Row { line: usize, reason: String },
}

/// The values of `data` as `columns` string columns of equal length, nulls as nulls. A
/// line `\.` alone ends the data (what old clients send last); an empty `data` is no rows.
pub fn decode(
    data: &[u8],
    options: &CopyOptions,
    columns: usize,
) -> Result<Vec<StringArray>, CopyError> {
    assert!(columns > 0, "a COPY copies at least one column");
    let mut rows = Rows {
        columns: (0..columns).map(|_| StringBuilder::new()).collect(),
        line: 0,
    };
    let mut at = 0;
    let mut first = true;
    while at < data.len() {
        rows.line += 1;
        let start_line = rows.line;
        let row_end = match options.format {
            CopyFormat::Text => {
                let end = text_row_end(data, at);
                let line = without_carriage_return(&data[at..end]);
                if line == b"\\." {
                    return Ok(rows.finish());
                }
                // Escaped line breaks are data, on the lines they span.
                rows.line += memchr::memchr_iter(b'\n', line).count();
                if !(first && options.header) {
                    let values = text_values(line, options).map_err(|r| rows.refusal(r))?;
                    rows.push(values, start_line)?;
                }
                end + 1
            }
            CopyFormat::Csv => {
                let (values, end, lines) =
                    csv_values(&data[at..], options).map_err(|reason| rows.refusal(reason))?;
                rows.line += lines;
                // The end marker is the line `\.` as written (a quoted "\." is a value).
                let written = &data[at..at + end];
                let written = written.strip_suffix(b"\n").unwrap_or(written);
                if without_carriage_return(written) == b"\\." {
                    return Ok(rows.finish());
                }
                if !(first && options.header) {
                    rows.push(values, start_line)?;
                }
                at + end
            }
        };
        first = false;
        at = row_end;
    }
    Ok(rows.finish())
}

/// One value of a row: null, or its bytes after unescaping.
#[derive(Debug, PartialEq, Eq)]
enum Value {
    Null,
    Text(Vec<u8>),
}

struct Rows {
    columns: Vec<StringBuilder>,
    /// The line being read, from 1.
    line: usize,
}

impl Rows {
    fn refusal(&self, reason: String) -> CopyError {
        CopyError::Row {
            line: self.line,
            reason,
        }
    }

    fn push(&mut self, values: Vec<Value>, line: usize) -> Result<(), CopyError> {
        let refuse = |reason: String| CopyError::Row { line, reason };
        let expected = self.columns.len();
        if values.len() > expected {
            return Err(refuse(format!(
                "extra data after the last expected column: {} values where {expected} columns are copied",
                values.len()
            )));
        }
        if values.len() < expected {
            return Err(refuse(format!(
                "missing data: {} values where {expected} columns are copied",
                values.len()
            )));
        }
        // Checked whole before any value is kept, so the columns stay of equal length.
        let mut texts = Vec::with_capacity(values.len());
        for (i, value) in values.into_iter().enumerate() {
            texts.push(match value {
                Value::Null => None,
                // As PostgreSQL: text holds no zero byte (`\0`, or one sent as it is).
                Value::Text(bytes) if bytes.contains(&0) => {
                    return Err(refuse(format!(
                        "the value of column {} holds a zero byte, which text cannot",
                        i + 1
                    )))
                }
                Value::Text(bytes) => Some(String::from_utf8(bytes).map_err(|_| {
                    refuse(format!("the value of column {} is not valid UTF-8", i + 1))
                })?),
            });
        }
        for (column, text) in self.columns.iter_mut().zip(texts) {
            column.append_option(text);
        }
        Ok(())
    }

    fn finish(self) -> Vec<StringArray> {
        self.columns.into_iter().map(|mut c| c.finish()).collect()
    }
}

fn without_carriage_return(line: &[u8]) -> &[u8] {
    line.strip_suffix(b"\r").unwrap_or(line)
}

/// Where the `text` row starting at `at` ends: its first line break not escaped by a
/// backslash (a backslash before a line break makes it data), or the data's end.
fn text_row_end(data: &[u8], at: usize) -> usize {
    let mut i = at;
    while i < data.len() {
        match data[i] {
            b'\\' => i += 2,
            b'\n' => return i,
            _ => i += 1,
        }
    }
    data.len()
}

/// The values of one row of the `text` format: split at delimiters not escaped by a
/// backslash (PostgreSQL's own `COPY TO` writes a delimiter inside a value as `\|`).
fn text_values(line: &[u8], options: &CopyOptions) -> Result<Vec<Value>, String> {
    let mut values = Vec::new();
    let mut start = 0;
    let mut i = 0;
    while i <= line.len() {
        match line.get(i) {
            // The escaped byte is the value's; a lone backslash at the end is unescape's to refuse.
            Some(b'\\') => i = (i + 2).min(line.len()),
            Some(&b) if b != options.delimiter => i += 1,
            // A delimiter, or the row's end.
            _ => {
                let raw = &line[start..i.min(line.len())];
                // NULL is matched on the value as sent, before its escapes are read.
                values.push(if raw == options.null.as_bytes() {
                    Value::Null
                } else {
                    Value::Text(unescape(raw)?)
                });
                i += 1;
                start = i;
            }
        }
    }
    Ok(values)
}

/// A `text` value with its backslash escapes read: `\b \f \n \r \t \v`, up to three octal
/// digits, `\x` and up to two hex digits; a backslash before anything else is that thing.
fn unescape(raw: &[u8]) -> Result<Vec<u8>, String> {
    if !raw.contains(&b'\\') {
        return Ok(raw.to_vec());
    }
    let mut out = Vec::with_capacity(raw.len());
    let mut bytes = raw.iter().copied().peekable();
    while let Some(b) = bytes.next() {
        if b != b'\\' {
            out.push(b);
            continue;
        }
        let Some(escaped) = bytes.next() else {
            return Err("a value ends with a lone backslash".into());
        };
        out.push(match escaped {
            b'b' => 0x08,
            b'f' => 0x0c,
            b'n' => b'\n',
            b'r' => b'\r',
            b't' => b'\t',
            b'v' => 0x0b,
            b'0'..=b'7' => {
                let mut value = u32::from(escaped - b'0');
                for _ in 0..2 {
                    match bytes.peek() {
                        Some(&d @ b'0'..=b'7') => {
                            value = value * 8 + u32::from(d - b'0');
                            bytes.next();
                        }
                        _ => break,
                    }
                }
                // Three octal digits reach 511: PostgreSQL keeps the low byte.
                (value & 0xff) as u8
            }
            b'x' if bytes.peek().is_some_and(u8::is_ascii_hexdigit) => {
                let mut value = 0u8;
                for _ in 0..2 {
                    match bytes.peek().and_then(|d| (*d as char).to_digit(16)) {
                        Some(d) => {
                            value = value * 16 + d as u8;
                            bytes.next();
                        }
                        None => break,
                    }
                }
                value
            }
            other => other,
        });
    }
    Ok(out)
}

/// The values of the `csv` row at the start of `data`, where the next row starts, and how
/// many line breaks inside quoted values the row spanned.
fn csv_values(data: &[u8], options: &CopyOptions) -> Result<(Vec<Value>, usize, usize), String> {
    let (delimiter, quote, escape) = (options.delimiter, options.quote, options.escape);
    let mut values = Vec::new();
    let mut value = Vec::new();
    let mut quoted = false;
    let mut inside = false;
    let mut extra_lines = 0;
    let mut at = 0;
    let end = loop {
        let Some(&b) = data.get(at) else {
            if inside {
                return Err("unterminated CSV quoted value".into());
            }
            break data.len();
        };
        at += 1;
        if inside {
            let next = data.get(at).copied();
            if b == escape && (next == Some(quote) || (escape != quote && next == Some(escape))) {
                // An escaped quote (`""` by default), or an escaped escape, is itself.
                value.push(data[at]);
                at += 1;
            } else if b == quote {
                inside = false;
            } else {
                if b == b'\n' {
                    extra_lines += 1;
                }
                value.push(b);
            }
            continue;
        }
        match b {
            b'\n' => break at,
            b'\r' if data.get(at) == Some(&b'\n') => break at + 1,
            _ if b == delimiter => {
                values.push(csv_value(std::mem::take(&mut value), quoted, options));
                quoted = false;
            }
            _ if b == quote => {
                quoted = true;
                inside = true;
            }
            _ => value.push(b),
        }
    };
    values.push(csv_value(value, quoted, options));
    Ok((values, end, extra_lines))
}

/// A `csv` value: null when it is the null text unquoted.
fn csv_value(value: Vec<u8>, quoted: bool, options: &CopyOptions) -> Value {
    if !quoted && value == options.null.as_bytes() {
        Value::Null
    } else {
        Value::Text(value)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use arrow_array::Array;

    fn rows(data: &str, options: &CopyOptions, columns: usize) -> Vec<Vec<Option<String>>> {
        let decoded = decode(data.as_bytes(), options, columns).expect("decodes");
        let len = decoded[0].len();
        (0..len)
            .map(|row| {
                decoded
                    .iter()
                    .map(|c| (!c.is_null(row)).then(|| c.value(row).to_owned()))
                    .collect()
            })
            .collect()
    }

    fn text() -> CopyOptions {
        CopyOptions::new(CopyFormat::Text)
    }

    fn csv() -> CopyOptions {
        CopyOptions::new(CopyFormat::Csv)
    }

    fn some(s: &str) -> Option<String> {
        Some(s.to_owned())
    }

    #[test]
    fn text_rows_split_on_tabs_with_nulls_and_escapes() {
        let data = "2024-01-01\tAAPL\t1.5\n2024-01-02\t\\N\ta\\tb\\\\c\\n\\101\\x42\r\n";
        assert_eq!(
            rows(data, &text(), 3),
            vec![
                vec![some("2024-01-01"), some("AAPL"), some("1.5")],
                vec![some("2024-01-02"), None, some("a\tb\\c\nAB")],
            ]
        );
        // `\N` is null only as the whole value as sent; escaped, it is text.
        assert_eq!(rows("\\\\N\n", &text(), 1), vec![vec![some("\\N")]]);
        // An escaped delimiter or line break is data, as PostgreSQL's COPY TO writes them.
        let pipe = CopyOptions {
            delimiter: b'|',
            ..text()
        };
        assert_eq!(
            rows("a\\|b|c\\\nd\n", &pipe, 2),
            vec![vec![some("a|b"), some("c\nd")]]
        );
    }

    #[test]
    fn the_end_marker_and_a_missing_last_newline_end_the_data() {
        assert_eq!(rows("a\nb", &text(), 1).len(), 2);
        assert_eq!(rows("a\n\\.\nnot read\n", &text(), 1).len(), 1);
        assert_eq!(rows("a\n\\.\n", &csv(), 1).len(), 1);
        assert!(rows("", &csv(), 2).is_empty());
        // Quoted, it is a value.
        assert_eq!(rows("\"\\.\"\nb\n", &csv(), 1).len(), 2);
    }

    #[test]
    fn csv_tells_null_from_the_empty_string_and_reads_quotes() {
        let data = "x,\"\",,\"a,\"\"b\"\"\nc\"\r\n";
        assert_eq!(
            rows(data, &csv(), 4),
            vec![vec![some("x"), some(""), None, some("a,\"b\"\nc")]]
        );
        let header = CopyOptions {
            header: true,
            delimiter: b';',
            null: "NA".into(),
            ..csv()
        };
        assert_eq!(
            rows("t;v\n1;NA\n2;\"NA\"\n", &header, 2),
            vec![vec![some("1"), None], vec![some("2"), some("NA")]]
        );
        let escape = CopyOptions {
            escape: b'\\',
            ..csv()
        };
        assert_eq!(rows("\"a\\\"b\"\n", &escape, 1), vec![vec![some("a\"b")]]);
    }

    #[test]
    fn refusals_name_the_line() {
        let refusal = |data: &[u8], options: &CopyOptions, columns| {
            decode(data, options, columns)
                .expect_err("refused")
                .to_string()
        };
        assert_eq!(
            refusal(b"a\tb\nc\n", &text(), 2),
            "COPY data, line 2: missing data: 1 values where 2 columns are copied"
        );
        assert!(refusal(b"a,b,c\n", &csv(), 2).starts_with("COPY data, line 1: extra data"));
        assert!(refusal(b"x\n\"a\nb\n", &csv(), 1).contains("line 2: unterminated"));
        assert!(refusal(b"ok\n\xff\xfe\n", &text(), 1)
            .contains("line 2: the value of column 1 is not valid UTF-8"));
        assert!(refusal(b"a\\", &text(), 1).contains("lone backslash"));
        assert!(refusal(b"a\\0b\n", &text(), 1).contains("zero byte"));
        // An escaped line break continues its row: the next row starts on line 3.
        assert!(refusal(b"a\\\nb\nc\td\n", &text(), 1).contains("line 3: extra data"));
        // A quoted value's line breaks count: the refused row is on line 3.
        assert!(refusal(b"\"a\nb\",c\nd\n", &csv(), 2).contains("line 3: missing data"));
    }
}
