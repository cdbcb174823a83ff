//! Scans: the events of a time range, with a projection and a filter, in time order.
//!
//! A scan takes a snapshot of the stream (its segment list and memtables, by reference
//! count) and then reads without holding any lock. Each segment yields its matching blocks
//! in order; the memtables yield their matching events sorted; a k-way merge (`merge`)
//! interleaves them by (tstart, insertion order), so events with equal timestamps come back
//! in the order they were appended. Memory is bounded by one decoded block per segment plus
//! the memtables' matching events; a scan never loads a whole stream.
//!
//! Must never know about: how segments and memtables are written, any transport.

use std::sync::Arc;

use crate::engine::Engine;
use crate::error::{EngineError, Result};
use crate::memtable::MemBatch;
use crate::merge::{Scan, Source};
use crate::plan::{Plan, ScanRequest};

impl Engine {
    /// The events of `stream` in `request.range` that pass the filter, in time order
    /// (events with equal tstart in the order they were appended), as batches of at most
    /// `request.batch_size` events.
    pub fn scan(&self, stream: &str, request: &ScanRequest) -> Result<Scan> {
        let (schema, segments, memory) = {
            let state = self.shared().read();
            let s = state
                .stream(stream)
                .ok_or_else(|| EngineError::UnknownStream(stream.to_string()))?;
            let memory: Vec<Arc<MemBatch>> = s
                .memtables()
                .flat_map(|m| m.batches.iter().cloned())
                .collect();
            (s.schema.clone(), s.segments.clone(), memory)
        };
        let plan = Plan::new(&schema, request)?;
        let segments = segments
            .into_iter()
            .filter(|s| s.meta.groups.iter().any(|g| plan.may_match(g)))
            .map(|segment| Source::Segment {
                segment,
                file: None,
                next_block: 0,
            });
        let memory = memory
            .into_iter()
            .filter(|m| plan.may_match(&m.summary))
            .map(|m| Source::Memory(Some(m)));
        let sources: Vec<Source> = segments.chain(memory).collect();
        Ok(Scan::new(plan, sources, request.batch_size))
    }
}
