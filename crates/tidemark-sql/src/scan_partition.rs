//! A stream's scan as DataFusion runs it: the engine reads on a blocking thread and hands
//! batches over a small channel, so a scan holds a few batches in memory however many it
//! reads. It reads oldest first (the engine's order), or newest first for
//! `ORDER BY tstart DESC LIMIT n` ([`crate::newest_first`]).
//!
//! The engine only reads forwards. Newest first is therefore read in time windows from the
//! newest event back: each window is scanned forwards and sent reversed, and each window
//! is twice as wide as the one after it (up to a bound), so a query that stops after a few
//! rows reads about the newest blocks only, and one that reads everything reads each event
//! once, in a few scans per million events. Windows are disjoint, so no event is sent twice.

use std::fmt;
use std::sync::Arc;

use datafusion::arrow::array::{RecordBatch, UInt32Array};
use datafusion::arrow::compute::take_record_batch;
use datafusion::arrow::datatypes::SchemaRef;
use datafusion::common::{DataFusionError, Result};
use datafusion::execution::memory_pool::{MemoryConsumer, MemoryReservation};
use datafusion::execution::TaskContext;
use datafusion::physical_plan::stream::RecordBatchReceiverStreamBuilder;
use datafusion::physical_plan::streaming::PartitionStream;
use datafusion::physical_plan::SendableRecordBatchStream;
use tidemark_engine::{Engine, ScanRequest, TimeRange};
use tokio::sync::mpsc::Sender;

use crate::convert::to_record_batch;

/// Batches a scan may have decoded ahead of the query.
const SCAN_AHEAD: usize = 2;

/// About how many events the newest window holds, as far as the stream's span and count
/// tell: a block or so, enough for most `LIMIT`s in one scan.
const FIRST_WINDOW_EVENTS: f64 = 16_384.0;

/// How many times the first window the widest is: a window's rows wait in memory, so a
/// scan that reads far back (a rare value, a large `LIMIT`) holds about a million events
/// of an evenly spread stream at a time, not half the stream (and [`WINDOW_BYTES`] at most
/// of any other).
const WIDEST_WINDOW: i64 = 64;

/// The most bytes of rows a window holds before it is read again at half its width: the
/// windows' widths come from the stream's average density, and a stream's newest hour may
/// be far denser than its average.
const WINDOW_BYTES: usize = 64 << 20;

/// The order a scan's rows come in.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Direction {
    OldestFirst,
    NewestFirst,
}

/// The one partition of a stream's scan.
#[derive(Clone)]
pub struct ScanPartition {
    engine: Engine,
    stream: String,
    request: ScanRequest,
    schema: SchemaRef,
    direction: Direction,
}

impl fmt::Debug for ScanPartition {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("ScanPartition")
            .field("stream", &self.stream)
            .field("range", &self.request.range)
            .field("filter", &self.request.filter)
            .field("direction", &self.direction)
            .finish()
    }
}

impl ScanPartition {
    /// `request` of `stream`, its rows as `schema` (the request's fields and time columns).
    pub fn new(
        engine: Engine,
        stream: String,
        request: ScanRequest,
        schema: SchemaRef,
    ) -> ScanPartition {
        ScanPartition {
            engine,
            stream,
            request,
            schema,
            direction: Direction::OldestFirst,
        }
    }

    pub fn direction(&self) -> Direction {
        self.direction
    }

    /// The same scan, newest event first.
    pub fn newest_first(&self) -> ScanPartition {
        ScanPartition {
            direction: Direction::NewestFirst,
            ..self.clone()
        }
    }
}

impl PartitionStream for ScanPartition {
    fn schema(&self) -> &SchemaRef {
        &self.schema
    }

    fn execute(&self, ctx: Arc<TaskContext>) -> SendableRecordBatchStream {
        let mut builder = RecordBatchReceiverStreamBuilder::new(self.schema.clone(), SCAN_AHEAD);
        let tx = builder.tx();
        let scan = self.clone();
        // The engine reads files and decodes blocks: work for a blocking thread, not for the
        // runtime's workers.
        builder.spawn_blocking(move || match scan.direction {
            Direction::OldestFirst => scan.send_oldest_first(&tx),
            Direction::NewestFirst => {
                // A window's batches wait in memory to be sent reversed: the query's memory
                // bound counts them.
                let mut held = MemoryConsumer::new("newest-first scan").register(ctx.memory_pool());
                scan.send_newest_first(&tx, &mut held)
            }
        });
        builder.build()
    }
}

