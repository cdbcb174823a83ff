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
        let summary = BatchSummary::of(&batch)?;
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
        let covered = cuts.last() == Some(&ts.len());
        let pieces = if covered && cuts.len() > 2 {
            cuts.windows(2)
                .filter_map(|w| {
                    BatchSummary::of_rows(&batch, w[0]..w[1]).map(|summary| Piece {
                        rows: w[0]..w[1],
                        summary,
                    })
                })
                .collect()
        } else {
            vec![Piece {
                rows: 0..batch.len(),
                summary: summary.clone(),
            }]
        };
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
        let mut builder = BatchBuilder::new(schema, total);
        for b in &self.batches {
            builder.extend_from(&b.batch, 0..b.batch.len())?;
        }
        Ok(Some(builder.finish().sorted()))
    }
}
