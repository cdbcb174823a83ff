//! Reads by position: a stream's events after a position, in the order the stream gave
//! them positions (the order their appends were applied), for consumers that follow a
//! stream and resume exactly where they left off (see `StreamState::next_position`).
//!
//! A read takes a snapshot of the stream as a scan does, then answers one window of
//! positions, `(after, after + limit]`, without holding any lock. An appended batch holds
//! consecutive positions in row order; a segment block's footer entry says the least and
//! greatest position it holds, so only blocks that overlap the window are decoded.
//!
//! Every applied event gets the next position and positions leave only with their events
//! (a clear, retention, a dropped segment), so a position the stream gave that the read
//! does not find was removed: the read says so ([`EngineError::PositionsRemoved`], naming
//! the earliest position held after it) rather than jump over it.
//!
//! Must never know about: transports, consumers' names or their committed positions.

use std::sync::Arc;

use tidemark_core::{BatchBuilder, ColumnData, EventBatch, Schema, Timestamp};
use tidemark_storage::segment::Extras;

use crate::block_cache::BlockCache;
use crate::engine::Engine;
use crate::error::{EngineError, Result};
use crate::memtable::MemBatch;
use crate::segment::Segment;
use crate::state::ConsumerInfo;

/// What to read by position.
#[derive(Debug, Clone)]
pub struct PositionRequest {
    /// Read the events after this position; `None`: from the earliest the stream holds.
    pub after: Option<u64>,
    /// The most events to answer (at least 1).
    pub limit: usize,
    /// The most bytes of values to answer (8 bytes a value, and a string's or byte array's
    /// length), so that what a reader holds does not grow with the events' size;
    /// an event larger than this is answered alone.
    pub max_bytes: usize,
}

impl PositionRequest {
    /// What a reader holds at most by default: 4 MiB of values per read.
    pub const DEFAULT_MAX_BYTES: usize = 4 << 20;

    /// The events after `after` (`None`: from the earliest held), at most `limit` of them
    /// and [`PositionRequest::DEFAULT_MAX_BYTES`].
    pub fn after(after: Option<u64>, limit: usize) -> PositionRequest {
        PositionRequest {
            after,
            limit,
            max_bytes: PositionRequest::DEFAULT_MAX_BYTES,
        }
    }
}

/// The answer to a [`PositionRequest`].
#[derive(Debug, Clone)]
pub struct PositionRead {
    /// The events found, in position order, each with its position
    /// ([`EventBatch::position_at`]); at most `limit`, empty when the reader is caught up.
    pub events: EventBatch,
    /// The position the stream gives its next event: every event before it that is held
    /// was visible to this read.
    pub next_position: u64,
}

impl PositionRead {
    /// The position to read after next: the last event's, or where the read started.
    pub fn last_position(&self) -> Option<u64> {
        self.events
            .len()
            .checked_sub(1)
            .and_then(|r| self.events.position_at(r))
    }
}

/// A stream's sources as a read by position sees them, taken under the state lock.
struct Snapshot {
    schema: Arc<Schema>,
    segments: Vec<Arc<Segment>>,
    memory: Vec<Arc<MemBatch>>,
    next_position: u64,
}

impl Engine {
    /// The events of `stream` after `request.after`, in position order: the read a
    /// consumer repeats, each time after the last position it was given.
    pub fn read_positions(&self, stream: &str, request: &PositionRequest) -> Result<PositionRead> {
        let snapshot = self.position_snapshot(stream)?;
        let next = snapshot.next_position;
        let first = match request.after {
            Some(after) if after >= next => {
                return Err(EngineError::InvalidRequest(format!(
                    "stream {stream:?} has not given position {after}: its next event gets \
                     {next} (a stream dropped and created again counts from 0)"
                )))
            }
            Some(after) => after + 1,
            None => snapshot.earliest().unwrap_or(next),
        };
        let window = first..first.saturating_add(request.limit.max(1) as u64);
        let blocks = &self.shared().position_blocks;
        let found = snapshot.read(blocks, window, request.max_bytes)?;
        let positions: Vec<Option<u64>> = (0..found.events.len())
            .map(|r| found.events.position_at(r))
            .collect();
        // Each applied event got its own position: none is held twice.
        assert!(
            positions.windows(2).all(|w| w[0] < w[1]),
            "a read by position found a position twice, or one without an event's position"
        );
        // Up to the first position the stream gave and no longer holds (retention may drop
        // a segment of old events appended after newer ones): the next read starts there,
        // and is told so, rather than this one jump over it.
        let consecutive = (0..positions.len())
            .take_while(|&r| positions[r] == Some(first + r as u64))
            .count();
        let answered = fitting(&found.events, request.max_bytes).min(consecutive);
        if answered == 0 && first < next {
            let held = positions.first().copied().flatten();
            let held = held.or(found.beyond).unwrap_or(next);
            return Err(EngineError::PositionsRemoved {
                stream: stream.to_string(),
                from: first,
                earliest_held: (held < next).then_some(held),
                next_position: next,
            });
        }
        let events = if answered < found.events.len() {
            found.events.take(&(0..answered as u32).collect::<Vec<_>>())
        } else {
            found.events
        };
        Ok(PositionRead {
            events,
            next_position: next,
        })
    }

