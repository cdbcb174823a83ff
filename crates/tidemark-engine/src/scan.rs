//! Scans: the events of a time range, with a projection and a filter, in time order.
//!
//! A scan takes a snapshot of the stream (its segment list and memtables, by reference
//! count) and then reads without holding any lock. Each segment yields its matching blocks
//! in order; the memtables yield their matching events sorted; a k-way merge interleaves
//! them by (tstart, insertion order), so events with equal timestamps come back in the order
//! they were appended. Memory is bounded by one decoded block per segment plus the
//! memtables' matching events; a scan never loads a whole stream.

use std::cmp::{Ordering, Reverse};
use std::collections::BinaryHeap;
use std::ops::Range;
use std::sync::Arc;

use tidemark_core::{
    BatchBuilder, Column, ColumnData, EventBatch, FieldSummary, Num, Schema, Value,
};

use crate::db::Engine;
use crate::error::{EngineError, Result};
use crate::memtable::MemBatch;
use crate::state::{Segment, SegmentReader};

/// An inclusive range of tstart values.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct TimeRange {
    pub min: i64,
    pub max: i64,
}

impl TimeRange {
    pub const ALL: TimeRange = TimeRange {
        min: i64::MIN,
        max: i64::MAX,
    };

    pub fn new(min: i64, max: i64) -> TimeRange {
        TimeRange { min, max }
    }

    pub const EMPTY: TimeRange = TimeRange { min: 1, max: 0 };

    /// `[start, end)`; empty if `end <= start`.
    pub fn half_open(start: i64, end: i64) -> TimeRange {
        if end > start {
            TimeRange {
                min: start,
                max: end - 1,
            }
        } else {
            TimeRange::EMPTY
        }
    }

    pub fn is_empty(&self) -> bool {
        self.min > self.max
    }

    pub fn contains(&self, ts: i64) -> bool {
        self.min <= ts && ts <= self.max
    }

    pub fn overlaps(&self, min: i64, max: i64) -> bool {
        !self.is_empty() && min <= self.max && max >= self.min
    }

    pub fn covers(&self, min: i64, max: i64) -> bool {
        self.min <= min && max <= self.max
    }

    /// The instants in both ranges.
    pub fn intersect(self, other: TimeRange) -> TimeRange {
        TimeRange::new(self.min.max(other.min), self.max.min(other.max))
    }
}

/// A comparison of a field with a literal.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum CmpOp {
    Eq,
    Ne,
    Lt,
    Le,
    Gt,
    Ge,
}

/// A condition on one field; a scan's filter is the conjunction of its predicates.
/// A null value satisfies only `IsNull`.
#[derive(Debug, Clone, PartialEq)]
pub enum Predicate {
    Compare {
        field: String,
        op: CmpOp,
        value: Value,
    },
    In {
        field: String,
        values: Vec<Value>,
    },
    IsNull {
        field: String,
    },
    IsNotNull {
        field: String,
    },
}

impl Predicate {
    fn field(&self) -> &str {
        match self {
            Predicate::Compare { field, .. }
            | Predicate::In { field, .. }
            | Predicate::IsNull { field }
            | Predicate::IsNotNull { field } => field,
        }
    }
}

/// What to scan.
#[derive(Debug, Clone)]
pub struct ScanRequest {
    pub range: TimeRange,
    /// Fields to return, by name; `None` for all.
    pub fields: Option<Vec<String>>,
    pub filter: Vec<Predicate>,
    /// The most events per returned batch.
    pub batch_size: usize,
}

impl Default for ScanRequest {
    fn default() -> Self {
        ScanRequest {
            range: TimeRange::ALL,
            fields: None,
            filter: Vec::new(),
            // One segment block: decoded blocks then pass through without a copy.
            batch_size: 65_536,
        }
    }
}

/// A literal in the form rows are compared with.
#[derive(Debug, Clone)]
enum Literal {
    Num(Num),
    Bytes(Vec<u8>),
}

#[derive(Debug, Clone)]
enum Test {
    Compare(CmpOp, Literal),
    In(Vec<Literal>),
    IsNull,
    IsNotNull,
}

/// A predicate bound to a column position of the decoded (needed) fields.
#[derive(Debug, Clone)]
struct Bound {
    column: usize,
    /// The field's position in the stream schema, for block summaries.
    field: usize,
    test: Test,
}