/// Whether the query still reads: it stops at a `LIMIT` met or a client gone; a window
/// whose rows would take more than [`WINDOW_BYTES`] is read again, narrower.
enum Reading {
    Yes,
    Stopped,
    TooMuch,
}

impl ScanPartition {
    fn send_oldest_first(&self, tx: &Sender<Result<RecordBatch>>) -> Result<()> {
        self.scan_window(self.request.range, |record| Ok(send(tx, record)))?;
        Ok(())
    }

    fn send_newest_first(
        &self,
        tx: &Sender<Result<RecordBatch>>,
        held: &mut MemoryReservation,
    ) -> Result<()> {
        let info = self.engine.stream_info(&self.stream).map_err(external)?;
        let Some((first, last)) = info.time_range else {
            return Ok(());
        };
        let scanned = self.request.range.intersect(TimeRange::new(first, last));
        let first_width = first_window_width(info.event_count, (first, last));
        let mut windows = Windows::new(scanned, first_width);
        while let Some(window) = windows.next() {
            let mut records = Vec::new();
            let mut bytes = 0;
            let read = self.scan_window(window, |record| {
                if tx.is_closed() {
                    return Ok(Reading::Stopped);
                }
                let size = record.get_array_memory_size();
                bytes += size;
                // Over the window's bound, or over what the query may hold: narrower, as
                // long as the window spans more than an instant (whose rows all come
                // together; the query's bound then refuses them).
                if bytes > WINDOW_BYTES || held.try_grow(size).is_err() {
                    if window.min < window.max {
                        return Ok(Reading::TooMuch);
                    }
                    held.try_grow(size)?;
                }
                records.push(record);
                Ok(Reading::Yes)
            })?;
            match read {
                Reading::Stopped => return Ok(()),
                Reading::TooMuch => {
                    // Denser than the stream's average: the newer half, then on from there.
                    held.free();
                    windows.again_narrower(window);
                    continue;
                }
                Reading::Yes => {}
            }
            for record in records.into_iter().rev() {
                if let Reading::Stopped = send(tx, reversed(&record)?) {
                    return Ok(());
                }
            }
            held.free();
        }
        Ok(())
    }

    /// Scans `range` of the request oldest first, handing each batch to `each` until it
    /// says anything but [`Reading::Yes`], which is then the answer.
    fn scan_window(
        &self,
        range: TimeRange,
        mut each: impl FnMut(RecordBatch) -> Result<Reading>,
    ) -> Result<Reading> {
        let request = ScanRequest {
            range,
            ..self.request.clone()
        };
        let scan = self.engine.scan(&self.stream, &request).map_err(external)?;
        for batch in scan {
            let record = to_record_batch(batch.map_err(external)?, &self.schema)?;
            match each(record)? {
                Reading::Yes => {}
                // Not another row once stopped or found too much: a window read in part
                // would send rows with a gap in them.
                stop => return Ok(stop),
            }
        }
        Ok(Reading::Yes)
    }
}

fn send(tx: &Sender<Result<RecordBatch>>, record: RecordBatch) -> Reading {
    match tx.blocking_send(Ok(record)) {
        Ok(()) => Reading::Yes,
        Err(_) => Reading::Stopped,
    }
}

/// The time windows a newest-first scan of `scanned` reads, newest first: adjacent, each
/// twice as wide as the one before it up to [`WIDEST_WINDOW`] times the first, the last
/// ending at `scanned.min`.
struct Windows {
    scanned: TimeRange,
    /// Where the next window ends (inclusive); `None` once `scanned.min` was reached.
    newest: Option<i64>,
    width: i64,
    widest: i64,
}

impl Windows {
    fn new(scanned: TimeRange, first_width: i64) -> Windows {
        assert!(first_width > 0, "a window holds an instant at least");
        Windows {
            scanned,
            newest: (!scanned.is_empty()).then_some(scanned.max),
            width: first_width,
            widest: first_width.saturating_mul(WIDEST_WINDOW),
        }
    }
}

impl Windows {
    /// After `window` (the last one given) held too much: its newer half next, and windows
    /// doubling on from there.
    fn again_narrower(&mut self, window: TimeRange) {
        assert!(window.min < window.max, "an instant cannot be narrowed");
        let width = (i128::from(window.max) - i128::from(window.min) + 1) / 2;
        self.newest = Some(window.max);
        // Half of a width of at most 2^64 fits in an i64.
        self.width = i64::try_from(width).unwrap_or(i64::MAX).max(1);
    }
}