    /// The least position of `stream` whose event starts at or after `time` (nanoseconds):
    /// where a consumer that asks for the events "from a time" starts, as Kafka's
    /// offsets-for-times does. Events appended late (older than ones before them) may
    /// follow it. When no event held starts that late, the stream's next position: the
    /// consumer waits for what comes.
    pub fn first_position_from(&self, stream: &str, time: Timestamp) -> Result<u64> {
        let snapshot = self.position_snapshot(stream)?;
        let mut best: Option<u64> = None;
        let better = |best: &mut Option<u64>, p: u64| *best = Some(best.map_or(p, |b| b.min(p)));
        for m in &snapshot.memory {
            let Some(first) = m.first_position else {
                continue;
            };
            if m.summary.max_ts < time {
                continue;
            }
            if let Some(row) = m.batch.tstart().iter().position(|&t| t >= time) {
                better(&mut best, first + row as u64);
            }
        }
        let extras = Extras {
            tend: false,
            positions: true,
        };
        // Blocks by their least position: once that reaches the best found, no block
        // after it can hold a lower one, so a stream appended in time order decodes one
        // or two blocks, not every block after `time`.
        let mut blocks: Vec<(u64, &Arc<Segment>, usize)> = snapshot
            .segments
            .iter()
            .flat_map(|s| {
                s.meta.blocks.iter().enumerate().filter_map(move |(i, b)| {
                    let (least, _) = b.positions?;
                    (b.summary.max_ts >= time).then_some((least, s, i))
                })
            })
            .collect();
        blocks.sort_unstable_by_key(|&(least, _, _)| least);
        for (least, segment, index) in blocks {
            if best.is_some_and(|b| b <= least) {
                break;
            }
            let file = segment.open()?;
            let decoded =
                segment
                    .meta
                    .read_block_with(&file, index, &snapshot.schema, &[], extras)?;
            let found = (0..decoded.len())
                .filter(|&r| decoded.tstart()[r] >= time)
                .filter_map(|r| decoded.position_at(r))
                .min();
            if let Some(p) = found {
                better(&mut best, p);
            }
        }
        // What is found was given by the stream: below its next position.
        assert!(
            best.is_none_or(|p| p < snapshot.next_position),
            "a position found from a time at or past the stream's next position"
        );
        Ok(best.unwrap_or(snapshot.next_position))
    }

    /// The named consumers of `stream`, by name.
    pub fn consumers(&self, stream: &str) -> Result<Vec<ConsumerInfo>> {
        let state = self.shared().read();
        let s = state
            .stream(stream)
            .ok_or_else(|| EngineError::UnknownStream(stream.to_string()))?;
        Ok(s.consumer_infos())
    }

    /// The position consumer `consumer` of `stream` has read to; `None` for a consumer the
    /// stream does not know (one that never committed, or was forgotten).
    pub fn consumer_position(&self, stream: &str, consumer: &str) -> Result<Option<u64>> {
        let state = self.shared().read();
        let s = state
            .stream(stream)
            .ok_or_else(|| EngineError::UnknownStream(stream.to_string()))?;
        Ok(s.consumers.get(consumer).copied())
    }

    /// The next position of `stream`, watched: it changes once an append to the stream is
    /// applied (durable, and on a cluster committed) and visible to reads, and the watch
    /// closes when the stream is dropped. Mark it seen before a read, then wait for a
    /// change: an append between the read and the wait is not missed.
    pub fn watch_positions(&self, stream: &str) -> Result<tokio::sync::watch::Receiver<u64>> {
        let state = self.shared().read();
        let s = state
            .stream(stream)
            .ok_or_else(|| EngineError::UnknownStream(stream.to_string()))?;
        Ok(s.appended.subscribe())
    }

