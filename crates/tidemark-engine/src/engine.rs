//! [`Engine`]: what every database reads — the catalog, stream info, flushing — and the
//! checks an append must pass before it is written. Scans (`scan`) and aggregates
//! (`aggregate`) add their own `impl Engine`.
//!
//! Must never know about: how a database is opened or fed (`db`, `replica`), the threads
//! it runs, any transport.

use std::path::Path;
use std::sync::Arc;

use tidemark_core::{BatchSummary, ColumnData, EventBatch, Partition, Retention, Schema};

use crate::error::{EngineError, Result};
use crate::options::Options;
use crate::shared::Shared;
use crate::tier::TierStatus;
use crate::tier_mover;

/// What [`Engine::stream_info`] reports.
#[derive(Debug, Clone, PartialEq)]
pub struct StreamInfo {
    pub name: String,
    pub schema: Arc<Schema>,
    /// Whether writes may add fields to the schema.
    pub evolving: bool,
    pub event_count: u64,
    /// The smallest and largest tstart, if the stream has events.
    pub time_range: Option<(i64, i64)>,
    /// Bytes of the stream's segments, those moved to the bucket included.
    pub bytes_on_disk: u64,
    /// Of those, the bytes of segments in the bucket (tiered).
    pub tiered_bytes: u64,
    /// Events in segments (the rest are in memtables, durable in the log).
    pub flushed_events: u64,
    /// Segment bytes per flushed event.
    pub compressed_bytes_per_event: Option<f64>,
    pub segments: usize,
    pub retention: Retention,
    /// The out-of-order window in force: the stream's own, else the database's (`None`:
    /// events may come in any order).
    pub out_of_order_window_ns: Option<i64>,
    /// Whether the window is the stream's own rather than the database's default.
    pub own_out_of_order_window: bool,
    /// Its time partitions: no segment holds events of two.
    pub partition: Partition,
    /// The position its next event gets (`None`: it gives none; docs/consuming.md).
    pub next_position: Option<u64>,
    /// Its named consumers, by name.
    pub consumers: Vec<crate::state::ConsumerInfo>,
}

/// What every database reads — the catalog, scans, aggregates — and the flush that turns
/// memtables into segments: the state machine that an embedded database ([`crate::Db`]) and a
/// cluster replica ([`crate::Replica`]) each feed from their log. A cheap handle
/// (`Clone`) that readers may keep: after its database closes, reads still answer and a
/// flush answers [`EngineError::Closed`].
#[derive(Clone)]
pub struct Engine {
    shared: Arc<Shared>,
}

impl Engine {
    /// The read handle of the database `shared` holds.
    pub(crate) fn new(shared: Arc<Shared>) -> Engine {
        Engine { shared }
    }

    pub fn dir(&self) -> &Path {
        &self.shared.dir
    }

    pub(crate) fn shared(&self) -> &Shared {
        &self.shared
    }

    /// The handle itself, for a thread that outlives this borrow (the flusher, the tiering
    /// thread, the log writer).
    pub(crate) fn shared_arc(&self) -> &Arc<Shared> {
        &self.shared
    }

    /// What tiering has done and holds; `None` when the database does not tier.
    pub fn tier_status(&self) -> Option<TierStatus> {
        tier_mover::status(&self.shared)
    }

    /// Why this database refuses writes, if it does: its log failed (a full disk, an I/O
    /// error) and it is read-only until reopened.
    pub fn write_failure(&self) -> Option<String> {
        self.shared.log.failure()
    }

    /// Counters of the database's log (group commits, bytes, fsync latencies): its own
    /// write-ahead log, or on a replica its cluster's Raft log.
    pub fn log_stats(&self) -> crate::LogStats {
        self.shared.log.stats()
    }

    /// Whether `self` and `other` are handles to the same database: what a reader that keeps
    /// something derived from one (a planned statement) checks before using it with the other.
    pub fn same_database(&self, other: &Engine) -> bool {
        Arc::ptr_eq(&self.shared, &other.shared)
    }

    /// Stream names in alphabetical order.
    pub fn list_streams(&self) -> Vec<String> {
        let mut names: Vec<String> = self.shared.read().by_name.keys().cloned().collect();
        names.sort();
        names
    }

    /// The schema of stream `name`: what a batch for it must be built against.
    pub fn stream_schema(&self, name: &str) -> Result<Arc<Schema>> {
        let state = self.shared.read();
        let stream = state
            .stream(name)
            .ok_or_else(|| EngineError::UnknownStream(name.to_string()))?;
        Ok(stream.schema.clone())
    }

    /// Whether writes may add fields to stream `name` (see [`crate::Db::add_fields`]).
    pub fn stream_is_evolving(&self, name: &str) -> Result<bool> {
        let state = self.shared.read();
        let stream = state
            .stream(name)
            .ok_or_else(|| EngineError::UnknownStream(name.to_string()))?;
        Ok(stream.evolving)
    }