impl Iterator for Windows {
    type Item = TimeRange;

    fn next(&mut self) -> Option<TimeRange> {
        let newest = self.newest?;
        assert!(newest >= self.scanned.min && newest <= self.scanned.max);
        let oldest = newest.saturating_sub(self.width - 1).max(self.scanned.min);
        self.newest = (oldest > self.scanned.min).then(|| oldest - 1);
        self.width = self.width.saturating_mul(2).min(self.widest);
        Some(TimeRange::new(oldest, newest))
    }
}

/// The nanoseconds of the newest window: about [`FIRST_WINDOW_EVENTS`] of `events` spread
/// evenly over `span`, at least 1.
fn first_window_width(events: u64, (first, last): (i64, i64)) -> i64 {
    let span = (i128::from(last) - i128::from(first) + 1) as f64;
    let share = (FIRST_WINDOW_EVENTS / events.max(1) as f64).min(1.0);
    // A float beyond i64's range converts to i64::MAX: the window is then the whole span.
    ((span * share).ceil() as i64).max(1)
}

/// `record`'s rows last to first.
fn reversed(record: &RecordBatch) -> Result<RecordBatch> {
    let rows = u32::try_from(record.num_rows())
        .map_err(|_| DataFusionError::Internal("a batch of over 2^32 rows".into()))?;
    let indices = UInt32Array::from_iter_values((0..rows).rev());
    Ok(take_record_batch(record, &indices)?)
}

fn external(e: impl std::error::Error + Send + Sync + 'static) -> DataFusionError {
    DataFusionError::External(Box::new(e))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn windows_tile_the_range_newest_first_and_double() {
        let ranges = [
            TimeRange::new(0, 0),
            TimeRange::new(-5, 1000),
            TimeRange::new(10, 17),
            TimeRange::new(i64::MIN, i64::MAX),
            TimeRange::new(i64::MAX - 3, i64::MAX),
        ];
        for scanned in ranges {
            for first in [1, 2, 3, 100, 1 << 58, i64::MAX] {
                let widest = i128::from(first.saturating_mul(WIDEST_WINDOW));
                let span = i128::from(scanned.max) - i128::from(scanned.min) + 1;
                // (A first window as the stream's count and span give it makes a few dozen
                // windows per million events; these are the combinations of that sort.)
                if span / widest > 10_000 {
                    continue;
                }
                let windows: Vec<TimeRange> = Windows::new(scanned, first).collect();
                assert_eq!(windows[0].max, scanned.max, "{scanned:?} {first}");
                assert_eq!(
                    windows.last().unwrap().min,
                    scanned.min,
                    "{scanned:?} {first}"
                );
                for pair in windows.windows(2) {
                    assert_eq!(pair[1].max, pair[0].min - 1, "adjacent: {pair:?}");
                }
                for (i, w) in windows.iter().enumerate() {
                    let width = i128::from(w.max) - i128::from(w.min) + 1;
                    let planned = (i128::from(first) << i.min(64)).min(widest);
                    assert!(width >= 1 && width <= planned, "{w:?}, window {i}");
                    if i + 1 < windows.len() {
                        assert_eq!(width, planned.min(i128::from(i64::MAX)), "{w:?}");
                    }
                }
            }
        }
        assert_eq!(Windows::new(TimeRange::new(5, 4), 1).count(), 0);
        // A window read again narrower: its newer half, then the rest, still adjacent.
        let mut windows = Windows::new(TimeRange::new(0, 99), 40);
        let first = windows.next().unwrap();
        assert_eq!(first, TimeRange::new(60, 99));
        windows.again_narrower(first);
        let rest: Vec<TimeRange> = windows.collect();
        assert_eq!(rest[0], TimeRange::new(80, 99));
        assert_eq!(rest[1], TimeRange::new(40, 79));
        assert_eq!(rest.last().unwrap().min, 0);
    }

    #[test]
    fn the_first_window_holds_about_a_block_of_an_even_stream() {
        // A million events over a million seconds: 16,384 of them in 16,384 s.
        let width = first_window_width(1_000_000, (0, 1_000_000_000_000_000 - 1));
        assert_eq!(width, 16_384_000_000_000);
        // Fewer events than a window: the whole span.
        assert_eq!(first_window_width(10, (5, 14)), 10);
        // Every event at one instant.
        assert_eq!(first_window_width(1_000_000, (7, 7)), 1);
        // The widest span there is does not overflow.
        assert!(first_window_width(1, (i64::MIN, i64::MAX)) == i64::MAX);
    }
}
