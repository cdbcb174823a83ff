//! Running a [`Plan`]: block summaries where they answer it, otherwise a filtered scan
//! folded row by row.

use std::collections::{BTreeMap, VecDeque};

use sketches_ddsketch::{Config as SketchConfig, DDSketch};
use tidemark_core::{AggFn, Column, EventBatch, FieldSummary, FieldType, Num, Schema, Value};
use tidemark_engine::{AggregateRequest, Aggregation, Engine, ScanRequest};

use super::plan::{AggOutput, Plan, RowOutput, Shape};
use super::{SqlError, SqlLimits};
use crate::Table;

/// Runs `plan` against `db`.
pub fn execute(db: &Engine, plan: &Plan, limits: SqlLimits) -> Result<Table, SqlError> {
    let mut rows = match &plan.shape {
        Shape::Rows(outputs) => scan_rows(db, plan, outputs, limits)?,
        Shape::Aggregate {
            bucket_ns, outputs, ..
        } if plan.shape.uses_summaries(&plan.filter) => {
            aggregate_by_summaries(db, plan, *bucket_ns, outputs)?
        }
        Shape::Aggregate {
            bucket_ns,
            group_fields,
            outputs,
        } => aggregate_by_scan(db, plan, *bucket_ns, group_fields, outputs, limits)?,
    };
    if let Some(limit) = plan.limit {
        rows.truncate(limit);
    }
    Ok(Table {
        columns: plan.labels.clone(),
        rows,
    })
}

/// Rows in time order (reversed for DESC), stopping at LIMIT.
fn scan_rows(
    db: &Engine,
    plan: &Plan,
    outputs: &[RowOutput],
    limits: SqlLimits,
) -> Result<Vec<Vec<Value>>, SqlError> {
    let fields: Vec<String> = outputs
        .iter()
        .filter_map(|o| match o {
            RowOutput::Field(f) => Some(f.clone()),
            _ => None,
        })
        .collect();
    let scan = db.scan(
        &plan.stream,
        &ScanRequest {
            range: plan.range,
            fields: Some(fields),
            filter: plan.filter.clone(),
            ..ScanRequest::default()
        },
    )?;
    // Ascending with a LIMIT stops early; descending keeps the last LIMIT rows seen.
    let keep = plan.limit.unwrap_or(usize::MAX);
    let mut rows = VecDeque::new();
    let mut bytes = Footprint::new(limits);
    for batch in scan {
        let batch = batch?;
        let columns: Vec<Option<&Column>> = outputs
            .iter()
            .map(|o| match o {
                RowOutput::Field(f) => batch.schema().index_of(f).map(|i| batch.column(i)),
                _ => None,
            })
            .collect();
        for row in 0..batch.len() {
            let values = outputs
                .iter()
                .zip(&columns)
                .map(|(output, column)| match (output, column) {
                    (RowOutput::Tstart, _) => Value::Long(batch.tstart()[row]),
                    (RowOutput::Tend, _) => batch.tend_at(row).map_or(Value::Null, Value::Long),
                    (RowOutput::Field(_), Some(column)) => column.value(row),
                    (RowOutput::Field(_), None) => Value::Null,
                })
                .collect::<Vec<_>>();
            bytes.add(row_bytes(&values))?;
            rows.push_back(values);
            if plan.descending {
                if rows.len() > keep {
                    if let Some(dropped) = rows.pop_front() {
                        bytes.remove(row_bytes(&dropped));
                    }
                }
            } else if rows.len() >= keep {
                return Ok(rows.into());
            }
            if rows.len() > limits.max_rows {
                return Err(too_many(limits));
            }
        }
    }
    let mut rows: Vec<_> = rows.into();
    if plan.descending {
        rows.reverse();
    }
    Ok(rows)
}

fn too_many(limits: SqlLimits) -> SqlError {
    SqlError::Invalid(format!(
        "the answer has more than {} rows: narrow the time range or add LIMIT",
        limits.max_rows
    ))
}

/// The memory an answer under construction holds, against [`SqlLimits::max_bytes`].
struct Footprint {
    bytes: usize,
    max: usize,
}

impl Footprint {
    fn new(limits: SqlLimits) -> Footprint {
        Footprint {
            bytes: 0,
            max: limits.max_bytes,
        }
    }

    fn add(&mut self, bytes: usize) -> Result<(), SqlError> {
        self.bytes = self.bytes.saturating_add(bytes);
        if self.bytes > self.max {
            return Err(SqlError::Invalid(format!(
                "the answer needs more than {} bytes of memory: narrow the time range, select \
                 fewer fields or add LIMIT",
                self.max
            )));
        }
        Ok(())
    }

    fn remove(&mut self, bytes: usize) {
        debug_assert!(bytes <= self.bytes, "removing more than was added");
        self.bytes -= bytes.min(self.bytes);
    }
}

