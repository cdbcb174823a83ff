//! [`Partition`]: the time partitions of a stream. Time is cut into intervals of the
//! stream's partition duration, aligned to multiples of it from the Unix epoch (UTC), and a
//! segment written for the stream never holds events of two partitions. So an old
//! partition's segments age as a whole — they tier, fall under retention and are pruned by
//! a query of another day — however the events arrived (a backfill written beside live
//! events is cut apart from them when flushed).
//!
//! A duration is a partition if it divides a day into whole hours (1h, 2h, 3h, 4h, 6h,
//! 8h, 12h) or is a whole number of days up to [`Partition::MAX_DAYS`]: every partition
//! boundary is then an hour boundary, and every day boundary is a partition boundary or
//! lies inside a partition of whole days. Shorter partitions would cut a stream into
//! more segments than compaction can keep few.

use std::ops::Range;

use crate::CoreError;

const HOUR_NS: i64 = 3_600_000_000_000;
const DAY_NS: i64 = 24 * HOUR_NS;

/// A stream's partition duration, valid by construction ([`Partition::new`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, serde::Serialize, serde::Deserialize)]
#[serde(try_from = "i64", into = "i64")]
pub struct Partition {
    ns: i64,
}

impl Partition {
    /// A day: what streams created without a partition have, including every stream of
    /// logs and manifests written before partitions existed.
    pub const DAY: Partition = Partition { ns: DAY_NS };
    /// The longest partition, in days.
    pub const MAX_DAYS: i64 = 366;
    /// What a partition may be, for error messages.
    pub const ALLOWED: &str =
        "a partition divides a day into whole hours (1h, 2h, 3h, 4h, 6h, 8h, 12h) or is whole days (1d to 366d)";

    /// The partition of `ns` nanoseconds, or why it is not one.
    pub fn new(ns: i64) -> Result<Partition, CoreError> {
        let valid = if ns < DAY_NS {
            ns >= HOUR_NS && ns % HOUR_NS == 0 && DAY_NS % ns == 0
        } else {
            ns % DAY_NS == 0 && ns / DAY_NS <= Partition::MAX_DAYS
        };
        if valid {
            Ok(Partition { ns })
        } else {
            Err(CoreError::InvalidPartition(format!(
                "{}: {}",
                describe_ns(ns),
                Partition::ALLOWED
            )))
        }
    }

    pub fn ns(&self) -> i64 {
        self.ns
    }

    /// The number of the partition `ts` lies in (counted from the one starting at the
    /// epoch; negative before it).
    pub fn index(&self, ts: i64) -> i64 {
        ts.div_euclid(self.ns)
    }

    /// Whether events from `min_ts` to `max_ts` lie in one partition.
    pub fn holds(&self, min_ts: i64, max_ts: i64) -> bool {
        self.index(min_ts) == self.index(max_ts)
    }

    /// The rows of `sorted` (tstarts in ascending order) cut where a partition ends: one
    /// range per partition the rows touch, in order, together covering every row.
    pub fn cuts(&self, sorted: &[i64]) -> Vec<Range<usize>> {
        debug_assert!(sorted.is_sorted(), "cut unsorted tstarts");
        let mut cuts = Vec::new();
        let mut start = 0;
        while start < sorted.len() {
            let index = self.index(sorted[start]);
            let end = start + sorted[start..].partition_point(|&t| self.index(t) == index);
            cuts.push(start..end);
            start = end;
        }
        cuts
    }
}

impl Default for Partition {
    fn default() -> Partition {
        Partition::DAY
    }
}

impl TryFrom<i64> for Partition {
    type Error = CoreError;

    fn try_from(ns: i64) -> Result<Partition, CoreError> {
        Partition::new(ns)
    }
}

impl From<Partition> for i64 {
    fn from(partition: Partition) -> i64 {
        partition.ns
    }
}

/// As people write it: `1d`, `6h`, `7d`.
impl std::fmt::Display for Partition {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&describe_ns(self.ns))
    }
}

/// A duration in the largest of days, hours, seconds and nanoseconds that it is a whole
/// number of (for messages about durations that may not be partitions).
fn describe_ns(ns: i64) -> String {
    [(DAY_NS, "d"), (HOUR_NS, "h"), (1_000_000_000, "s")]
        .into_iter()
        .find(|&(unit, _)| ns != 0 && ns % unit == 0)
        .map_or_else(
            || format!("{ns}ns"),
            |(unit, name)| format!("{}{name}", ns / unit),
        )
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_allowed_text_names_the_longest_partition() {
        assert!(Partition::ALLOWED.contains(&format!("1d to {}d", Partition::MAX_DAYS)));
    }

    #[test]
    fn partitions_divide_a_day_into_hours_or_are_whole_days() {
        for hours in [1, 2, 3, 4, 6, 8, 12, 24, 48, 168, 24 * 366] {
            let p = Partition::new(hours * HOUR_NS).unwrap();
            assert_eq!(p.ns(), hours * HOUR_NS);
        }
        for ns in [
            0,
            -DAY_NS,
            HOUR_NS / 2,
            5 * HOUR_NS,
            36 * HOUR_NS,
            367 * DAY_NS,
            i64::MAX,
        ] {
            let error = Partition::new(ns).unwrap_err().to_string();
            assert!(error.contains("whole hours"), "{ns}: {error}");
        }
        assert!(Partition::new(5 * HOUR_NS)
            .unwrap_err()
            .to_string()
            .contains("5h"));
        assert_eq!(Partition::default(), Partition::DAY);
        assert_eq!(Partition::DAY.to_string(), "1d");
        assert_eq!(Partition::new(6 * HOUR_NS).unwrap().to_string(), "6h");
    }

    #[test]
    fn partitions_start_at_multiples_from_the_epoch() {
        let p = Partition::DAY;
        assert_eq!(p.index(0), 0);
        assert_eq!(p.index(DAY_NS - 1), 0);
        assert_eq!(p.index(DAY_NS), 1);
        assert_eq!(p.index(-1), -1);
        assert_eq!(p.index(i64::MIN), i64::MIN.div_euclid(DAY_NS));
        assert!(p.holds(DAY_NS, 2 * DAY_NS - 1));
        assert!(!p.holds(DAY_NS - 1, DAY_NS));
    }

    #[test]
    fn cuts_cover_the_rows_one_partition_each() {
        let p = Partition::new(HOUR_NS).unwrap();
        let ts = [-1, 0, 1, HOUR_NS - 1, 5 * HOUR_NS, 5 * HOUR_NS, 6 * HOUR_NS];
        assert_eq!(p.cuts(&ts), vec![0..1, 1..4, 4..6, 6..7]);
        assert_eq!(p.cuts(&[]), Vec::<Range<usize>>::new());
        assert_eq!(p.cuts(&[7]), vec![0..1]);
    }

    #[test]
    fn a_partition_is_stored_as_its_nanoseconds_and_checked_when_read() {
        let json = serde_json::to_string(&Partition::new(HOUR_NS).unwrap()).unwrap();
        assert_eq!(json, HOUR_NS.to_string());
        let back: Partition = serde_json::from_str(&json).unwrap();
        assert_eq!(back.ns(), HOUR_NS);
        assert!(serde_json::from_str::<Partition>("5").is_err());
    }
}
