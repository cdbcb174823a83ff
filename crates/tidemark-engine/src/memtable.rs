//! Recently appended events of one stream that are durable in the log but not yet in a
//! segment. Appends are kept as the batches they arrived in (no copy), each with its summary
//! so that aggregates over whole batches need not touch the events.

use std::sync::Arc;

use tidemark_core::{BatchBuilder, BatchSummary, CoreError, EventBatch};

/// One appended batch, as it was logged.
#[derive(Debug)]
pub struct MemBatch {
    pub lsn: u64,
    pub batch: EventBatch,
    pub summary: BatchSummary,
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
