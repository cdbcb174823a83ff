//! The k-way merge: sorted sources — a segment's matching blocks, one at a time, and the
//! memtables' matching batches, each sorted when first needed — interleaved by (tstart,
//! insertion order) into batches of events, so that events with equal timestamps come back
//! in the order they were appended. What scans return ([`Scan`]) and what compaction
//! writes ([`merge_segments`]).
//!
//! Must never know about: the catalog or its locks (callers hand it a snapshot of a
//! stream's sources), how a request is resolved (`plan`).

use std::cmp::Reverse;
use std::collections::BinaryHeap;
use std::ops::Range;
use std::sync::Arc;

use tidemark_core::{BatchBuilder, EventBatch, Schema};
use tidemark_storage::segment::Extras;

use crate::error::Result;
use crate::memtable::MemBatch;
use crate::plan::{Plan, ScanRequest};
use crate::segment::{Segment, SegmentReader};

/// One sorted input of the merge.
pub(crate) enum Source {
    /// A segment's matching blocks, one at a time.
    Segment {
        segment: Arc<Segment>,
        file: Option<SegmentReader>,
        next_block: usize,
    },
    /// One appended batch's matching events, sorted; taken when first needed.
    Memory(Option<Arc<MemBatch>>),
}

impl Source {
    /// No event of this source starts before this (known without reading anything).
    fn lower_bound(&self) -> i64 {
        match self {
            Source::Segment { segment, .. } => segment.meta.min_ts().unwrap_or(i64::MAX),
            Source::Memory(m) => m.as_ref().map_or(i64::MAX, |m| m.summary.min_ts),
        }
    }

    fn next_batch(&mut self, plan: &Plan) -> Result<Option<EventBatch>> {
        match self {
            Source::Memory(m) => match m.take() {
                Some(m) => {
                    let selected = plan.select_appended(&m)?.sorted();
                    Ok((!selected.is_empty()).then_some(selected))
                }
                None => Ok(None),
            },
            Source::Segment {
                segment,
                file,
                next_block,
            } => {
                let blocks = &segment.meta.blocks;
                while *next_block < blocks.len() {
                    let index = *next_block;
                    *next_block += 1;
                    let block = &blocks[index];
                    if block.summary.min_ts > plan.range.max {
                        *next_block = blocks.len();
                        break;
                    }
                    if !plan.may_match(&block.summary) {
                        continue;
                    }
                    if file.is_none() {
                        *file = Some(segment.open()?);
                    }
                    let Some(f) = file.as_ref() else { break };
                    let extras = Extras {
                        tend: true,
                        positions: plan.with_positions,
                    };
                    let decoded = segment.meta.read_block_with(
                        f,
                        index,
                        &plan.stream_schema,
                        &plan.needed,
                        extras,
                    )?;
                    let selected = plan.select_block(decoded);
                    if !selected.is_empty() {
                        return Ok(Some(selected));
                    }
                }
                *file = None;
                Ok(None)
            }
        }
    }
}

struct Cursor {
    source: Source,
    /// The batch being consumed, from `row` on; `None` until the source is first read.
    /// Shared with the runs of the output batch being gathered ([`Scan::next_batch`]).
    batch: Option<Arc<EventBatch>>,
    row: usize,
}

impl Cursor {
    /// The tstart of the next event, reading the next batch if this one is used up.
    fn head(&mut self, plan: &Plan) -> Result<Option<i64>> {
        loop {
            if let Some(b) = &self.batch {
                if self.row < b.len() {
                    return Ok(Some(b.tstart()[self.row]));
                }
            }
            match self.source.next_batch(plan)? {
                Some(b) => {
                    self.batch = Some(Arc::new(b));
                    self.row = 0;
                }
                None => {
                    self.batch = None;
                    return Ok(None);
                }
            }
        }
    }
}

/// A merge entry: a cursor's next tstart (or, before it was read, a lower bound for it),
/// and the cursor's index, which breaks ties in insertion order.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
struct Entry {
    ts: i64,
    cursor: usize,
    read: bool,
}

/// An iterator of event batches in (tstart, insertion) order.
///
/// The merge keeps a heap of cursors keyed by their next tstart. A cursor that was never
/// read is keyed by a lower bound from its summary and only read when it reaches the top,
/// so memtable batches (and segments) far ahead of the merge cost nothing until then.
pub struct Scan {
    plan: Plan,
    /// In insertion order: a lower index wins ties.
    cursors: Vec<Cursor>,
    heap: BinaryHeap<Reverse<Entry>>,
    batch_size: usize,
    failed: bool,
}

