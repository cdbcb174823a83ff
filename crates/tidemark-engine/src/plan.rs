//! What a scan asks for — a time range, the fields to return, a filter of predicates
//! ([`ScanRequest`]) — and its [`Plan`]: the request resolved against a stream's schema
//! (the fields to decode, the predicates bound to decoded columns), which decides whether
//! a block or batch may match by its summary and selects the matching events of one.
//!
//! Must never know about: where events are (segments, memtables), the merge that orders
//! them (`merge`), the catalog.

use std::cmp::Ordering;
use std::sync::Arc;

use tidemark_core::{Column, ColumnData, EventBatch, FieldSummary, Num, Schema, Value};

use crate::error::{EngineError, Result};
use crate::memtable::MemBatch;

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
            Test::In(lits) => lits.iter().any(|l| match l {
                Literal::Num(v) => summary
                    .num
                    .is_none_or(|s| v.total_cmp(&s.min).is_ge() && v.total_cmp(&s.max).is_le()),
                Literal::Bytes(v) => summary.bytes.is_none_or(|b| !b.excludes(v)),
            }),
            Test::Compare(op, Literal::Bytes(v)) => summary.bytes.is_none_or(|b| match op {
                CmpOp::Eq => !b.excludes(v),
                CmpOp::Ne => !b.all_equal(v),
                CmpOp::Lt => !b.all_at_least(v),
                CmpOp::Le => !b.all_above(v),
                CmpOp::Gt => !b.all_at_most(v),
                CmpOp::Ge => !b.all_below(v),
            }),
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
pub(crate) struct Plan {
    pub(crate) range: TimeRange,
    /// Schema positions to decode, ascending.
    pub(crate) needed: Vec<usize>,
    /// Positions within `needed` to return, in the requested order.
    output: Vec<usize>,
    /// `0..needed.len()`: how a decoded block's columns map to the needed fields.
    identity: Vec<usize>,
    filter: Vec<Bound>,
    pub(crate) output_schema: Arc<Schema>,
    /// The stream's schema when the scan began: segments and appended batches stored
    /// before fields were added to it are read as if they had them, null.
    pub(crate) stream_schema: Arc<Schema>,
    /// Whether events are read with their stream positions (what compaction writes back;
    /// a scan's answer has none).
    pub(crate) with_positions: bool,
}

impl Plan {
    pub(crate) fn new(schema: &Arc<Schema>, request: &ScanRequest) -> Result<Plan> {
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
            with_positions: false,
        })
    }

    pub(crate) fn may_match(&self, summary: &tidemark_core::BatchSummary) -> bool {
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
    pub(crate) fn select_block(&self, block: EventBatch) -> EventBatch {
        let rows = self.matching_rows(&block, &self.identity);
        block.into_selected(rows.as_deref(), &self.output, self.output_schema.clone())
    }

    /// The matching events of an appended batch (all schema fields), projected.
    pub(crate) fn select_appended(&self, appended: &MemBatch) -> Result<EventBatch> {
        let batch = appended.batch_as(&self.stream_schema)?;
        let rows = self.matching_rows(&batch, &self.needed);
        let fields: Vec<usize> = self.output.iter().map(|&o| self.needed[o]).collect();
        Ok(batch.select(rows.as_deref(), &fields, self.output_schema.clone()))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use tidemark_core::{BatchBuilder, BatchSummary, Bounds};

    /// A block's STRING bounds skip it for a value outside them (a case the block's values
    /// do not hold, say), and never for one inside.
    #[test]
    fn string_bounds_skip_blocks_that_cannot_match() {
        let schema = Arc::new(Schema::parse_spec("SYMBOL:STRING,N:LONG").unwrap());
        let summary = |symbols: &[&str]| {
            let mut b = BatchBuilder::new(schema.clone(), symbols.len());
            for (i, s) in symbols.iter().enumerate() {
                b.push_row(
                    i as i64,
                    None,
                    &[Value::String((*s).into()), Value::Long(1)],
                )
                .unwrap();
            }
            BatchSummary::of(&b.finish(), Bounds::Kept).unwrap()
        };
        let text = |s: &str| Value::String(s.into());
        let compare = |op, value: &str| Predicate::Compare {
            field: "SYMBOL".into(),
            op,
            value: text(value),
        };
        let may_match = |predicate: Predicate, block: &BatchSummary| {
            let request = ScanRequest {
                filter: vec![predicate],
                ..ScanRequest::default()
            };
            Plan::new(&schema, &request).unwrap().may_match(block)
        };
        let block = summary(&["AAPL", "MSFT", "TSLA"]);
        for (predicate, expected) in [
            (compare(CmpOp::Eq, "aapl"), false),
            (compare(CmpOp::Eq, "MSFT"), true),
            (compare(CmpOp::Eq, "GOOG"), true), // within the bounds: only reading tells
            (compare(CmpOp::Eq, "A"), false),
            (compare(CmpOp::Gt, "TSLA"), false),
            (compare(CmpOp::Ge, "TSLA"), true),
            (compare(CmpOp::Lt, "AAPL"), false),
            (compare(CmpOp::Le, "AAPL"), true),
            (compare(CmpOp::Ne, "AAPL"), true),
            (
                Predicate::In {
                    field: "SYMBOL".into(),
                    values: vec![text("aapl"), text("msft")],
                },
                false,
            ),
            (
                Predicate::In {
                    field: "SYMBOL".into(),
                    values: vec![text("aapl"), text("MSFT")],
                },
                true,
            ),
        ] {
            assert_eq!(
                may_match(predicate.clone(), &block),
                expected,
                "{predicate:?}"
            );
        }
        let one_value = summary(&["AAPL", "AAPL"]);
        assert!(!may_match(compare(CmpOp::Ne, "AAPL"), &one_value));
        assert!(may_match(compare(CmpOp::Ne, "MSFT"), &one_value));
    }
}
