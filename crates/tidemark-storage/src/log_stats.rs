//! Counters of a log written with group commit ([`crate::group_commit`]), for monitoring:
//! group commits, records, bytes and the latency of each fsync as a histogram. Plain
//! atomics, updated once per group.
//!
//! Must never know about: what the records say, or who reads the counters.

use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

/// Upper bounds, in seconds, of the fsync latency buckets (the last bucket is unbounded).
pub const FSYNC_BUCKETS_SECONDS: [f64; 12] = [
    0.000_1, 0.000_25, 0.000_5, 0.001, 0.002_5, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 1.0,
];

/// A snapshot of the log's counters since the database was opened.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct LogStats {
    /// Group commits: one write and one fsync each.
    pub groups: u64,
    pub records: u64,
    pub bytes: u64,
    /// fsyncs per latency bucket of [`FSYNC_BUCKETS_SECONDS`], not cumulative; one more
    /// entry at the end for slower ones.
    pub fsync_buckets: Vec<u64>,
    pub fsync_seconds_total: f64,
}

/// The counters behind [`LogStats`], kept by the group-commit queue of every log (the
/// embedded write-ahead log and a cluster node's Raft log count the same way).
#[derive(Debug, Default)]
pub struct LogCounters {
    groups: AtomicU64,
    records: AtomicU64,
    bytes: AtomicU64,
    fsync_nanos: AtomicU64,
    buckets: [AtomicU64; FSYNC_BUCKETS_SECONDS.len() + 1],
}

impl LogCounters {
    pub fn record_group(&self, records: usize, bytes: u64, fsync: Duration) {
        self.groups.fetch_add(1, Ordering::Relaxed);
        self.records.fetch_add(records as u64, Ordering::Relaxed);
        self.bytes.fetch_add(bytes, Ordering::Relaxed);
        let nanos = u64::try_from(fsync.as_nanos()).unwrap_or(u64::MAX);
        self.fsync_nanos.fetch_add(nanos, Ordering::Relaxed);
        let seconds = fsync.as_secs_f64();
        let bucket = FSYNC_BUCKETS_SECONDS
            .iter()
            .position(|&le| seconds <= le)
            .unwrap_or(FSYNC_BUCKETS_SECONDS.len());
        self.buckets[bucket].fetch_add(1, Ordering::Relaxed);
    }

    pub fn snapshot(&self) -> LogStats {
        LogStats {
            groups: self.groups.load(Ordering::Relaxed),
            records: self.records.load(Ordering::Relaxed),
            bytes: self.bytes.load(Ordering::Relaxed),
            fsync_buckets: self
                .buckets
                .iter()
                .map(|b| b.load(Ordering::Relaxed))
                .collect(),
            fsync_seconds_total: self.fsync_nanos.load(Ordering::Relaxed) as f64 / 1e9,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn latencies_land_in_their_bucket() {
        let counters = LogCounters::default();
        counters.record_group(3, 100, Duration::from_micros(50));
        counters.record_group(1, 10, Duration::from_micros(1000));
        counters.record_group(1, 10, Duration::from_secs(2));
        let stats = counters.snapshot();
        assert_eq!((stats.groups, stats.records, stats.bytes), (3, 5, 120));
        assert_eq!(stats.fsync_buckets[0], 1);
        assert_eq!(stats.fsync_buckets[3], 1, "1 ms is in the ≤ 1 ms bucket");
        assert_eq!(stats.fsync_buckets[FSYNC_BUCKETS_SECONDS.len()], 1);
        assert!((stats.fsync_seconds_total - 2.00105).abs() < 1e-9);
    }
}
