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

/// Parses an RFC 3339 instant (`2026-11-21T20:15:03Z`, `2026-11-21 20:15:03.5+01:00`, or a
/// date alone) into nanoseconds since the epoch.
pub fn parse_rfc3339(text: &str) -> Result<i64, QueryError> {
    let bad = || {
        QueryError(format!(
            "{text:?} is not an RFC 3339 time (2026-11-21T20:15:03Z)"
        ))
    };
    let t = text.trim();
    let number = |s: &str| -> Result<i64, QueryError> {
        if s.is_empty() || !s.bytes().all(|b| b.is_ascii_digit()) {
            return Err(bad());
        }
        s.parse().map_err(|_| bad())
    };
    let (date, rest) = t.split_at(t.find(['T', 't', ' ']).unwrap_or(t.len()));
    let mut parts = date.splitn(3, '-');
    let (y, m, d) = match (parts.next(), parts.next(), parts.next()) {
        (Some(y), Some(m), Some(d)) if y.len() == 4 => (number(y)?, number(m)?, number(d)?),
        _ => return Err(bad()),
    };
    if !(1..=12).contains(&m) || !(1..=31).contains(&d) {
        return Err(bad());
    }
    let mut ns = days_from_civil(y, m as u32, d as u32) * 86_400 * 1_000_000_000;
    let time = rest.get(1..).unwrap_or("");
    if time.is_empty() {
        return Ok(ns);
    }
    let zone_at = time.find(['Z', 'z', '+', '-']).ok_or_else(bad)?;
    let (clock, zone) = time.split_at(zone_at);
    let (hms, fraction) = clock.split_once('.').unwrap_or((clock, ""));
    let mut hms = hms.splitn(3, ':');
    let (h, mi, s) = match (hms.next(), hms.next(), hms.next()) {
        (Some(h), Some(mi), Some(s)) => (number(h)?, number(mi)?, number(s)?),
        _ => return Err(bad()),
    };
    if h > 23 || mi > 59 || s > 60 || fraction.len() > 9 {
        return Err(bad());
    }
    ns += ((h * 60 + mi) * 60 + s) * 1_000_000_000;
    if !fraction.is_empty() {
        ns += number(fraction)? * 10i64.pow(9 - fraction.len() as u32);
    }
    let offset_minutes = match zone {
        "Z" | "z" => 0,
        _ => {
            let sign = if zone.starts_with('-') { -1 } else { 1 };
            let (zh, zm) = zone[1..].split_once(':').ok_or_else(bad)?;
            sign * (number(zh)? * 60 + number(zm)?)
        }
    };
    Ok(ns - offset_minutes * 60 * 1_000_000_000)
}

/// (year, month, day) to days since 1970-01-01: the inverse of [`civil_from_days`].
fn days_from_civil(y: i64, m: u32, d: u32) -> i64 {
    let y = if m <= 2 { y - 1 } else { y };
    let era = y.div_euclid(400);
    let yoe = y.rem_euclid(400);
    let mp = i64::from((m + 9) % 12);
    let doy = (153 * mp + 2) / 5 + i64::from(d) - 1;
    let doe = yoe * 365 + yoe / 4 - yoe / 100 + doy;
    era * 146_097 + doe - 719_468
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
    fn rfc3339_round_trips_with_format_instant() {
        for ns in [
            0,
            1_763_756_103_123_456_789,
            -86_400_000_000_000,
            951_782_400_000_000_000,
        ] {
            assert_eq!(
                parse_rfc3339(&format_instant(ns)),
                Ok(ns),
                "{}",
                format_instant(ns)
            );
        }
        assert_eq!(parse_rfc3339("1970-01-02"), Ok(86_400_000_000_000));
        assert_eq!(parse_rfc3339("1970-01-01T01:00:00+01:00"), Ok(0));
        assert_eq!(parse_rfc3339("1970-01-01 00:00:00.5Z"), Ok(500_000_000));
        for bad in [
            "",
            "now",
            "2026-13-01",
            "2026-11-21T10:00",
            "2026-11-21T25:00:00Z",
            "70-01-01",
        ] {
            assert!(parse_rfc3339(bad).is_err(), "{bad:?}");
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