impl Scan {
    /// A merge of `sources`, given in insertion order.
    pub(crate) fn new(plan: Plan, sources: Vec<Source>, batch_size: usize) -> Scan {
        let heap = sources
            .iter()
            .enumerate()
            .map(|(cursor, source)| {
                Reverse(Entry {
                    ts: source.lower_bound().max(plan.range.min),
                    cursor,
                    read: false,
                })
            })
            .collect();
        let cursors = sources
            .into_iter()
            .map(|source| Cursor {
                source,
                batch: None,
                row: 0,
            })
            .collect();
        Scan {
            plan,
            cursors,
            heap,
            batch_size: batch_size.max(1),
            failed: false,
        }
    }

    /// The schema of the returned batches.
    pub fn schema(&self) -> &Arc<Schema> {
        &self.plan.output_schema
    }

    fn next_batch(&mut self) -> Result<Option<EventBatch>> {
        // The runs of the output batch, gathered first and copied a column at a time.
        let mut runs: Vec<(Arc<EventBatch>, Range<usize>)> = Vec::new();
        let mut len = 0;
        while len < self.batch_size {
            let Some(Reverse(top)) = self.heap.pop() else {
                break;
            };
            let cursor = &mut self.cursors[top.cursor];
            if !top.read {
                if let Some(ts) = cursor.head(&self.plan)? {
                    self.heap.push(Reverse(Entry {
                        ts,
                        cursor: top.cursor,
                        read: true,
                    }));
                }
                continue;
            }
            // Take the run of this cursor that sorts before every other cursor's next event
            // (or lower bound, for cursors not read yet).
            let limit = self.heap.peek().map(|Reverse(e)| (e.ts, e.cursor));
            let Some(batch) = cursor.batch.as_ref() else {
                continue;
            };
            let room = self.batch_size - len;
            let ts = &batch.tstart()[cursor.row..];
            let run = match limit {
                None => ts.len(),
                Some(limit) => ts.partition_point(|&t| (t, top.cursor) < limit),
            }
            .clamp(1, room);
            if runs.is_empty() && cursor.row == 0 && run == batch.len() {
                // The whole batch is the next run: hand it out as it is (no run shares it:
                // those of earlier output batches are gone, so this never copies).
                cursor.row = run;
                let whole = cursor.batch.take().map(Arc::unwrap_or_clone);
                self.requeue(top.cursor)?;
                return Ok(whole);
            }
            let rows = cursor.row..cursor.row + run;
            cursor.row = rows.end;
            match runs.last_mut() {
                Some((last, last_rows))
                    if Arc::ptr_eq(last, batch) && last_rows.end == rows.start =>
                {
                    last_rows.end = rows.end;
                }
                _ => runs.push((batch.clone(), rows)),
            }
            len += run;
            self.requeue(top.cursor)?;
        }
        if runs.is_empty() {
            return Ok(None);
        }
        // No capacity per field: a slot per event in each of a sparse stream's thousand
        // columns is what `BatchBuilder::with_capacities` exists to avoid.
        let mut out = BatchBuilder::new(self.plan.output_schema.clone(), 0);
        let runs: Vec<(&EventBatch, Range<usize>)> = runs
            .iter()
            .map(|(batch, rows)| (batch.as_ref(), rows.clone()))
            .collect();
        out.extend_from_runs(&runs)?;
        Ok(Some(out.finish()))
    }

    /// Puts a cursor that was just read from back on the heap, if it has events left.
    fn requeue(&mut self, index: usize) -> Result<()> {
        if let Some(ts) = self.cursors[index].head(&self.plan)? {
            self.heap.push(Reverse(Entry {
                ts,
                cursor: index,
                read: true,
            }));
        }
        Ok(())
    }
}

impl Iterator for Scan {
    type Item = Result<EventBatch>;

    fn next(&mut self) -> Option<Self::Item> {
        if self.failed {
            return None;
        }
        match self.next_batch() {
            Ok(batch) => batch.map(Ok),
            Err(e) => {
                self.failed = true;
                Some(Err(e))
            }
        }
    }
}

/// Every event of `segments` (segments of one stream, in the order of its list) in
/// (tstart, insertion) order, with all fields, `tend` and positions: what compaction writes.
pub(crate) fn merge_segments(schema: &Arc<Schema>, segments: Vec<Arc<Segment>>) -> Result<Scan> {
    let mut plan = Plan::new(schema, &ScanRequest::default())?;
    plan.with_positions = true;
    let sources = segments.into_iter().map(|segment| Source::Segment {
        segment,
        file: None,
        next_block: 0,
    });
    Ok(Scan::new(
        plan,
        sources.collect(),
        ScanRequest::default().batch_size,
    ))
}
