//! Instants as people write and read them: RFC 3339, in UTC unless a zone is named.
//!
//! Hand-written: two calendar conversions (H. Hinnant's algorithms) are all Tidemark needs,
//! and a date crate is not worth its build time for them.

/// Text that is not a time this module understands.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error(
    "{0:?} is not an RFC 3339 time (2026-11-21T20:15:03Z, 2026-11-21T20:15:03.5+01:00, \
     '2026-11-21 20:15:03' in UTC, or 2026-11-21)"
)]
pub struct NotATime(pub String);

/// Whether `text` starts like a date (`2026-...`), rather than a number or `now`.
pub fn looks_like_a_date(text: &str) -> bool {
    let b = text.trim().as_bytes();
    b.len() >= 5 && b[..4].iter().all(u8::is_ascii_digit) && b[4] == b'-'
}

/// Parses `2026-11-21T20:15:03Z`, `2026-11-21 20:15:03.5+01:00`, `2026-11-21T20:15` or
/// `2026-11-21 20:15:03` (no zone: UTC), or a date alone (midnight UTC) into nanoseconds
/// since the epoch. Times outside what nanoseconds in an `i64` hold (1677..2262) are refused.
pub fn parse_rfc3339(text: &str) -> Result<i64, NotATime> {
    let bad = || NotATime(text.to_string());
    let t = text.trim();
    let number = |s: &str| -> Result<i64, NotATime> {
        if s.is_empty() || s.len() > 9 || !s.bytes().all(|b| b.is_ascii_digit()) {
            return Err(bad());
        }
        s.parse().map_err(|_| bad())
    };
    let (date, rest) = t.split_at(t.find(['T', 't', ' ']).unwrap_or(t.len()));
    let mut parts = date.splitn(3, '-');
    let (y, m, d) = match (parts.next(), parts.next(), parts.next()) {
        (Some(y), Some(m), Some(d)) if y.len() == 4 && m.len() == 2 && d.len() == 2 => {
            (number(y)?, number(m)?, number(d)?)
        }
        _ => return Err(bad()),
    };
    if !(1..=12).contains(&m) || !(1..=days_in_month(y, m)).contains(&d) {
        return Err(bad());
    }
    let mut seconds = days_from_civil(y, m, d) * 86_400;
    let mut nanos = 0;
    let time = rest.get(1..).unwrap_or("").trim();
    if !time.is_empty() {
        let zone_at = time.find(['Z', 'z', '+', '-']).unwrap_or(time.len());
        let (clock, zone) = time.split_at(zone_at);
        let (hms, fraction) = clock.split_once('.').unwrap_or((clock, ""));
        let mut hms = hms.trim().splitn(3, ':');
        let (h, mi, s) = match (hms.next(), hms.next(), hms.next()) {
            (Some(h), Some(mi), s) if h.len() == 2 && mi.len() == 2 => {
                (number(h)?, number(mi)?, s.map_or(Ok(0), number)?)
            }
            _ => return Err(bad()),
        };
        if h > 23 || mi > 59 || s > 60 {
            return Err(bad());
        }
        seconds += (h * 60 + mi) * 60 + s;
        if !fraction.is_empty() {
            nanos = number(fraction)? * 10i64.pow(9 - fraction.len() as u32);
        }
        seconds -= match zone {
            "" | "Z" | "z" => 0,
            _ => {
                let sign = if zone.starts_with('-') { -1 } else { 1 };
                let (zh, zm) = zone[1..].split_once(':').ok_or_else(bad)?;
                let (zh, zm) = (number(zh)?, number(zm)?);
                if zh > 23 || zm > 59 {
                    return Err(bad());
                }
                sign * (zh * 60 + zm) * 60
            }
        };
    }
    seconds
        .checked_mul(1_000_000_000)
        .and_then(|ns| ns.checked_add(nanos))
        .ok_or_else(bad)
}

/// `2026-11-21T20:15:03.123456789Z` (the fraction only when there is one).
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

fn days_in_month(y: i64, m: i64) -> i64 {
    match m {
        2 if y % 4 == 0 && (y % 100 != 0 || y % 400 == 0) => 29,
        2 => 28,
        4 | 6 | 9 | 11 => 30,
        _ => 31,
    }
}

/// (year, month, day) to days since 1970-01-01: the inverse of [`civil_from_days`].
fn days_from_civil(y: i64, m: i64, d: i64) -> i64 {
    let y = if m <= 2 { y - 1 } else { y };
    let era = y.div_euclid(400);
    let yoe = y.rem_euclid(400);
    let mp = (m + 9) % 12;
    let doy = (153 * mp + 2) / 5 + d - 1;
    let doe = yoe * 365 + yoe / 4 - yoe / 100 + doy;
    era * 146_097 + doe - 719_468
}

/// Days since 1970-01-01 to (year, month, day), proleptic Gregorian.
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

/// Nanoseconds since the epoch by this machine's clock (0 before 1970): the one clock that
/// retention, the bound on future timestamps and `now` in queries read.
pub fn now_ns() -> i64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| i64::try_from(d.as_nanos()).unwrap_or(i64::MAX))
}

#[cfg(test)]
mod tests {
    use super::*;

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
        for bad in ["", "now", "2026-13-01", "2026-11-21T25:00:00Z", "70-01-01"] {
            assert!(parse_rfc3339(bad).is_err(), "{bad:?}");
        }
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

    #[test]
    fn a_time_without_a_zone_is_utc_and_out_of_range_ones_are_refused() {
        assert_eq!(parse_rfc3339("1970-01-01 00:00:01"), Ok(1_000_000_000));
        assert_eq!(parse_rfc3339("1970-01-01T00:01"), Ok(60_000_000_000));
        assert_eq!(parse_rfc3339("2000-02-29"), Ok(951_782_400_000_000_000));
        for bad in [
            "9999-12-31T00:00:00Z",
            "1000-01-01",
            "2026-02-30",
            "2026-11-21T10:00:00+25:00",
            "2026-1-21",
            "2026-11-21T1:00",
        ] {
            assert!(parse_rfc3339(bad).is_err(), "{bad:?}");
        }
        assert!(looks_like_a_date("2026-11-21") && !looks_like_a_date("1763756103"));
        assert!(!looks_like_a_date("now-1h"));
    }

    proptest::proptest! {
        #[test]
        fn any_text_parses_or_is_refused_without_a_panic(text in ".{0,40}") {
            let _ = parse_rfc3339(&text);
        }

        #[test]
        fn every_instant_round_trips(ns in i64::MIN / 2..i64::MAX / 2) {
            proptest::prop_assert_eq!(parse_rfc3339(&format_instant(ns)), Ok(ns));
        }
    }
}
