//! Durations and instants as people write them.

use crate::QueryError;

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

/// Parses an instant: nanoseconds since the epoch, `now`, or `now-DURATION` / `now+DURATION`.
pub fn parse_instant(text: &str, now_ns: i64) -> Result<i64, QueryError> {
    let t = text.trim();
    if let Ok(ns) = t.parse::<i64>() {
        return Ok(ns);
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
        "invalid time {text:?} (nanoseconds since the epoch, now, or now-1h)"
    )))
}

/// Nanoseconds since the epoch, now.
pub fn now_ns() -> i64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| i64::try_from(d.as_nanos()).unwrap_or(i64::MAX))
}

/// `2026-11-21T20:15:03.123456789Z` for a nanosecond timestamp.
pub fn format_instant(ns: i64) -> String {
    let secs = ns.div_euclid(1_000_000_000);
    let nanos = ns.rem_euclid(1_000_000_000);
    let days = secs.div_euclid(86_400);
    let rem = secs.rem_euclid(86_400);
    let (y, m, d) = civil_from_days(days);
    let (hh, mm, ss) = (rem / 3600, rem % 3600 / 60, rem % 60);
    if nanos == 0 {
        format!("{y:04}-{m:02}-{d:02}T{hh:02}:{mm:02}:{ss:02}Z")
    } else {
        format!("{y:04}-{m:02}-{d:02}T{hh:02}:{mm:02}:{ss:02}.{nanos:09}Z")
    }
}

/// Days since 1970-01-01 to (year, month, day), proleptic Gregorian (H. Hinnant's
/// algorithm; a date crate for this one conversion is not worth its build time).
fn civil_from_days(days: i64) -> (i64, u32, u32) {
    let z = days + 719_468;
    let era = z.div_euclid(146_097);
    let doe = z.rem_euclid(146_097);
    let yoe = (doe - doe / 1460 + doe / 36_524 - doe / 146_096) / 365;
    let doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
    let mp = (5 * doy + 2) / 153;
    let d = (doy - (153 * mp + 2) / 5 + 1) as u32;
    let m = if mp < 10 { mp + 3 } else { mp - 9 } as u32;
    let y = yoe + era * 400 + i64::from(m <= 2);
    (y, m, d)
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
    }

    #[test]
    fn formats_dates() {
        assert_eq!(format_instant(0), "1970-01-01T00:00:00Z");
        assert_eq!(
            format_instant(1_763_756_103_000_000_001),
            "2025-11-21T20:15:03.000000001Z"
        );
        assert_eq!(
            format_instant(951_782_400_000_000_000),
            "2000-02-29T00:00:00Z"
        );
        assert_eq!(format_instant(-1_000_000_000), "1969-12-31T23:59:59Z");
    }
}
