//! Aggregates over a time range, optionally in fixed-width time buckets.
//!
//! Each source is visited in insertion order (segments oldest first, then memtables). A
//! group of blocks, a block or a memtable batch whose time span lies inside the range and
//! inside one bucket contributes its stored summary; only the ones that straddle a range
//! edge or a bucket boundary are decoded. With minute-aligned blocks, an aggregate in
//! buckets of a minute or more over flushed data reads summaries only.
//!
//! Must never know about: how segments and memtables are written, any transport.

use std::collections::BTreeMap;
use std::ops::Range;
use std::sync::Arc;

use tidemark_core::{
    AggFn, BatchSummary, Bounds, EventBatch, FieldSummary, FieldType, Schema, Value,
};

use crate::engine::Engine;
use crate::error::{EngineError, Result};
use crate::memtable::MemBatch;
use crate::plan::TimeRange;
use crate::segment::{Segment, SegmentReader};

/// One aggregate: a function of a field, or `count` of events when `field` is `None`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Aggregation {
    pub func: AggFn,
    pub field: Option<String>,
}

impl Aggregation {
    pub fn new(func: AggFn, field: &str) -> Aggregation {
        Aggregation {
            func,
            field: Some(field.to_string()),
        }
    }

    pub fn count() -> Aggregation {
        Aggregation {
            func: AggFn::Count,
            field: None,
        }
    }
}

#[derive(Debug, Clone)]
pub struct AggregateRequest {
    pub range: TimeRange,
    /// Bucket width in nanoseconds; buckets start at multiples of it (from the epoch).
    /// `None` aggregates the whole range into one row.
    pub bucket_ns: Option<i64>,
    pub aggregations: Vec<Aggregation>,
}

/// One output row: a bucket (or the whole range) and one value per aggregation.
#[derive(Debug, Clone, PartialEq)]
pub struct AggregateRow {
    /// The bucket's first instant; `None` without bucketing.
    pub bucket_start: Option<i64>,
    /// Events in the bucket.
    pub events: u64,
    pub values: Vec<Value>,
}

/// Per-bucket state: the event count and a summary per needed field.
#[derive(Debug, Clone)]
struct Acc {
    events: u64,
    fields: Vec<FieldSummary>,
}

/// The accumulator of `bucket`, created empty for `fields` needed fields.
fn acc_in(buckets: &mut BTreeMap<i64, Acc>, fields: usize, bucket: i64) -> &mut Acc {
    buckets.entry(bucket).or_insert_with(|| Acc {
        events: 0,
        fields: vec![FieldSummary::default(); fields],
    })
}

struct Plan {
    range: TimeRange,
    bucket_ns: Option<i64>,
    /// Schema positions of the fields the aggregations need, ascending.
    needed: Vec<usize>,
    /// For each aggregation: its function, position in `needed` and field type.
    outputs: Vec<(AggFn, Option<(usize, FieldType)>)>,
    buckets: BTreeMap<i64, Acc>,
}

impl Plan {
    fn bucket_of(&self, ts: i64) -> i64 {
        match self.bucket_ns {
            Some(w) => ts - ts.rem_euclid(w),
            None => i64::MIN,
        }
    }

    /// Whether a span of events can be folded in whole: inside the range and one bucket.
    fn whole(&self, min: i64, max: i64) -> bool {
        self.range.covers(min, max) && self.bucket_of(min) == self.bucket_of(max)
    }

    fn acc(&mut self, bucket: i64) -> &mut Acc {
        acc_in(&mut self.buckets, self.needed.len(), bucket)
    }

    fn add_summary(&mut self, summary: &BatchSummary) {
        let bucket = self.bucket_of(summary.min_ts);
        // Borrows `buckets` and `needed` separately (no copy of `needed` per summary).
        let acc = acc_in(&mut self.buckets, self.needed.len(), bucket);
        acc.events += summary.count;
        for (slot, &field) in acc.fields.iter_mut().zip(&self.needed) {
            slot.merge(&summary.field(field));
        }
    }

    /// Folds in those of `rows` of `batch` that lie inside the range. `columns[i]` is the
    /// column of the batch holding the i-th needed field. Sorted rows (every segment block,
    /// most appended batches) are folded a bucket at a time with typed loops.
    fn add_rows(&mut self, batch: &EventBatch, columns: &[usize], rows: Range<usize>) {
        let ts = batch.tstart();
        if !ts[rows.clone()].is_sorted() {
            for row in rows {
                if !self.range.contains(ts[row]) {
                    continue;
                }
                let acc = self.acc(self.bucket_of(ts[row]));
                acc.events += 1;
                for (slot, &c) in acc.fields.iter_mut().zip(columns) {
                    slot.add_row(batch.column(c), row, ts[row], Bounds::Skipped);
                }
            }
            return;
        }
        let sorted = &ts[rows.clone()];
        let mut start = rows.start + sorted.partition_point(|&t| t < self.range.min);
        let end = rows.start + sorted.partition_point(|&t| t <= self.range.max);
        while start < end {
            let bucket = self.bucket_of(ts[start]);
            let run_end = start + ts[start..end].partition_point(|&t| self.bucket_of(t) == bucket);
            let acc = self.acc(bucket);
            acc.events += (run_end - start) as u64;
            for (slot, &c) in acc.fields.iter_mut().zip(columns) {
                slot.merge(&FieldSummary::of_rows(
                    batch.column(c),
                    ts,
                    start..run_end,
                    Bounds::Skipped,
                ));
            }
            start = run_end;
        }
    }