fn literal(value: &Value, field: &str, column_type: tidemark_core::FieldType) -> Result<Literal> {
    let invalid = || {
        EngineError::InvalidRequest(format!(
            "field {field:?} is {column_type}, it cannot be compared with {value:?}"
        ))
    };
    if column_type.is_numeric() {
        match value {
            Value::Boolean(b) => Ok(Literal::Num(Num::I(i64::from(*b)))),
            Value::Byte(v) => Ok(Literal::Num(Num::I(i64::from(*v)))),
            Value::Short(v) => Ok(Literal::Num(Num::I(i64::from(*v)))),
            Value::Integer(v) => Ok(Literal::Num(Num::I(i64::from(*v)))),
            Value::Long(v) => Ok(Literal::Num(Num::I(*v))),
            Value::Float(v) => Ok(Literal::Num(Num::F(f64::from(*v)))),
            Value::Double(v) => Ok(Literal::Num(Num::F(*v))),
            _ => Err(invalid()),
        }
    } else {
        match value {
            Value::String(s) => Ok(Literal::Bytes(s.as_bytes().to_vec())),
            Value::Bytes(b) => Ok(Literal::Bytes(b.clone())),
            _ => Err(invalid()),
        }
    }
}

impl Bound {
    fn matches(&self, column: &Column, row: usize) -> bool {
        let valid = column.is_valid(row);
        match &self.test {
            Test::IsNull => !valid,
            Test::IsNotNull => valid,
            _ if !valid => false,
            Test::Compare(op, lit) => compare(column, row, lit).is_some_and(|o| op_holds(*op, o)),
            Test::In(lits) => lits
                .iter()
                .any(|lit| compare(column, row, lit) == Some(Ordering::Equal)),
        }
    }

    /// Whether any event summarised by `summary` could match (false only when certain).
    fn may_match(&self, summary: &FieldSummary) -> bool {
        match &self.test {
            Test::IsNull => summary.nulls > 0,
            Test::IsNotNull => summary.count > 0,
            _ if summary.count == 0 => false,
            Test::Compare(op, Literal::Num(v)) => summary.num.is_none_or(|s| {
                let below_min = v.total_cmp(&s.min);
                let above_max = v.total_cmp(&s.max);
                match op {
                    CmpOp::Eq => below_min.is_ge() && above_max.is_le(),
                    CmpOp::Ne => !(below_min.is_eq() && above_max.is_eq()),
                    CmpOp::Lt => below_min.is_gt(),
                    CmpOp::Le => below_min.is_ge(),
                    CmpOp::Gt => above_max.is_lt(),
                    CmpOp::Ge => above_max.is_le(),
                }
            }),
            Test::In(lits) => summary.num.is_none_or(|s| {
                lits.iter().any(|l| match l {
                    Literal::Num(v) => v.total_cmp(&s.min).is_ge() && v.total_cmp(&s.max).is_le(),
                    Literal::Bytes(_) => true,
                })
            }),
            Test::Compare(_, Literal::Bytes(_)) => true,
        }
    }
}

fn compare(column: &Column, row: usize, lit: &Literal) -> Option<Ordering> {
    match (column.data(), lit) {
        (ColumnData::String(v) | ColumnData::Bytes(v), Literal::Bytes(b)) => {
            column.value_index(row).map(|i| v.get(i).cmp(b.as_slice()))
        }
        (_, Literal::Num(n)) => column.num(row).map(|x| x.total_cmp(n)),
        _ => None,
    }
}

fn op_holds(op: CmpOp, o: Ordering) -> bool {
    match op {
        CmpOp::Eq => o.is_eq(),
        CmpOp::Ne => o.is_ne(),
        CmpOp::Lt => o.is_lt(),
        CmpOp::Le => o.is_le(),
        CmpOp::Gt => o.is_gt(),
        CmpOp::Ge => o.is_ge(),
    }
}

/// A resolved request: which fields to decode, which to return, and the bound filter.
#[derive(Debug, Clone)]
struct Plan {
    range: TimeRange,
    /// Schema positions to decode, ascending.
    needed: Vec<usize>,
    /// Positions within `needed` to return, in the requested order.
    output: Vec<usize>,
    /// `0..needed.len()`: how a decoded block's columns map to the needed fields.
    identity: Vec<usize>,
    filter: Vec<Bound>,
    output_schema: Arc<Schema>,
    /// The stream's schema when the scan began: segments and appended batches stored
    /// before fields were added to it are read as if they had them, null.
    stream_schema: Arc<Schema>,
}

