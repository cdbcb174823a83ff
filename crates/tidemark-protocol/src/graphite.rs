//! Graphite's plaintext protocol, one line at a time: `path value timestamp`, the format
//! carbon listens for on port 2003 and that collectd, Diamond, statsd and most metric agents
//! can send.
//!
//! The grammar is carbon's own: three fields separated by any run of blanks; the value and
//! the timestamp are numbers as Python's `float()` reads them (`1`, `-2.5`, `1e3`, `nan`,
//! `inf`); a timestamp of `-1` means "now". A path may carry Graphite 1.1 tags,
//! `name;tag=value;tag2=value2`. What Tidemark decides: the timestamp keeps its fraction of a
//! second (nanoseconds), a NaN value is kept rather than dropped as carbon drops it, and a
//! line that is not UTF-8 is refused.
//!
//! What a line becomes (one stream, tags as fields) is the server's.

/// The longest line taken; a longer one is refused whole (the server skips to its end).
pub const MAX_LINE_BYTES: usize = 64 * 1024;

const NANOS_PER_SECOND: i64 = 1_000_000_000;

/// One line: a value of a path at an instant.
#[derive(Debug, Clone, PartialEq)]
pub struct Metric<'a> {
    /// The metric's name, without its tags.
    pub path: &'a str,
    /// Graphite 1.1 tags; no name twice.
    pub tags: Tags<'a>,
    pub value: f64,
    /// Nanoseconds since the epoch.
    pub tstart: i64,
}

/// Why a line was refused.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum GraphiteError {
    #[error("a line is `path value timestamp`; this one has {0} part(s)")]
    Parts(usize),
    #[error("the line is not UTF-8")]
    NotUtf8,
    #[error("the line is longer than {MAX_LINE_BYTES} bytes")]
    TooLong,
    #[error("value {0:?} is not a number")]
    Value(String),
    #[error("timestamp {0:?} is not a number of seconds that 64-bit nanoseconds hold")]
    Timestamp(String),
    #[error("tag {0:?} is not `name=value` with both non-empty")]
    Tag(String),
    #[error("tag {0:?} is written twice")]
    DuplicateTag(String),
    #[error("the metric name is empty")]
    EmptyPath,
}

/// The metric on `line` (without its line ending); a timestamp of `-1` gets `now_ns`.
/// `None` for a blank line, which carbon skips too.
pub fn decode_line(line: &[u8], now_ns: i64) -> Option<Result<Metric<'_>, GraphiteError>> {
    if line.len() > MAX_LINE_BYTES {
        return Some(Err(GraphiteError::TooLong));
    }
    let Ok(text) = std::str::from_utf8(line) else {
        return Some(Err(GraphiteError::NotUtf8));
    };
    let mut parts = text.split_ascii_whitespace();
    let first = parts.next()?;
    let (Some(value), Some(timestamp), None) = (parts.next(), parts.next(), parts.next()) else {
        return Some(Err(GraphiteError::Parts(
            text.split_ascii_whitespace().count(),
        )));
    };
    Some(decode_parts(first, value, timestamp, now_ns))
}

fn decode_parts<'a>(
    path: &'a str,
    value: &str,
    timestamp: &str,
    now_ns: i64,
) -> Result<Metric<'a>, GraphiteError> {
    let (path, tags) = split_tags(path)?;
    let number = parse_float(value).ok_or_else(|| GraphiteError::Value(value.to_string()))?;
    let tstart = parse_timestamp(timestamp, now_ns)
        .ok_or_else(|| GraphiteError::Timestamp(timestamp.to_string()))?;
    Ok(Metric {
        path,
        tags,
        value: number,
        tstart,
    })
}

/// Tag names and values, in the order written.
pub type Tags<'a> = Vec<(&'a str, &'a str)>;

/// `name;tag=value;...` into the name and its tags.
fn split_tags(path: &str) -> Result<(&str, Tags<'_>), GraphiteError> {
    let mut pieces = path.split(';');
    let name = pieces.next().unwrap_or_default();
    if name.is_empty() {
        return Err(GraphiteError::EmptyPath);
    }
    let mut tags: Vec<(&str, &str)> = Vec::new();
    for piece in pieces {
        let (tag, value) = piece
            .split_once('=')
            .filter(|(tag, value)| !tag.is_empty() && !value.is_empty())
            .ok_or_else(|| GraphiteError::Tag(piece.to_string()))?;
        if tags.iter().any(|(earlier, _)| *earlier == tag) {
            return Err(GraphiteError::DuplicateTag(tag.to_string()));
        }
        tags.push((tag, value));
    }
    Ok((name, tags))
}

/// A number as Python's `float()` reads it (without its `_` digit separators): Rust's
/// `f64` grammar is the same for `1`, `-2.5`, `.5`, `1e3`, `nan`, `inf`, `infinity`.
fn parse_float(text: &str) -> Option<f64> {
    text.parse::<f64>().ok()
}

/// Seconds since the epoch, whole or with a fraction, as nanoseconds. A decimal is read
/// exactly (to the nanosecond, further digits cut); an exponent form through `f64`. Whose
/// whole part is `-1` is `now_ns` (carbon's rule: `int(timestamp) == -1`).
fn parse_timestamp(text: &str, now_ns: i64) -> Option<i64> {
    let nanos = match parse_decimal_seconds(text) {
        Some(nanos) => nanos,
        None => {
            let nanos = (parse_float(text)? * NANOS_PER_SECOND as f64).trunc();
            // `as` saturates; the range check keeps a saturated (or NaN) value out.
            let in_range = nanos.is_finite() && nanos >= i64::MIN as f64 && nanos < i64::MAX as f64;
            if !in_range {
                return None;
            }
            nanos as i64
        }
    };
    let whole_seconds = nanos / NANOS_PER_SECOND;
    Some(if whole_seconds == -1 { now_ns } else { nanos })
}