    fn rows(self) -> Vec<AggregateRow> {
        let bucketed = self.bucket_ns.is_some();
        let mut buckets = self.buckets;
        if !bucketed {
            acc_in(&mut buckets, self.needed.len(), i64::MIN);
        }
        buckets
            .into_iter()
            .map(|(start, acc)| AggregateRow {
                bucket_start: bucketed.then_some(start),
                events: acc.events,
                values: self
                    .outputs
                    .iter()
                    .map(|&(func, field)| match field {
                        None => Value::Long(acc.events as i64),
                        Some((slot, ty)) => acc.fields[slot].eval(func, ty),
                    })
                    .collect(),
            })
            .collect()
    }
}

impl Engine {
    /// Computes `request.aggregations` over the events of `stream` in `request.range`,
    /// one row per non-empty bucket in time order (or exactly one row without buckets).
    pub fn aggregate(&self, stream: &str, request: &AggregateRequest) -> Result<Vec<AggregateRow>> {
        if request.bucket_ns.is_some_and(|w| w <= 0) {
            return Err(EngineError::InvalidRequest(
                "bucket width must be positive".into(),
            ));
        }
        let (schema, segments, memory) = {
            let state = self.shared().read();
            let s = state
                .stream(stream)
                .ok_or_else(|| EngineError::UnknownStream(stream.to_string()))?;
            let memory: Vec<_> = s
                .memtables()
                .flat_map(|m| m.batches.iter().cloned())
                .collect();
            (s.schema.clone(), s.segments.clone(), memory)
        };
        let mut plan = Plan::new(&schema, request)?;
        if !request.range.is_empty() {
            for segment in &segments {
                plan.add_segment(segment, &schema)?;
            }
            for appended in &memory {
                plan.add_appended(appended, &schema)?;
            }
        }
        Ok(plan.rows())
    }
}

impl Plan {
    /// The request's aggregations resolved against `schema`: each function checked against
    /// its field's type, the fields to decode, and where each output reads its field.
    fn new(schema: &Schema, request: &AggregateRequest) -> Result<Plan> {
        let mut fields = Vec::new();
        for a in &request.aggregations {
            if let Some(name) = &a.field {
                let index = schema.require(name)?;
                let ty = schema.fields()[index].ty;
                if !a.func.applies_to(ty) {
                    return Err(EngineError::InvalidRequest(format!(
                        "{} is not defined for {ty} field {name:?}",
                        a.func
                    )));
                }
                fields.push(index);
            }
        }
        let mut needed = fields;
        needed.sort_unstable();
        needed.dedup();
        let outputs = request
            .aggregations
            .iter()
            .map(|a| {
                let field = a.field.as_ref().and_then(|n| schema.index_of(n)).map(|i| {
                    let slot = needed.iter().position(|&n| n == i).unwrap_or(0);
                    (slot, schema.fields()[i].ty)
                });
                (a.func, field)
            })
            .collect();
        Ok(Plan {
            range: request.range,
            bucket_ns: request.bucket_ns,
            needed,
            outputs,
            buckets: BTreeMap::new(),
        })
    }

    /// Adds a segment's events in the range: whole groups and blocks by their summaries,
    /// the others' events decoded (the file opened only if one is).
    fn add_segment(&mut self, segment: &Segment, schema: &Arc<Schema>) -> Result<()> {
        let meta = &segment.meta;
        let identity: Vec<usize> = (0..self.needed.len()).collect();
        let mut file: Option<SegmentReader> = None;
        for (g, group) in meta.groups.iter().enumerate() {
            if !self.range.overlaps(group.min_ts, group.max_ts) {
                continue;
            }
            if self.whole(group.min_ts, group.max_ts) {
                self.add_summary(group);
                continue;
            }
            let first = g * meta.group_size;
            let last = (first + meta.group_size).min(meta.blocks.len());
            for index in first..last {
                let summary = &meta.blocks[index].summary;
                if !self.range.overlaps(summary.min_ts, summary.max_ts) {
                    continue;
                }
                if self.whole(summary.min_ts, summary.max_ts) {
                    self.add_summary(summary);
                    continue;
                }
                if file.is_none() {
                    file = Some(segment.open()?);
                }
                if let Some(f) = &file {
                    let block = meta.read_block_as(f, index, schema, &self.needed, false)?;
                    self.add_rows(&block, &identity, 0..block.len());
                }
            }
        }
        Ok(())
    }

    /// Adds an appended batch's events in the range: whole pieces by their summaries, the
    /// others' events read.
    fn add_appended(&mut self, appended: &MemBatch, schema: &Arc<Schema>) -> Result<()> {
        let needed = self.needed.clone();
        for piece in &appended.pieces {
            let s = &piece.summary;
            if !self.range.overlaps(s.min_ts, s.max_ts) {
                continue;
            }
            if self.whole(s.min_ts, s.max_ts) {
                self.add_summary(s);
            } else {
                let batch = appended.batch_as(schema)?;
                self.add_rows(&batch, &needed, piece.rows.clone());
            }
        }
        Ok(())
    }
}