    fn position_snapshot(&self, stream: &str) -> Result<Snapshot> {
        let state = self.shared().read();
        let s = state
            .stream(stream)
            .ok_or_else(|| EngineError::UnknownStream(stream.to_string()))?;
        let next_position = s.next_position.ok_or_else(|| {
            EngineError::InvalidRequest(format!(
                "stream {stream:?} gives no positions: it was created on this cluster before \
                 streams had them (its replicas could not agree where to start counting); \
                 read it by time, or create a new stream"
            ))
        })?;
        Ok(Snapshot {
            schema: s.schema.clone(),
            segments: s.segments.clone(),
            memory: s
                .memtables()
                .flat_map(|m| m.batches.iter().cloned())
                .collect(),
            next_position,
        })
    }
}

/// Events found in a window, and the least position held after it among what was looked at.
struct Found {
    events: EventBatch,
    beyond: Option<u64>,
}

impl Snapshot {
    /// The least position the stream still holds.
    fn earliest(&self) -> Option<u64> {
        let blocks = self.segments.iter().flat_map(|s| &s.meta.blocks);
        let in_segments = blocks.filter_map(|b| b.positions.map(|(least, _)| least));
        let in_memory = self.memory.iter().filter_map(|m| m.first_position);
        in_segments.chain(in_memory).min()
    }

    /// The events with positions in `window`, sorted by position, holding about
    /// `max_bytes` of values: once what was collected passes that (twice that from the
    /// memtables' many small batches), the window's end is brought down to what the lowest
    /// positions collected fill, so a read holds at most about that plus one source's rows
    /// (a block, an appended batch), whatever its limit. Blocks are decoded through
    /// `blocks`, which keeps them for the reads that follow.
    fn read(
        &self,
        blocks: &BlockCache<Segment>,
        window: std::ops::Range<u64>,
        max_bytes: usize,
    ) -> Result<Found> {
        let (lo, mut hi) = (window.start, window.end - 1);
        let mut held = 0usize;
        let all_fields: Vec<usize> = (0..self.schema.len()).collect();
        let mut out = BatchBuilder::new(self.schema.clone(), 0);
        let mut beyond: Option<u64> = None;
        let mut note_beyond = |p: u64| beyond = Some(beyond.map_or(p, |b| b.min(p)));
        for m in &self.memory {
            let (Some(first), n) = (m.first_position, m.batch.len() as u64) else {
                continue;
            };
            if first > hi {
                note_beyond(first);
                continue;
            }
            if first + n <= lo {
                continue;
            }
            let rows =
                lo.saturating_sub(first) as usize..(hi.min(first + n - 1) - first + 1) as usize;
            let batch = m.batch_as(&self.schema)?;
            held += rows.clone().map(|r| row_bytes(&batch, r)).sum::<usize>();
            out.extend_numbered(&batch, rows, first)?;
            if first + n - 1 > hi {
                note_beyond(hi + 1);
            }
            if held > max_bytes.saturating_mul(2) {
                (out, hi, held) = shrink_window(out, hi, max_bytes);
            }
        }
        let extras = Extras {
            tend: true,
            positions: true,
        };
        // Blocks by their least position, so that what is collected comes in position order
        // (nothing to sort) and, once the bytes are there, the window's end comes down to
        // them and the blocks after it are never decoded: a consumer's read decodes the one
        // or two blocks it answers from (and those come from `blocks` when the last read
        // decoded them). Blocks whose ranges overlap (events appended out of time order,
        // compacted apart) are still all looked at up to the window's end. Only the blocks
        // that overlap the window are sorted: a stream of a terabyte has a quarter of a
        // million blocks, and a consumer reads it a few megabytes at a time.
        let mut candidates: Vec<(u64, &Arc<Segment>, usize)> = Vec::new();
        for segment in &self.segments {
            for (index, block) in segment.meta.blocks.iter().enumerate() {
                match block.positions {
                    Some((least, _)) if least > hi => note_beyond(least),
                    Some((least, greatest)) if greatest >= lo => {
                        candidates.push((least, segment, index));
                    }
                    _ => {}
                }
            }
        }
        candidates.sort_unstable_by_key(|&(least, ..)| least);
        for (least, segment, index) in candidates {
            if least > hi {
                // The window came down to the bytes found; sorted, every block after this one
                // starts past it too.
                note_beyond(least);
                break;
            }
            let decoded = blocks.get_or_decode(segment, index, self.schema.len(), || {
                segment
                    .meta
                    .read_block_with(&segment.open()?, index, &self.schema, &all_fields, extras)
                    .map_err(EngineError::from)
            })?;
            let mut rows = Vec::new();
            for row in 0..decoded.len() {
                match decoded.position_at(row) {
                    Some(p) if (lo..=hi).contains(&p) => rows.push(row as u32),
                    Some(p) if p > hi => note_beyond(p),
                    _ => {}
                }
            }
            let (Some(&first), Some(&last)) = (rows.first(), rows.last()) else {
                continue;
            };
            if (last - first) as usize + 1 == rows.len() {
                // A run of rows (the usual case: a block's positions are consecutive) is
                // copied once, without picking it out first.
                let run = first as usize..last as usize + 1;
                held += run.clone().map(|r| row_bytes(&decoded, r)).sum::<usize>();
                out.extend_from(&decoded, run)?;
            } else {
                let picked = decoded.take(&rows);
                held += (0..picked.len())
                    .map(|r| row_bytes(&picked, r))
                    .sum::<usize>();
                out.extend_from(&picked, 0..picked.len())?;
            }
            if held > max_bytes {
                (out, hi, held) = shrink_window(out, hi, max_bytes);
            }
        }
        Ok(Found {
            events: in_position_order(out.finish()),
            beyond,
        })
    }
}

