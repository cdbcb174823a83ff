//! Recently appended events of one stream that are durable in the log but not yet in a
//! segment. Appends are kept as the batches they arrived in (no copy), each with its summary
//! so that aggregates over whole batches need not touch the events.
//!
//! Must never know about: the catalog, segments, the log's files.

use std::borrow::Cow;
use std::ops::Range;
use std::sync::Arc;

use tidemark_core::command::BatchBytes;
use tidemark_core::{BatchBuilder, BatchSummary, Bounds, CoreError, EventBatch, Schema};

/// One appended batch, as it was logged.
#[derive(Debug)]
pub struct MemBatch {
    pub lsn: u64,
    /// The stream position of the batch's first event; the others follow it in row order
    /// (`None`: the stream gives none, see `StreamState::next_position`).
    pub first_position: Option<u64>,
    pub batch: EventBatch,
    /// The whole batch.
    pub summary: BatchSummary,
    /// Consecutive row ranges that together cover the batch, cut where a sorted batch
    /// crosses a multiple of the block alignment (as segment blocks are), so that bucketed
    /// aggregates over recent events also read summaries instead of rows.
    pub pieces: Vec<Piece>,
}

#[derive(Debug, Clone)]
pub struct Piece {
    pub rows: Range<usize>,
    pub summary: BatchSummary,
}

/// The most pieces a batch is cut into; a batch spanning more alignment boundaries (sparse
/// events) stays one piece rather than carrying a summary per few events.
const MAX_PIECES: usize = 16;

/// A batch with its summaries, computed before it enters the log so that no lock is held.
#[derive(Debug)]
pub struct Summarized {
    pub batch: EventBatch,
    pub summary: BatchSummary,
    pub pieces: Vec<Piece>,
    /// The alignment the pieces were cut at (0: none, the batch is one piece).
    pub align_ns: i64,
}

impl Summarized {
    /// `None` for an empty batch.
    pub fn new(batch: EventBatch, align_ns: i64) -> Option<Summarized> {
        let ts = batch.tstart();
        let mut cuts = vec![0];
        if align_ns > 0 && batch.is_sorted() {
            let mut start = 0;
            while start < ts.len() && cuts.len() <= MAX_PIECES {
                let bucket = ts[start].div_euclid(align_ns);
                start += ts[start..].partition_point(|t| t.div_euclid(align_ns) == bucket);
                cuts.push(start);
            }
        }
        // Pieces only when they cover every row: the loop stops early past MAX_PIECES.
        if cuts.last() != Some(&ts.len()) || cuts.len() <= 2 {
            cuts = vec![0, ts.len()];
        }
        let pieces: Vec<Piece> = cuts
            .windows(2)
            .filter_map(|w| {
                BatchSummary::of_rows(&batch, w[0]..w[1], Bounds::Skipped).map(|summary| Piece {
                    rows: w[0]..w[1],
                    summary,
                })
            })
            .collect();
        let mut summary = pieces.first()?.summary.clone();
        for piece in &pieces[1..] {
            summary.merge(&piece.summary);
        }
        Some(Summarized {
            batch,
            summary,
            pieces,
            align_ns,
        })
    }
}

/// Batches of at most this many events are added to the end of the memtable's last batch
/// rather than kept as batches of their own. A metrics agent sends one event per series
/// group per second; kept apart, each would carry its own column allocations and summaries
/// (for 365 float fields ~20 times the event's own bytes).
const SMALL_BATCH_EVENTS: usize = 64;
/// A batch grown from small ones stops growing at this many events or bytes.
const GROWN_BATCH_EVENTS: usize = 8192;
const GROWN_BATCH_BYTES: usize = 16 << 20;

impl MemBatch {
    pub fn new(lsn: u64, first_position: Option<u64>, events: Summarized) -> MemBatch {
        // The memtable budget counts what a batch holds; built row by row (line protocol,
        // JSON) it may have reserved twice that, which would stay until its flush.
        let mut batch = events.batch;
        batch.shrink_to_fit();
        MemBatch {
            lsn,
            first_position,
            batch,
            summary: events.summary,
            pieces: events.pieces,
        }
    }

