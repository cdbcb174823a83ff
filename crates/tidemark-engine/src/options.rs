//! What a database is opened with: [`Options`] and the tier's [`TierOptions`], checked
//! together by [`Options::validate`]; and what bounds a spool ([`SpoolOptions`]).
//!
//! Must never know about: how a configuration file or command line spells them.

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
    /// Moves sealed segments to a bucket when set ([`crate::tier`], `docs/tiering.md`).
    pub tier: Option<TierOptions>,
}

/// Where and when sealed segments move to object storage ([`Options::tier`]).
#[derive(Debug, Clone)]
pub struct TierOptions {
    /// The bucket and prefix; the prefix belongs to this database alone (the sweeper deletes
    /// segment objects under it that the manifest does not name).
    pub bucket: tidemark_tier::BlockingBucket,
    /// A segment is uploaded once its newest event is older than this, by the clock.
    pub after: Duration,
    /// Bytes of tiered segments kept in memory for reads, in pages of
    /// [`crate::tier::PAGE_BYTES`] (0: every read goes to the bucket).
    pub cache_bytes: u64,
    /// How often the tiering thread looks for segments to upload, and retries after a
    /// failure (doubling while failures repeat, up to 30 times this).
    pub interval: Duration,
}

impl TierOptions {
    /// The same tier under `sub` inside its prefix: a cluster node's part of it, and one
    /// generation of that node's data (a prefix belongs to one database).
    pub fn within(&self, sub: &str) -> std::result::Result<TierOptions, tidemark_tier::TierError> {
        Ok(TierOptions {
            bucket: self.bucket.within(sub)?,
            ..self.clone()
        })
    }
}

/// What bounds a spool ([`crate::Spool`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct SpoolOptions {
    /// Appends are refused (`Overloaded`: retryable) while the log holds this many bytes
    /// not yet released.
    pub max_bytes: u64,
    /// Appends are refused the same way while the spool's filesystem has fewer bytes free
    /// than this, so that a full disk is met with a retryable refusal, never a failed write.
    pub min_free_bytes: u64,
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
            tier: None,
        }
    }
}

impl Options {
    /// Checks that the options make sense together, so that a mistake is an error at open
    /// instead of a value silently clamped somewhere inside.
    pub fn validate(&self) -> Result<(), crate::OpenError> {
        use tidemark_storage::log::MAX_PAYLOAD;
        use tidemark_storage::segment::MAX_BLOCK_EVENTS;
        let segment = &self.segment;
        let rules: [(bool, String); 12] = [
            (
                self.memtable_bytes > 0,
                "memtable_bytes must be above 0".into(),
            ),
            (
                self.max_unflushed_bytes >= self.memtable_bytes,
                format!(
                    "max_unflushed_bytes ({}) must be at least memtable_bytes ({})",
                    self.max_unflushed_bytes, self.memtable_bytes
                ),
            ),
            (
                self.log_file_bytes > 0,
                "log_file_bytes must be above 0".into(),
            ),
            (
                self.out_of_order_window_ns.is_none_or(|w| w >= 0),
                "out_of_order_window_ns must not be negative".into(),
            ),
            (
                self.max_future_ns.is_none_or(|f| f >= 0),
                "max_future_ns must not be negative".into(),
            ),
            (
                (1..=MAX_PAYLOAD).contains(&self.max_batch_bytes),
                format!("max_batch_bytes must be 1..={MAX_PAYLOAD} (the log's record limit)"),
            ),
            (
                self.max_value_bytes > 0,
                "max_value_bytes must be above 0".into(),
            ),
            (
                (1..=MAX_BLOCK_EVENTS).contains(&segment.max_block_events),
                format!("segment.max_block_events must be 1..={MAX_BLOCK_EVENTS}"),
            ),
            (
                segment.max_block_bytes > 0 && segment.block_align_ns >= 0,
                "segment.max_block_bytes must be above 0 and block_align_ns not negative".into(),
            ),
            (
                segment.group_size > 0 && segment.encode_threads > 0,
                "segment.group_size and encode_threads must be above 0".into(),
            ),
            (
                segment.pco_level <= 12,
                "segment.pco_level must be 0..=12".into(),
            ),
            (
                self.tier.as_ref().is_none_or(|t| !t.interval.is_zero()),
                "tier.interval must be above 0".into(),
            ),
        ];
        match rules.into_iter().find(|(holds, _)| !holds) {
            Some((_, why)) => Err(crate::OpenError::InvalidOptions(why)),
            None => Ok(()),
        }
    }
}

impl SpoolOptions {
    /// Checks that the bounds make sense, as [`Options::validate`] does the rest.
    pub fn validate(&self) -> Result<(), crate::OpenError> {
        if self.max_bytes == 0 {
            return Err(crate::OpenError::InvalidOptions(
                "spool.max_bytes must be above 0".into(),
            ));
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_defaults_are_valid_and_contradictions_are_errors() {
        Options::default().validate().unwrap();
        let bad = [
            Options {
                memtable_bytes: 0,
                ..Options::default()
            },
            Options {
                max_unflushed_bytes: 1,
                ..Options::default()
            },
            Options {
                max_batch_bytes: tidemark_storage::log::MAX_PAYLOAD + 1,
                ..Options::default()
            },
            Options {
                max_value_bytes: 0,
                ..Options::default()
            },
            Options {
                out_of_order_window_ns: Some(-1),
                ..Options::default()
            },
        ];
        for options in bad {
            let e = options.validate().unwrap_err();
            assert!(matches!(e, crate::OpenError::InvalidOptions(_)), "{e}");
        }
        let mut segment = Options::default();
        segment.segment.max_block_events = 0;
        assert!(segment.validate().is_err());
    }
}