/// How many of the first events of `batch` hold at most `max_bytes` of values (at least
/// one): 8 bytes a value (and the timestamp), and a string's or byte array's length.
fn fitting(batch: &EventBatch, max_bytes: usize) -> usize {
    let mut bytes = 0usize;
    for row in 0..batch.len() {
        bytes = bytes.saturating_add(row_bytes(batch, row));
        if bytes > max_bytes && row > 0 {
            return row;
        }
    }
    batch.len()
}

/// What the event at `row` counts against a read's bytes (see [`fitting`]).
fn row_bytes(batch: &EventBatch, row: usize) -> usize {
    let mut bytes = 8 * (1 + batch.columns().len());
    for column in batch.columns() {
        if let (ColumnData::String(v) | ColumnData::Bytes(v), Some(i)) =
            (column.data(), column.value_index(row))
        {
            bytes += v.get(i).len();
        }
    }
    bytes
}

/// The events collected so far cut to the lowest positions that fill `max_bytes` (at least
/// one), the window's new end, and the bytes they hold. The end comes down to just before the
/// first position cut, not to the last one kept: a position between them not collected yet
/// (in a block still to come) may fit where the one cut did not. A later source then adds
/// only positions up to it, so nothing dropped could have been answered.
fn shrink_window(collected: BatchBuilder, hi: u64, max_bytes: usize) -> (BatchBuilder, u64, usize) {
    let collected = collected.finish();
    // Sorted and cut in one copy: the events are megabytes.
    let order = position_order(&collected);
    let mut held = 0usize;
    let mut kept = 0;
    for &row in &order {
        let bytes = row_bytes(&collected, row as usize);
        if kept > 0 && held.saturating_add(bytes) > max_bytes {
            break;
        }
        held += bytes;
        kept += 1;
    }
    let first_cut = order
        .get(kept)
        .map(|&row| collected.position_at(row as usize));
    let cut = collected.take(&order[..kept]);
    // Every collected event has a position, and at least one is kept.
    assert!(
        kept > 0 && cut.position_at(kept - 1).is_some() && first_cut.is_none_or(|p| p.is_some()),
        "a read's collected events without positions"
    );
    let hi = match first_cut.flatten() {
        Some(position) => position.saturating_sub(1).min(hi),
        None => hi,
    };
    (cut.into_builder(), hi, held)
}

/// The rows of `batch` in position order (every event has one).
fn position_order(batch: &EventBatch) -> Vec<u32> {
    let positions: Vec<Option<u64>> = (0..batch.len()).map(|r| batch.position_at(r)).collect();
    let mut order: Vec<u32> = (0..batch.len() as u32).collect();
    if !positions.windows(2).all(|w| w[0] < w[1]) {
        order.sort_unstable_by_key(|&r| positions[r as usize]);
    }
    order
}

/// `batch` sorted by position (every event has one).
fn in_position_order(batch: EventBatch) -> EventBatch {
    let order = position_order(&batch);
    if order.windows(2).all(|w| w[0] < w[1]) {
        return batch;
    }
    batch.take(&order)
}