    /// The batch under `schema`, the stream's schema now: as it is, or (appended before
    /// fields were added to the stream) a copy widened with nulls. Such batches live only
    /// until the memtable's next flush, so the copy is rare.
    pub fn batch_as(&self, schema: &Arc<Schema>) -> Result<Cow<'_, EventBatch>, CoreError> {
        if self.batch.schema().len() == schema.len() {
            return Ok(Cow::Borrowed(&self.batch));
        }
        Ok(Cow::Owned(self.batch.clone().widened(schema.clone())?))
    }

    /// Memory held, counting per-column and per-summary overheads, not just the values:
    /// the memtable budget must bound the process's memory for narrow and wide batches
    /// alike.
    pub fn memory_bytes(&self) -> usize {
        let columns = self.batch.columns().len() + 1;
        let summaries = 1 + self.pieces.len();
        std::mem::size_of::<MemBatch>()
            + self.batch.heap_bytes()
            + columns * (std::mem::size_of::<tidemark_core::Column>() + ALLOCATION_OVERHEAD)
            + summaries
                * self.summary.fields.len()
                * std::mem::size_of::<tidemark_core::FieldSummary>()
    }

    /// The position of the event after this batch's last, when it has positions.
    pub fn end_position(&self) -> Option<u64> {
        self.first_position
            .map(|first| first + self.batch.len() as u64)
    }

    /// Whether `events`, given positions from `first_position`, can be appended to this
    /// batch: both small, the result sorted, its positions still consecutive, and its
    /// pieces within bounds.
    fn can_append(&self, events: &Summarized, first_position: Option<u64>) -> bool {
        let fits = events.batch.len() <= SMALL_BATCH_EVENTS
            && self.end_position() == first_position
            && self.batch.len() + events.batch.len() <= GROWN_BATCH_EVENTS
            && self.batch.heap_bytes() + events.batch.heap_bytes() <= GROWN_BATCH_BYTES
            && (Arc::ptr_eq(self.batch.schema(), events.batch.schema())
                || self.batch.schema().fields() == events.batch.schema().fields())
            && self.summary.max_ts <= events.summary.min_ts
            && events.batch.is_sorted()
            && self.batch.is_sorted();
        if !fits {
            return false;
        }
        // The new batch's first piece may join this batch's last; its others stay apart.
        let joins = match (self.pieces.last(), events.pieces.first()) {
            (Some(last), Some(first)) => same_bucket(last, first, events.align_ns),
            _ => false,
        };
        self.pieces.len() + events.pieces.len() - usize::from(joins) <= MAX_PIECES
    }

    /// Appends `events` (checked by [`MemBatch::can_append`]); false, and nothing changed,
    /// if the columns refused.
    fn append(&mut self, events: &Summarized) -> bool {
        let rows = self.batch.len();
        let schema = self.batch.schema().clone();
        let mut builder =
            std::mem::replace(&mut self.batch, EventBatch::empty(schema)).into_builder();
        if builder
            .extend_from(&events.batch, 0..events.batch.len())
            .is_err()
        {
            // Not expected (same schema, bounded size): undo the part appended.
            builder.truncate(rows);
            self.batch = builder.finish();
            return false;
        }
        self.batch = builder.finish();
        self.summary.merge(&events.summary);
        for piece in &events.pieces {
            let moved = piece.rows.start + rows..piece.rows.end + rows;
            match self.pieces.last_mut() {
                Some(last) if same_bucket(last, piece, events.align_ns) => {
                    last.rows.end = moved.end;
                    last.summary.merge(&piece.summary);
                }
                _ => self.pieces.push(Piece {
                    rows: moved,
                    summary: piece.summary.clone(),
                }),
            }
        }
        true
    }
}

/// Roughly what the allocator adds to each allocation.
const ALLOCATION_OVERHEAD: usize = 16;

/// Whether `later` can join `earlier` as one piece: both in one alignment bucket (or no
/// alignment, where a batch is one piece anyway).
fn same_bucket(earlier: &Piece, later: &Piece, align_ns: i64) -> bool {
    align_ns <= 0
        || earlier.summary.min_ts.div_euclid(align_ns) == later.summary.max_ts.div_euclid(align_ns)
}

#[derive(Debug, Default)]
pub struct Memtable {
    pub batches: Vec<Arc<MemBatch>>,
    pub bytes: usize,
}

impl Memtable {
    pub fn is_empty(&self) -> bool {
        self.batches.is_empty()
    }

    pub fn first_lsn(&self) -> Option<u64> {
        self.batches.first().map(|b| b.lsn)
    }

    /// The position of the memtable's first event, when it has positions.
    pub fn first_position(&self) -> Option<u64> {
        self.batches.first().and_then(|b| b.first_position)
    }

