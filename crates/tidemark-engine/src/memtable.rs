//! Recently appended events of one stream that are durable in the log but not yet in a
//! segment. Appends are kept as the batches they arrived in (no copy), each with its summary
//! so that aggregates over whole batches need not touch the events.

use std::ops::Range;
use std::sync::Arc;

use tidemark_core::{BatchBuilder, BatchSummary, CoreError, EventBatch};

/// One appended batch, as it was logged.
#[derive(Debug)]
pub struct MemBatch {
    pub lsn: u64,
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
                BatchSummary::of_rows(&batch, w[0]..w[1]).map(|summary| Piece {
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
        })
    }
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

    pub fn push(&mut self, batch: Arc<MemBatch>) {
        self.bytes += batch.batch.heap_bytes();
        self.batches.push(batch);
    }

    /// All events, sorted by tstart; events with equal tstart keep their insertion order.
    pub fn sorted_events(&self) -> Result<Option<EventBatch>, CoreError> {
        let Some(first) = self.batches.first() else {
            return Ok(None);
        };
        let schema = first.batch.schema().clone();
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
        let mut builder = BatchBuilder::new(schema, total);
        if disjoint {
            for b in order {
                builder.extend_from(&b.batch, 0..b.batch.len())?;
            }
            return Ok(Some(builder.finish()));
        }
        for b in &self.batches {
            builder.extend_from(&b.batch, 0..b.batch.len())?;
        }
        Ok(Some(builder.finish().sorted()))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use tidemark_core::{Schema, Value};

    fn memtable(batches: &[&[(i64, i64)]]) -> Memtable {
        let schema = Arc::new(Schema::parse_spec("V:LONG").unwrap());
        let mut m = Memtable::default();
        for (lsn, rows) in batches.iter().enumerate() {
            let mut b = BatchBuilder::new(schema.clone(), rows.len());
            for &(ts, v) in rows.iter() {
                b.push_row(ts, None, &[Value::Long(v)]).unwrap();
            }
            let s = Summarized::new(b.finish(), 10).unwrap();
            m.push(Arc::new(MemBatch {
                lsn: lsn as u64,
                batch: s.batch,
                summary: s.summary,
                pieces: s.pieces,
            }));
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
}