impl Plan {
    fn new(schema: &Arc<Schema>, request: &ScanRequest) -> Result<Plan> {
        let wanted: Vec<usize> = match &request.fields {
            None => (0..schema.len()).collect(),
            Some(names) => names
                .iter()
                .map(|n| schema.require(n))
                .collect::<Result<_, _>>()?,
        };
        let filter_fields = request
            .filter
            .iter()
            .map(|p| schema.require(p.field()))
            .collect::<Result<Vec<_>, _>>()?;
        let mut needed: Vec<usize> = wanted.iter().chain(&filter_fields).copied().collect();
        needed.sort_unstable();
        needed.dedup();
        let position = |f: usize| needed.iter().position(|&n| n == f).unwrap_or(0);
        let filter = request
            .filter
            .iter()
            .zip(&filter_fields)
            .map(|(p, &field)| {
                let ty = schema.fields()[field].ty;
                let test = match p {
                    Predicate::Compare { op, value, .. } => {
                        Test::Compare(*op, literal(value, p.field(), ty)?)
                    }
                    Predicate::In { values, .. } => Test::In(
                        values
                            .iter()
                            .map(|v| literal(v, p.field(), ty))
                            .collect::<Result<_>>()?,
                    ),
                    Predicate::IsNull { .. } => Test::IsNull,
                    Predicate::IsNotNull { .. } => Test::IsNotNull,
                };
                Ok(Bound {
                    column: position(field),
                    field,
                    test,
                })
            })
            .collect::<Result<Vec<_>>>()?;
        Ok(Plan {
            range: request.range,
            output: wanted.iter().map(|&f| position(f)).collect(),
            identity: (0..needed.len()).collect(),
            output_schema: Arc::new(schema.project(&wanted)),
            needed,
            filter,
            stream_schema: schema.clone(),
        })
    }

    fn may_match(&self, summary: &tidemark_core::BatchSummary) -> bool {
        self.range.overlaps(summary.min_ts, summary.max_ts)
            && self
                .filter
                .iter()
                .all(|b| b.may_match(&summary.field(b.field)))
    }

    /// The rows of `batch` in the range that pass the filter; `None` when all of them do
    /// (no list is built then). `columns[i]` is the column of `batch` holding the i-th
    /// needed field.
    fn matching_rows(&self, batch: &EventBatch, columns: &[usize]) -> Option<Vec<u32>> {
        let ts = batch.tstart();
        if self.filter.is_empty() && ts.iter().all(|&t| self.range.contains(t)) {
            return None;
        }
        let rows = (0..batch.len())
            .filter(|&r| {
                self.range.contains(ts[r])
                    && self
                        .filter
                        .iter()
                        .all(|b| b.matches(batch.column(columns[b.column]), r))
            })
            .map(|r| r as u32)
            .collect();
        Some(rows)
    }

    /// The matching events of a decoded block (its columns are the needed fields), projected
    /// to the output fields. Consumes the block, so kept columns move rather than copy.
    fn select_block(&self, block: EventBatch) -> EventBatch {
        let rows = self.matching_rows(&block, &self.identity);
        block.into_selected(rows.as_deref(), &self.output, self.output_schema.clone())
    }

    /// The matching events of an appended batch (all schema fields), projected.
    fn select_appended(&self, appended: &MemBatch) -> Result<EventBatch> {
        let batch = appended.batch_as(&self.stream_schema)?;
        let rows = self.matching_rows(&batch, &self.needed);
        let fields: Vec<usize> = self.output.iter().map(|&o| self.needed[o]).collect();
        Ok(batch.select(rows.as_deref(), &fields, self.output_schema.clone()))
    }
}

/// One sorted input of the merge.
enum Source {
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
                    let decoded = segment.meta.read_block_as(
                        f,
                        index,
                        &plan.stream_schema,
                        &plan.needed,
                        true,
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
    fn new(plan: Plan, sources: Vec<Source>, batch_size: usize) -> Scan {
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
/// (tstart, insertion) order, with all fields and `tend`: what compaction writes.
pub(crate) fn merge_segments(schema: &Arc<Schema>, segments: Vec<Arc<Segment>>) -> Result<Scan> {
    let plan = Plan::new(schema, &ScanRequest::default())?;
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