    /// Adds an appended batch whose first event has position `first_position` (when its
    /// stream gives positions): to the end of the last batch when both are small and no
    /// scan holds the last one (see [`SMALL_BATCH_EVENTS`]), else as a batch of its own.
    pub fn push(&mut self, lsn: u64, first_position: Option<u64>, events: Summarized) {
        if let (Some(last), Some(first)) = (self.batches.last(), first_position) {
            // Positions strictly increase through a memtable: a reader from a position
            // relies on it.
            assert!(
                last.end_position().is_none_or(|end| end <= first),
                "positions from {first} appended after a batch ending at {:?}",
                last.end_position()
            );
        }
        if let Some(last) = self.batches.last_mut().and_then(Arc::get_mut) {
            if last.can_append(&events, first_position) {
                let before = last.memory_bytes();
                if last.append(&events) {
                    self.bytes += last.memory_bytes().saturating_sub(before);
                    return;
                }
            }
        }
        // The last batch grows no more: give back what its growth reserved.
        if let Some(last) = self.batches.last_mut().and_then(Arc::get_mut) {
            last.batch.shrink_to_fit();
        }
        let batch = MemBatch::new(lsn, first_position, events);
        self.bytes += batch.memory_bytes();
        self.batches.push(Arc::new(batch));
    }

    /// All events with their positions, sorted by tstart; events with equal tstart keep
    /// their insertion order.
    pub fn sorted_events(&self) -> Result<Option<EventBatch>, CoreError> {
        let Some(first) = self.batches.first() else {
            return Ok(None);
        };
        // Batches appended before fields were added to the stream are narrower than the
        // later ones: all are written under the widest schema, the newest.
        let schema = self
            .batches
            .iter()
            .map(|b| b.batch.schema())
            .max_by_key(|s| s.len())
            .unwrap_or(first.batch.schema())
            .clone();
        let total = self.batches.iter().map(|b| b.batch.len()).sum();
        // Concurrent appenders deliver sorted batches slightly out of order. If the batches
        // are sorted inside and their time spans do not touch, putting them in order of
        // their spans is the whole sort, and no two equal timestamps change their order.
        let mut order: Vec<&MemBatch> = self.batches.iter().map(|b| b.as_ref()).collect();
        order.sort_by_key(|b| b.summary.min_ts);
        let disjoint = order
            .windows(2)
            .all(|w| w[0].summary.max_ts < w[1].summary.min_ts)
            && order.iter().all(|b| b.batch.is_sorted());
        let values = |field: usize| {
            self.batches
                .iter()
                .filter_map(|b| b.batch.columns().get(field))
                .map(|column| column.data().len())
                .sum()
        };
        let mut builder = BatchBuilder::with_capacities(schema.clone(), total, values);
        let mut add = |b: &MemBatch| -> Result<(), CoreError> {
            let batch = b.batch_as(&schema)?;
            match b.first_position {
                Some(first) => builder.extend_numbered(&batch, 0..batch.len(), first),
                None => builder.extend_from(&batch, 0..batch.len()),
            }
        };
        if disjoint {
            order.into_iter().try_for_each(&mut add)?;
            return Ok(Some(builder.finish()));
        }
        self.batches.iter().try_for_each(|b| add(b))?;
        Ok(Some(builder.finish().sorted()))
    }
}

