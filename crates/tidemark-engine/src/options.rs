use std::time::Duration;

use tidemark_storage::segment::SegmentOptions;

/// Tuning of a [`crate::Db`]. The defaults suit a server with a few GiB of memory.
#[derive(Debug, Clone)]
pub struct Options {
    /// Memtables are flushed to segments once they hold this many bytes in all.
    pub memtable_bytes: usize,
    /// Appends wait while flushes are behind by more than this many bytes, so memory stays
    /// bounded under any load; after `stall_timeout` they fail with `Overloaded`.
    pub max_unflushed_bytes: usize,
    pub stall_timeout: Duration,
    /// A new log file is started once the current one exceeds this size.
    pub log_file_bytes: u64,
    /// Events older than the stream's newest event minus this window are refused
    /// (`None` accepts any order).
    pub out_of_order_window_ns: Option<i64>,
    /// Events whose tstart is more than this far ahead of the clock of the process that
    /// accepts them are refused (`None` accepts any). Without this bound one event dated in
    /// the year 2100 would move the out-of-order window there and refuse every current
    /// event. Checked where a write is accepted, never when a log is replayed or a
    /// replicated entry applied, so replicas stay deterministic.
    pub max_future_ns: Option<i64>,
    /// The largest batch accepted, in bytes of its log record (at most 1 GiB, the log's
    /// frame limit). Larger batches are refused whole with `BatchTooLarge`.
    pub max_batch_bytes: usize,
    /// The longest STRING or BYTES value accepted.
    pub max_value_bytes: usize,
    pub segment: SegmentOptions,
    /// Merge a run of at least this many adjacent small segments of a stream (0 = never).
    pub compact_min_segments: usize,
    /// Segments with fewer events than this, and fewer file bytes than
    /// `compact_small_bytes`, are small.
    pub compact_small_events: u64,
    pub compact_small_bytes: u64,
    /// Segments expected to be smaller than this (a flushed memtable, or a compaction's
    /// inputs) are written side by side into shared pack files instead of a file each
    /// (0 = every segment gets its own file).
    pub pack_below_bytes: usize,
}

impl Default for Options {
    fn default() -> Self {
        Options {
            memtable_bytes: 64 << 20,
            max_unflushed_bytes: 256 << 20,
            stall_timeout: Duration::from_secs(30),
            log_file_bytes: 64 << 20,
            out_of_order_window_ns: Some(3_600_000_000_000),
            max_future_ns: Some(24 * 3_600_000_000_000),
            max_batch_bytes: 256 << 20,
            max_value_bytes: 64 << 10,
            segment: SegmentOptions::default(),
            compact_min_segments: 4,
            compact_small_events: 1_000_000,
            compact_small_bytes: 16 << 20,
            pack_below_bytes: 4 << 20,
        }
    }
}