/// What a row of values holds in memory, its strings' and byte strings' contents included.
fn row_bytes<'a>(values: impl IntoIterator<Item = &'a Value>) -> usize {
    std::mem::size_of::<Vec<Value>>()
        + values
            .into_iter()
            .map(|v| {
                std::mem::size_of::<Value>()
                    + match v {
                        Value::String(s) => s.len(),
                        Value::Bytes(b) => b.len(),
                        _ => 0,
                    }
            })
            .sum::<usize>()
}

/// Aggregates straight from block summaries (no filter, no groups, no percentiles).
fn aggregate_by_summaries(
    db: &Engine,
    plan: &Plan,
    bucket_ns: Option<i64>,
    outputs: &[AggOutput],
) -> Result<Vec<Vec<Value>>, SqlError> {
    let aggregations: Vec<Aggregation> = outputs
        .iter()
        .filter_map(|o| match o {
            AggOutput::Agg(a) => Some(a.clone()),
            _ => None,
        })
        .collect();
    let found = db.aggregate(
        &plan.stream,
        &AggregateRequest {
            range: plan.range,
            bucket_ns,
            aggregations,
        },
    )?;
    let mut rows: Vec<Vec<Value>> = found
        .into_iter()
        .filter(|row| bucket_ns.is_none() || row.events > 0)
        .map(|row| {
            let mut values = row.values.into_iter();
            outputs
                .iter()
                .map(|o| match o {
                    AggOutput::Bucket => row.bucket_start.map_or(Value::Null, Value::Long),
                    _ => values.next().unwrap_or(Value::Null),
                })
                .collect()
        })
        .collect();
    if rows.is_empty() && bucket_ns.is_none() {
        // An aggregate without GROUP BY has one row even over no events (count 0).
        rows.push(outputs.iter().map(empty_value).collect());
    }
    if plan.descending {
        rows.reverse();
    }
    Ok(rows)
}

fn empty_value(output: &AggOutput) -> Value {
    match output {
        AggOutput::Agg(a) if a.func == AggFn::Count => Value::Long(0),
        _ => Value::Null,
    }
}

/// A group's key: its bucket and its GROUP BY values, ordered for the output.
type GroupKey = (i64, Vec<KeyPart>);

/// A GROUP BY value in a form that orders and hashes (floats by their bits' total order).
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord)]
enum KeyPart {
    Null,
    Int(i64),
    Float(i64),
    Text(String),
    Bytes(Vec<u8>),
}

impl KeyPart {
    fn of(value: Value) -> KeyPart {
        match value {
            Value::Null => KeyPart::Null,
            Value::Boolean(b) => KeyPart::Int(i64::from(b)),
            Value::Byte(v) => KeyPart::Int(v.into()),
            Value::Short(v) => KeyPart::Int(v.into()),
            Value::Integer(v) => KeyPart::Int(v.into()),
            Value::Long(v) => KeyPart::Int(v),
            Value::Float(v) => KeyPart::Float(total_order(f64::from(v))),
            Value::Double(v) => KeyPart::Float(total_order(v)),
            Value::String(s) => KeyPart::Text(s),
            Value::Bytes(b) => KeyPart::Bytes(b),
        }
    }

    fn into_value(self, ty: FieldType) -> Value {
        match (self, ty) {
            (KeyPart::Null, _) => Value::Null,
            (KeyPart::Int(v), FieldType::Boolean) => Value::Boolean(v != 0),
            (KeyPart::Int(v), FieldType::Byte) => Value::Byte(v as i8),
            (KeyPart::Int(v), FieldType::Short) => Value::Short(v as i16),
            (KeyPart::Int(v), FieldType::Integer) => Value::Integer(v as i32),
            (KeyPart::Int(v), _) => Value::Long(v),
            (KeyPart::Float(bits), FieldType::Float) => Value::Float(from_total_order(bits) as f32),
            (KeyPart::Float(bits), _) => Value::Double(from_total_order(bits)),
            (KeyPart::Text(s), _) => Value::String(s),
            (KeyPart::Bytes(b), _) => Value::Bytes(b),
        }
    }
}

/// Maps an f64 to an i64 with the same order as `f64::total_cmp`.
fn total_order(v: f64) -> i64 {
    let bits = v.to_bits() as i64;
    bits ^ (((bits >> 63) as u64) >> 1) as i64
}

fn from_total_order(key: i64) -> f64 {
    f64::from_bits((key ^ (((key >> 63) as u64) >> 1) as i64) as u64)
}

enum Accumulator {
    Summary {
        column: Option<usize>,
        summary: FieldSummary,
    },
    Sketch {
        column: usize,
        sketch: Box<DDSketch>,
    },
}