    /// What stream `name` holds: events, time range, bytes on disk, retention.
    pub fn stream_info(&self, name: &str) -> Result<StreamInfo> {
        let state = self.shared.read();
        let s = state
            .stream(name)
            .ok_or_else(|| EngineError::UnknownStream(name.to_string()))?;
        let mut total: Option<BatchSummary> = None;
        let mut bytes_on_disk = 0;
        let mut tiered_bytes = 0;
        let mut flushed_events = 0;
        for segment in &s.segments {
            bytes_on_disk += segment.meta.bytes;
            if segment.tiered_object().is_some() {
                tiered_bytes += segment.meta.bytes;
            }
            flushed_events += segment.meta.event_count();
            for group in &segment.meta.groups {
                merge_into(&mut total, group);
            }
        }
        for memtable in s.memtables() {
            for b in &memtable.batches {
                merge_into(&mut total, &b.summary);
            }
        }
        Ok(StreamInfo {
            name: s.name.clone(),
            schema: s.schema.clone(),
            evolving: s.evolving,
            event_count: total.as_ref().map_or(0, |t| t.count),
            time_range: total.as_ref().map(|t| (t.min_ts, t.max_ts)),
            bytes_on_disk,
            tiered_bytes,
            flushed_events,
            compressed_bytes_per_event: (flushed_events > 0)
                .then(|| bytes_on_disk as f64 / flushed_events as f64),
            segments: s.segments.len(),
            retention: s.retention,
            out_of_order_window_ns: s
                .out_of_order_window(self.shared.options.out_of_order_window_ns),
            own_out_of_order_window: s.out_of_order_window_ns.is_some(),
            partition: s.partition,
            next_position: s.next_position,
            consumers: s.consumer_infos(),
        })
    }

    /// Flushes every memtable to segments and writes a manifest; returns when done.
    pub fn flush(&self) -> Result<()> {
        self.shared.checkpoint_and_wait()
    }

    /// Checks `batch` against the stream it is for (schema, value sizes, the out-of-order
    /// window). Validation runs outside the state lock.
    pub(crate) fn validate_append(&self, stream: &str, batch: &EventBatch) -> Result<()> {
        let target = {
            let state = self.shared.read();
            let s = state
                .stream(stream)
                .ok_or_else(|| EngineError::UnknownStream(stream.to_string()))?;
            Target {
                name: stream,
                schema: s.schema.clone(),
                evolving: s.evolving,
                max_ts: s.max_ts,
                window_ns: s.out_of_order_window(self.shared.options.out_of_order_window_ns),
            }
        };
        validate_batch(&target, batch, &self.shared.options)
    }
}

fn merge_into(total: &mut Option<BatchSummary>, next: &BatchSummary) {
    match total {
        Some(t) => t.merge(next),
        None => *total = Some(next.clone()),
    }
}

/// What an append checks a batch against, copied out of the state so that validation runs
/// without holding the lock.
pub(crate) struct Target<'a> {
    name: &'a str,
    schema: Arc<Schema>,
    evolving: bool,
    max_ts: Option<i64>,
    /// The stream's out-of-order window, or the database's (`None`: no window).
    window_ns: Option<i64>,
}

/// Checks what the batch type cannot: the stream's schema, value sizes, how far ahead of
/// the clock events are and the out-of-order window.
fn validate_batch(stream: &Target, batch: &EventBatch, options: &Options) -> Result<()> {
    check_schema(stream, batch)?;
    check_value_sizes(stream, batch, options.max_value_bytes)?;
    if let Some(max_ahead_ns) = options.max_future_ns {
        check_not_ahead(batch, max_ahead_ns)?;
    }
    if let Some(window_ns) = stream.window_ns {
        check_window(stream, batch, window_ns)?;
    }
    Ok(())
}

/// The batch is of the stream's schema — or, for an evolving stream, of one it grew from.
fn check_schema(stream: &Target, batch: &EventBatch) -> Result<()> {
    // A batch built before fields were added to an evolving stream is taken as it is: its
    // events read the added fields as null (`MemBatch::batch_as`).
    let fits = batch.schema().fields() == stream.schema.fields()
        || (stream.evolving && stream.schema.extends(batch.schema()));
    if fits {
        return Ok(());
    }
    Err(EngineError::Invalid(tidemark_core::CoreError::Shape(
        format!(
            "batch has schema {}, stream {:?} has {}",
            batch.schema(),
            stream.name,
            stream.schema
        ),
    )))
}

/// No STRING or BYTES value is longer than `max_value_bytes`.
fn check_value_sizes(stream: &Target, batch: &EventBatch, max_value_bytes: usize) -> Result<()> {
    for (column, field) in batch.columns().iter().zip(stream.schema.fields()) {
        if let ColumnData::String(values) | ColumnData::Bytes(values) = column.data() {
            if let Some((row, len)) = column
                .valid_rows(0..column.len())
                .zip(values.lengths())
                .find(|&(_, len)| len as usize > max_value_bytes)
            {
                return Err(EngineError::ValueTooLong {
                    row,
                    field: field.name.clone(),
                    len: len as usize,
                    max: max_value_bytes,
                });
            }
        }
    }
    Ok(())
}

/// No event starts more than `max_ahead_ns` after this process's clock.
fn check_not_ahead(batch: &EventBatch, max_ahead_ns: i64) -> Result<()> {
    let now = tidemark_core::time::now_ns();
    let latest_allowed = now.saturating_add(max_ahead_ns);
    match batch
        .tstart()
        .iter()
        .enumerate()
        .find(|&(_, &ts)| ts > latest_allowed)
    {
        Some((row, &tstart)) => Err(EngineError::TooFarAhead {
            row,
            tstart,
            now,
            max_ahead_ns,
        }),
        None => Ok(()),
    }
}

/// No event is older than `window_ns` before the newest one the stream holds or the batch
/// brought before it.
fn check_window(stream: &Target, batch: &EventBatch, window_ns: i64) -> Result<()> {
    let mut newest = stream.max_ts.unwrap_or(i64::MIN);
    for (row, &ts) in batch.tstart().iter().enumerate() {
        newest = newest.max(ts);
        let oldest_allowed = newest.saturating_sub(window_ns);
        if ts < oldest_allowed {
            return Err(EngineError::TooLate {
                stream: stream.name.to_string(),
                row,
                tstart: ts,
                oldest_allowed,
                window_ns,
            });
        }
    }
    Ok(())
}