/// `[-+]digits[.digits]` (either side may be empty, not both) as exact nanoseconds.
fn parse_decimal_seconds(text: &str) -> Option<i64> {
    let (negative, unsigned) = match text.as_bytes().first()? {
        b'-' => (true, &text[1..]),
        b'+' => (false, &text[1..]),
        _ => (false, text),
    };
    let (whole, fraction) = unsigned.split_once('.').unwrap_or((unsigned, ""));
    let digits = |s: &str| s.bytes().all(|b| b.is_ascii_digit());
    if (whole.is_empty() && fraction.is_empty()) || !digits(whole) || !digits(fraction) {
        return None;
    }
    let whole: i64 = if whole.is_empty() {
        0
    } else {
        whole.parse().ok()?
    };
    let mut fraction_nanos = 0i64;
    for (i, digit) in fraction.bytes().take(9).enumerate() {
        fraction_nanos += i64::from(digit - b'0') * 10i64.pow(8 - i as u32);
    }
    let magnitude = whole
        .checked_mul(NANOS_PER_SECOND)?
        .checked_add(fraction_nanos)?;
    Some(if negative { -magnitude } else { magnitude })
}

#[cfg(test)]
mod tests {
    use super::*;

    const NOW: i64 = 42;

    fn ok(line: &str) -> Metric<'_> {
        match decode_line(line.as_bytes(), NOW) {
            Some(Ok(metric)) => metric,
            other => panic!("{line:?}: {other:?}"),
        }
    }

    fn refused(line: &[u8]) -> GraphiteError {
        match decode_line(line, NOW) {
            Some(Err(e)) => e,
            other => panic!("{line:?}: {other:?}"),
        }
    }

    #[test]
    fn a_line_is_path_value_and_seconds() {
        let m = ok("servers.web1.cpu.user 12.5 1700000000");
        assert_eq!(m.path, "servers.web1.cpu.user");
        assert!(m.tags.is_empty());
        assert_eq!(m.value, 12.5);
        assert_eq!(m.tstart, 1_700_000_000 * NANOS_PER_SECOND);
    }

    #[test]
    fn blanks_are_any_run_of_spaces_and_tabs_and_a_carriage_return_ends_the_line() {
        let m = ok("  a.b \t 3\t1700000000.25 \r");
        assert_eq!((m.path, m.value), ("a.b", 3.0));
        assert_eq!(m.tstart, 1_700_000_000 * NANOS_PER_SECOND + 250_000_000);
        assert!(decode_line(b" \t\r", NOW).is_none());
        assert!(decode_line(b"", NOW).is_none());
    }

    #[test]
    fn minus_one_is_now_and_nan_and_infinities_are_kept() {
        assert_eq!(ok("a 1 -1").tstart, NOW);
        assert_eq!(ok("a 1 -1.0").tstart, NOW);
        assert!(ok("a nan 1").value.is_nan());
        assert_eq!(ok("a -inf 1").value, f64::NEG_INFINITY);
        assert_eq!(ok("a 1e3 1").value, 1000.0);
        assert_eq!(ok("a 1 -1.5").tstart, NOW);
        assert_eq!(ok("a 5 -2").tstart, -2 * NANOS_PER_SECOND);
        assert_eq!(ok("a 5 -0.5").tstart, -NANOS_PER_SECOND / 2);
        assert_eq!(ok("a 5 .000000001999").tstart, 1);
        assert_eq!(ok("a 5 1.7e9").tstart, 1_700_000_000 * NANOS_PER_SECOND);
    }

    #[test]
    fn tags_follow_the_name_after_semicolons() {
        let m = ok("disk.used;host=web1;mount=/var 90 1");
        assert_eq!(m.path, "disk.used");
        assert_eq!(m.tags, vec![("host", "web1"), ("mount", "/var")]);
        assert_eq!(refused(b"a;host 1 1"), GraphiteError::Tag("host".into()));
        assert_eq!(refused(b"a;=x 1 1"), GraphiteError::Tag("=x".into()));
        assert_eq!(
            refused(b"a;h=1;h=2 1 1"),
            GraphiteError::DuplicateTag("h".into())
        );
        assert_eq!(refused(b";h=1 1 1"), GraphiteError::EmptyPath);
    }

    #[test]
    fn malformed_lines_are_refused_with_what_is_wrong() {
        assert_eq!(refused(b"a 1"), GraphiteError::Parts(2));
        assert_eq!(refused(b"a"), GraphiteError::Parts(1));
        assert_eq!(refused(b"a 1 2 3"), GraphiteError::Parts(4));
        assert_eq!(refused(b"a x 1"), GraphiteError::Value("x".into()));
        assert_eq!(
            refused(b"a 1 soon"),
            GraphiteError::Timestamp("soon".into())
        );
        assert_eq!(
            refused(b"a 1 1e300"),
            GraphiteError::Timestamp("1e300".into())
        );
        assert_eq!(refused(b"a 1 nan"), GraphiteError::Timestamp("nan".into()));
        assert_eq!(refused(b"a 1 ."), GraphiteError::Timestamp(".".into()));
        assert_eq!(refused(b"a 1 -"), GraphiteError::Timestamp("-".into()));
        let beyond = format!("a 1 {}", i64::MAX / NANOS_PER_SECOND + 1);
        assert!(matches!(
            refused(beyond.as_bytes()),
            GraphiteError::Timestamp(_)
        ));
        assert_eq!(refused(b"a\xff 1 1"), GraphiteError::NotUtf8);
        let long = format!("{} 1 1", "a".repeat(MAX_LINE_BYTES));
        assert_eq!(refused(long.as_bytes()), GraphiteError::TooLong);
    }
}