/// Aggregates by scanning the matching events and folding them into groups.
fn aggregate_by_scan(
    db: &Engine,
    plan: &Plan,
    bucket_ns: Option<i64>,
    group_fields: &[String],
    outputs: &[AggOutput],
    limits: SqlLimits,
) -> Result<Vec<Vec<Value>>, SqlError> {
    let mut fields: Vec<String> = group_fields.to_vec();
    for output in outputs {
        let field = match output {
            AggOutput::Agg(Aggregation { field: Some(f), .. })
            | AggOutput::Percentile { field: f, .. } => f,
            _ => continue,
        };
        if !fields.iter().any(|x| x.eq_ignore_ascii_case(field)) {
            fields.push(field.clone());
        }
    }
    let scan = db.scan(
        &plan.stream,
        &ScanRequest {
            range: plan.range,
            fields: Some(fields.clone()),
            filter: plan.filter.clone(),
            ..ScanRequest::default()
        },
    )?;
    let schema = scan.schema().clone();
    let index = |name: &str| schema.index_of(name);
    let group_columns: Vec<usize> = group_fields.iter().filter_map(|f| index(f)).collect();
    let new_accumulators = || -> Vec<Accumulator> {
        outputs
            .iter()
            .filter_map(|o| match o {
                AggOutput::Agg(a) => Some(Accumulator::Summary {
                    column: a.field.as_deref().and_then(index),
                    summary: FieldSummary::default(),
                }),
                AggOutput::Percentile { field, .. } => Some(Accumulator::Sketch {
                    column: index(field).unwrap_or(0),
                    sketch: Box::new(DDSketch::new(SketchConfig::defaults())),
                }),
                _ => None,
            })
            .collect()
    };
    let mut groups: BTreeMap<GroupKey, Vec<Accumulator>> = BTreeMap::new();
    let mut bytes = Footprint::new(limits);
    // A group's accumulators: a summary is small, a sketch grows to a few KiB.
    let accumulator_bytes = outputs.len() * 4096;
    for batch in scan {
        let batch = batch?;
        for row in 0..batch.len() {
            let ts = batch.tstart()[row];
            let bucket = bucket_ns.map_or(0, |w| ts.div_euclid(w) * w);
            let key = (
                bucket,
                group_columns
                    .iter()
                    .map(|&c| KeyPart::of(batch.column(c).value(row)))
                    .collect(),
            );
            if !groups.contains_key(&key) {
                if groups.len() >= limits.max_rows {
                    return Err(too_many(limits));
                }
                bytes.add(accumulator_bytes + key_bytes(&key.1))?;
            }
            let accumulators = groups.entry(key).or_insert_with(new_accumulators);
            fold_row(accumulators, &batch, row, ts);
        }
    }
    if groups.is_empty() && bucket_ns.is_none() && group_fields.is_empty() {
        return Ok(vec![outputs.iter().map(empty_value).collect()]);
    }
    let types: Vec<FieldType> = group_columns
        .iter()
        .map(|&c| field_type(&schema, c))
        .collect();
    let mut rows: Vec<Vec<Value>> = groups
        .into_iter()
        .map(|((bucket, key), accumulators)| {
            let key: Vec<Value> = key
                .into_iter()
                .zip(&types)
                .map(|(k, &ty)| k.into_value(ty))
                .collect();
            let mut accumulators = accumulators.into_iter();
            outputs
                .iter()
                .map(|output| match output {
                    AggOutput::Bucket => Value::Long(bucket),
                    AggOutput::Group(field) => group_fields
                        .iter()
                        .position(|g| g.eq_ignore_ascii_case(field))
                        .and_then(|i| key.get(i).cloned())
                        .unwrap_or(Value::Null),
                    AggOutput::Agg(a) => match accumulators.next() {
                        Some(Accumulator::Summary { column, summary }) => {
                            let ty = column.map_or(FieldType::Long, |c| field_type(&schema, c));
                            summary.eval(a.func, ty)
                        }
                        _ => Value::Null,
                    },
                    AggOutput::Percentile { q, .. } => match accumulators.next() {
                        Some(Accumulator::Sketch { sketch, .. }) => sketch
                            .quantile(*q)
                            .ok()
                            .flatten()
                            .map_or(Value::Null, Value::Double),
                        _ => Value::Null,
                    },
                })
                .collect()
        })
        .collect();
    if plan.descending {
        rows.reverse();
    }
    Ok(rows)
}

fn key_bytes(key: &[KeyPart]) -> usize {
    key.iter()
        .map(|part| {
            std::mem::size_of::<KeyPart>()
                + match part {
                    KeyPart::Text(s) => s.len(),
                    KeyPart::Bytes(b) => b.len(),
                    _ => 0,
                }
        })
        .sum()
}

fn fold_row(accumulators: &mut [Accumulator], batch: &EventBatch, row: usize, ts: i64) {
    for accumulator in accumulators {
        match accumulator {
            Accumulator::Summary {
                column: Some(c),
                summary,
            } => summary.add_row(batch.column(*c), row, ts),
            // count(*): every event counts.
            Accumulator::Summary {
                column: None,
                summary,
            } => summary.add(ts, None),
            Accumulator::Sketch { column, sketch } => match batch.column(*column).num(row) {
                Some(Num::I(v)) => sketch.add(v as f64),
                Some(Num::F(v)) => sketch.add(v),
                None => {}
            },
        }
    }
}

fn field_type(schema: &Schema, column: usize) -> FieldType {
    schema.fields()[column].ty
}
