//! Durations and instants as people write them.

use crate::QueryError;

pub use tidemark_core::time::format_instant;

const UNITS: [(&str, i64); 8] = [
    ("ns", 1),
    ("us", 1_000),
    ("ms", 1_000_000),
    ("s", 1_000_000_000),
    ("m", 60_000_000_000),
    ("h", 3_600_000_000_000),
    ("d", 86_400_000_000_000),
    ("w", 604_800_000_000_000),
];

/// Parses `250ms`, `10s`, `1m`, `1h`, `7d`, `2w` (also `1 minute`, `5 seconds`) into
/// nanoseconds. The result is always positive.
pub fn parse_duration(text: &str) -> Result<i64, QueryError> {
    let t = text.trim();
    let split = t.find(|c: char| !c.is_ascii_digit()).unwrap_or(t.len());
    let (digits, unit) = t.split_at(split);
    let unit = unit.trim().to_ascii_lowercase();
    let unit = match unit.as_str() {
        "nanosecond" | "nanoseconds" => "ns",
        "microsecond" | "microseconds" => "us",
        "millisecond" | "milliseconds" => "ms",
        "sec" | "second" | "seconds" => "s",
        "min" | "minute" | "minutes" => "m",
        "hour" | "hours" => "h",
        "day" | "days" => "d",
        "week" | "weeks" => "w",
        other => other,
    };
    let invalid = || {
        QueryError(format!(
            "invalid duration {text:?} (examples: 500ms, 10s, 1m, 1h, 7d)"
        ))
    };
    let n: i64 = digits.parse().map_err(|_| invalid())?;
    let scale = UNITS
        .iter()
        .find(|(u, _)| *u == unit)
        .ok_or_else(invalid)?
        .1;
    match n.checked_mul(scale) {
        Some(ns) if ns > 0 => Ok(ns),
        _ => Err(invalid()),
    }
}

/// Nanoseconds in the largest unit of [`parse_duration`] that divides them (`7d`, `90m`,
/// `1500ms`): what `parse_duration` reads back as the same value.
pub fn format_duration(ns: i64) -> String {
    let text = UNITS
        .iter()
        .rev()
        .find(|(_, unit)| ns % unit == 0)
        .map_or_else(
            || format!("{ns}ns"),
            |(name, unit)| format!("{}{name}", ns / unit),
        );
    debug_assert!(
        ns <= 0 || parse_duration(&text).ok() == Some(ns),
        "{text} does not read back as {ns} ns"
    );
    text
}

/// An out-of-order window as people set it: a duration, `unlimited` (events may arrive in
/// any order), or `default` (the database's own window): `None` for `default`.
pub fn parse_window(text: &str) -> Result<Option<i64>, QueryError> {
    match text.trim().to_ascii_lowercase().as_str() {
        "default" => Ok(None),
        "unlimited" => Ok(Some(i64::MAX)),
        _ => parse_duration(text).map(Some).map_err(|_| {
            QueryError(format!(
                "invalid out-of-order window {text:?} (a duration such as 1h or 30d, unlimited, or default)"
            ))
        }),
    }
}

/// An out-of-order window in force as people read it (`None`: no window).
pub fn format_window(window_ns: Option<i64>) -> String {
    match window_ns {
        None | Some(i64::MAX) => "unlimited".to_string(),
        Some(ns) => format_duration(ns),
    }
}

/// Parses an instant, the one rule for every time a person types: nanoseconds since the
/// epoch, an RFC 3339 time (UTC when it names no zone), `now`, or `now-DURATION` /
/// `now+DURATION`.
pub fn parse_instant(text: &str, now_ns: i64) -> Result<i64, QueryError> {
    let t = text.trim();
    if let Ok(ns) = t.parse::<i64>() {
        return Ok(ns);
    }
    if tidemark_core::time::looks_like_a_date(t) {
        return parse_rfc3339(t);
    }
    if let Some(rest) = t.strip_prefix("now") {
        let rest = rest.trim();
        if rest.is_empty() {
            return Ok(now_ns);
        }
        if let Some(d) = rest.strip_prefix('-') {
            return Ok(now_ns.saturating_sub(parse_duration(d)?));
        }
        if let Some(d) = rest.strip_prefix('+') {
            return Ok(now_ns.saturating_add(parse_duration(d)?));
        }
    }
    Err(QueryError(format!(
        "invalid time {text:?} (nanoseconds since the epoch, 2026-11-21T20:15:03Z, \
         '2026-11-21 20:15:03' in UTC, now, or now-1h)"
    )))
}

pub use tidemark_core::time::now_ns;

/// A stream's time partition from its text (`6h`, `1d`, `7d`), or why it is not one: text
/// that is no duration at all (`abc`, `-1d`) is told what a partition may be too.
pub fn parse_partition(text: &str) -> Result<tidemark_core::Partition, tidemark_core::CoreError> {
    let ns = parse_duration(text).map_err(|_| {
        tidemark_core::CoreError::InvalidPartition(format!(
            "{text:?}: {}",
            tidemark_core::Partition::ALLOWED
        ))
    })?;
    tidemark_core::Partition::new(ns)
}

/// Parses an RFC 3339 instant (`2026-11-21T20:15:03Z`, `2026-11-21 20:15:03.5+01:00`,
/// `2026-11-21 20:15:03` in UTC, or a date alone) into nanoseconds since the epoch.
pub fn parse_rfc3339(text: &str) -> Result<i64, QueryError> {
    tidemark_core::time::parse_rfc3339(text).map_err(|e| QueryError(e.to_string()))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn durations() {
        assert_eq!(parse_duration("1m"), Ok(60_000_000_000));
        assert_eq!(parse_duration("250ms"), Ok(250_000_000));
        assert_eq!(parse_duration("1 minute"), Ok(60_000_000_000));
        assert_eq!(parse_duration("2h"), Ok(7_200_000_000_000));
        for ns in [
            1,
            1_500_000,
            90 * 60_000_000_000,
            7 * 86_400_000_000_000,
            14 * 86_400_000_000_000,
        ] {
            assert_eq!(
                parse_duration(&format_duration(ns)),
                Ok(ns),
                "{}",
                format_duration(ns)
            );
        }
        assert_eq!(format_duration(7 * 86_400_000_000_000), "1w");
        assert_eq!(format_duration(90 * 60_000_000_000), "90m");
        for bad in ["", "m", "1x", "-1m", "0s", "99999999999w"] {
            assert!(parse_duration(bad).is_err(), "{bad:?}");
        }
    }

    #[test]
    fn instants() {
        assert_eq!(parse_instant("now", 1000), Ok(1000));
        assert_eq!(parse_instant("now-1us", 5000), Ok(4000));
        assert_eq!(parse_instant("now + 1us", 0), Ok(1000));
        assert_eq!(parse_instant("-42", 0), Ok(-42));
        assert!(parse_instant("yesterday", 0).is_err());
        assert_eq!(parse_instant("1970-01-01 00:00:01", 0), Ok(1_000_000_000));
        assert_eq!(parse_instant("1970-01-02", 0), Ok(86_400_000_000_000));
        assert!(parse_instant("1970-01-01 25:00:00", 0).is_err());
    }
}