/// A summarised batch is logged as its batch.
impl BatchBytes for Summarized {
    fn put(&self, out: &mut Vec<u8>) -> std::result::Result<(), tidemark_core::bytes::TooLong> {
        self.batch.put(out)
    }
    fn size_hint(&self) -> usize {
        self.batch.size_hint()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use tidemark_core::{Schema, Value};

    fn memtable(batches: &[&[(i64, i64)]]) -> Memtable {
        let schema = Arc::new(Schema::parse_spec("V:LONG").unwrap());
        let mut m = Memtable::default();
        let mut position = 0;
        for (lsn, rows) in batches.iter().enumerate() {
            let mut b = BatchBuilder::new(schema.clone(), rows.len());
            for &(ts, v) in rows.iter() {
                b.push_row(ts, None, &[Value::Long(v)]).unwrap();
            }
            m.push(
                lsn as u64,
                Some(position),
                Summarized::new(b.finish(), 10).unwrap(),
            );
            position += rows.len() as u64;
        }
        m
    }

    fn events(m: &Memtable) -> Vec<(i64, Value)> {
        let b = m.sorted_events().unwrap().unwrap();
        (0..b.len())
            .map(|r| (b.tstart()[r], b.column(0).value(r)))
            .collect()
    }

    #[test]
    fn disjoint_batches_are_reordered_whole() {
        let m = memtable(&[&[(20, 1), (25, 2)], &[(0, 3), (5, 4)], &[(30, 5)]]);
        let got: Vec<i64> = events(&m).iter().map(|e| e.0).collect();
        assert_eq!(got, vec![0, 5, 20, 25, 30]);
    }

    #[test]
    fn touching_batches_keep_insertion_order_on_ties() {
        let m = memtable(&[&[(5, 1), (9, 2)], &[(0, 3), (5, 4)], &[(5, 5)]]);
        let got = events(&m);
        let ts: Vec<i64> = got.iter().map(|e| e.0).collect();
        assert_eq!(ts, vec![0, 5, 5, 5, 9]);
        let at_5: Vec<Value> = got
            .iter()
            .filter(|e| e.0 == 5)
            .map(|e| e.1.clone())
            .collect();
        assert_eq!(at_5, vec![Value::Long(1), Value::Long(4), Value::Long(5)]);
        // Each event keeps the position it was appended at: 0, 1 | 2, 3 | 4.
        let sorted = m.sorted_events().unwrap().unwrap();
        let positions: Vec<_> = (0..5).map(|r| sorted.position_at(r)).collect();
        assert_eq!(positions, [2, 0, 3, 4, 1].map(Some));
    }

    #[test]
    fn pieces_cover_the_batch() {
        let m = memtable(&[&[(1, 1), (12, 2), (13, 3), (35, 4)], &[(9, 1), (2, 2)]]);
        let sorted = &m.batches[0];
        let rows: Vec<_> = sorted.pieces.iter().map(|p| p.rows.clone()).collect();
        assert_eq!(rows, vec![0..1, 1..3, 3..4]);
        assert_eq!(sorted.summary.count, 4);
        assert_eq!(
            m.batches[1].pieces.len(),
            1,
            "an unsorted batch is one piece"
        );
    }

    #[test]
    fn small_sorted_batches_grow_one_batch_with_pieces_per_bucket() {
        // One event per batch, align 10: buckets [0,10) [10,20) [20,30).
        let m = memtable(&[&[(1, 1)], &[(5, 2)], &[(12, 3)], &[(12, 4)], &[(25, 5)]]);
        assert_eq!(m.batches.len(), 1, "grown into one batch");
        let grown = &m.batches[0];
        assert_eq!(grown.lsn, 0, "the first batch's position");
        assert_eq!(grown.summary.count, 5);
        let rows: Vec<_> = grown.pieces.iter().map(|p| p.rows.clone()).collect();
        assert_eq!(rows, vec![0..2, 2..4, 4..5]);
        assert_eq!(grown.pieces[1].summary.count, 2);
        assert_eq!(
            events(&m),
            vec![
                (1, Value::Long(1)),
                (5, Value::Long(2)),
                (12, Value::Long(3)),
                (12, Value::Long(4)),
                (25, Value::Long(5)),
            ]
        );
        // Memory is counted for every event, overheads included.
        assert!(m.bytes >= grown.memory_bytes());
        assert!(grown.memory_bytes() > grown.batch.heap_bytes());
    }

    #[test]
    fn batches_out_of_order_or_large_stay_apart() {
        let out_of_order = memtable(&[&[(10, 1)], &[(5, 2)]]);
        assert_eq!(out_of_order.batches.len(), 2);
        assert_eq!(
            events(&out_of_order)
                .iter()
                .map(|e| e.0)
                .collect::<Vec<_>>(),
            vec![5, 10]
        );
        let large: Vec<(i64, i64)> = (0..=SMALL_BATCH_EVENTS as i64)
            .map(|i| (100 + i, i))
            .collect();
        let m = memtable(&[&[(1, 1)], &large]);
        assert_eq!(
            m.batches.len(),
            2,
            "a batch over the small size is kept whole"
        );
    }

    #[test]
    fn a_batch_held_by_a_reader_is_not_changed() {
        let mut m = memtable(&[&[(1, 1)]]);
        let held = m.batches[0].clone();
        let schema = held.batch.schema().clone();
        let mut b = BatchBuilder::new(schema, 1);
        b.push_row(2, None, &[Value::Long(2)]).unwrap();
        m.push(1, Some(1), Summarized::new(b.finish(), 10).unwrap());
        assert_eq!(m.batches.len(), 2);
        assert_eq!(held.batch.len(), 1, "the reader's snapshot is untouched");
    }
}
