//! The summary fast path: an aggregate the engine's block summaries answer without reading
//! events is answered by them.
//!
//! An optimizer rule finds, in DataFusion's optimized plan, an `Aggregate` straight over a
//! stream's scan whose filters are all bounds on `tstart`, grouped by nothing or by
//! `date_bin(interval, tstart)` alone, computing only `count`, `min`, `max`, `sum` and `avg`
//! of numeric fields (or `count(*)`). It becomes a [`SummaryAggregate`] node with the same
//! output schema, planned as one engine aggregate (`Engine::aggregate`) whose values are cast
//! to the types DataFusion chose, so both paths give the same answer in the same types
//! (checked by a property test against the plain plan).

use std::cmp::Ordering;
use std::fmt;
use std::hash::{Hash, Hasher};
use std::sync::Arc;

use async_trait::async_trait;
use datafusion::arrow::array::RecordBatch;
use datafusion::arrow::datatypes::SchemaRef;
use datafusion::catalog::Session;
use datafusion::common::tree_node::Transformed;
use datafusion::common::{DFSchemaRef, DataFusionError, Result, ScalarValue};
use datafusion::datasource::source_as_provider;
use datafusion::execution::TaskContext;
use datafusion::logical_expr::expr::{AggregateFunction, AggregateFunctionParams, ScalarFunction};
use datafusion::logical_expr::physical_planning_context::PhysicalPlanningContext;
use datafusion::logical_expr::{
    Aggregate, Expr, Extension, LogicalPlan, UserDefinedLogicalNode, UserDefinedLogicalNodeCore,
};
use datafusion::optimizer::{ApplyOrder, OptimizerConfig, OptimizerRule};
use datafusion::physical_plan::stream::RecordBatchStreamAdapter;
use datafusion::physical_plan::streaming::{PartitionStream, StreamingTableExec};
use datafusion::physical_plan::{ExecutionPlan, SendableRecordBatchStream};
use datafusion::physical_planner::{ExtensionPlanner, PhysicalPlanner};
use tidemark_core::{AggFn, Value};
use tidemark_engine::{AggregateRequest, Aggregation, Engine, TimeRange};

use crate::convert::TSTART;
use crate::pushdown::time_range_of;
use crate::table::StreamTable;

/// The most buckets a summary aggregate may build. The engine keeps them outside
/// DataFusion's memory pool, so a hostile `time_bucket('1ns', ts)` over a year would grow
/// without bound; beyond this (a week of minutes is 10,080) the plain plan answers, its
/// groups bounded by the pool.
pub const MAX_SUMMARY_BUCKETS: i128 = 100_000;

/// An aggregate answered from block summaries.
#[derive(Clone)]
pub struct SummaryAggregate {
    engine: Engine,
    stream: String,
    request: AggregateRequest,
    /// The output of the `Aggregate` it replaces: the bucket (if any), then one column per
    /// aggregation.
    schema: DFSchemaRef,
}

impl SummaryAggregate {
    /// The events it aggregates.
    pub(crate) fn range(&self) -> TimeRange {
        self.request.range
    }

    /// The same aggregate over `range`; `None` where summaries would make too many buckets
    /// of it, if `check_buckets` (the plain plan must answer then).
    pub(crate) fn over(&self, range: TimeRange, check_buckets: bool) -> Option<SummaryAggregate> {
        if check_buckets {
            if let Some(width) = self.request.bucket_ns {
                if !few_buckets(&self.engine, &self.stream, range, width) {
                    return None;
                }
            }
        }
        let mut moved = self.clone();
        moved.request.range = range;
        Some(moved)
    }

    fn key(&self) -> (&str, i64, i64, Option<i64>, String) {
        (
            &self.stream,
            self.request.range.min,
            self.request.range.max,
            self.request.bucket_ns,
            format!("{:?}", self.request.aggregations),
        )
    }
}

impl fmt::Debug for SummaryAggregate {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        UserDefinedLogicalNodeCore::fmt_for_explain(self, f)
    }
}

impl PartialEq for SummaryAggregate {
    fn eq(&self, other: &Self) -> bool {
        self.key() == other.key() && self.schema == other.schema
    }
}

impl Eq for SummaryAggregate {}

impl PartialOrd for SummaryAggregate {
    fn partial_cmp(&self, other: &Self) -> Option<Ordering> {
        self.key().partial_cmp(&other.key())
    }
}

impl Hash for SummaryAggregate {
    fn hash<H: Hasher>(&self, state: &mut H) {
        self.key().hash(state);
    }
}

impl UserDefinedLogicalNodeCore for SummaryAggregate {
    fn name(&self) -> &str {
        "SummaryAggregate"
    }

    fn inputs(&self) -> Vec<&LogicalPlan> {
        Vec::new()
    }

    fn schema(&self) -> &DFSchemaRef {
        &self.schema
    }

    fn expressions(&self) -> Vec<Expr> {
        Vec::new()
    }

    fn fmt_for_explain(&self, f: &mut fmt::Formatter) -> fmt::Result {
        write!(
            f,
            "SummaryAggregate: stream={:?}, range=[{}, {}], bucket_ns={:?}, aggregations={:?}",
            self.stream,
            self.request.range.min,
            self.request.range.max,
            self.request.bucket_ns,
            self.request.aggregations
        )
    }

    fn with_exprs_and_inputs(&self, _exprs: Vec<Expr>, _inputs: Vec<LogicalPlan>) -> Result<Self> {
        Ok(self.clone())
    }
}

/// The rule that puts [`SummaryAggregate`] where it applies.
#[derive(Debug, Default)]
pub struct SummaryRule;

impl OptimizerRule for SummaryRule {
    fn name(&self) -> &str {
        "tidemark_summary_aggregate"
    }

    fn apply_order(&self) -> Option<ApplyOrder> {
        Some(ApplyOrder::BottomUp)
    }

    fn supports_rewrite(&self) -> bool {
        true
    }

    fn rewrite(
        &self,
        plan: LogicalPlan,
        _config: &dyn OptimizerConfig,
    ) -> Result<Transformed<LogicalPlan>> {
        let LogicalPlan::Aggregate(aggregate) = &plan else {
            return Ok(Transformed::no(plan));
        };
        match summary_aggregate(aggregate)? {
            Some(node) => Ok(Transformed::yes(LogicalPlan::Extension(Extension {
                node: Arc::new(node),
            }))),
            None => Ok(Transformed::no(plan)),
        }
    }
}

/// `aggregate` as a summary aggregate, if summaries answer it.
fn summary_aggregate(aggregate: &Aggregate) -> Result<Option<SummaryAggregate>> {
    let LogicalPlan::TableScan(scan) = aggregate.input.as_ref() else {
        return Ok(None);
    };
    if scan.fetch.is_some() {
        return Ok(None);
    }
    let provider = source_as_provider(&scan.source)?;
    let Some(table) = (provider.as_ref() as &dyn std::any::Any).downcast_ref::<StreamTable>()
    else {
        return Ok(None);
    };
    let Some(range) = time_range_of(&scan.filters) else {
        return Ok(None);
    };
    let bucket_ns = match aggregate.group_expr.as_slice() {
        [] => None,
        [group] => match bucket_width(group) {
            Some(width) => Some(width),
            None => return Ok(None),
        },
        _ => return Ok(None),
    };
    if let Some(width) = bucket_ns {
        if !few_buckets(table.engine(), table.stream(), range, width) {
            return Ok(None);
        }
    }
    let schema = table.stream_schema();
    let mut aggregations = Vec::with_capacity(aggregate.aggr_expr.len());
    for expr in &aggregate.aggr_expr {
        let Some(aggregation) = summary_aggregation(expr, schema) else {
            return Ok(None);
        };
        aggregations.push(aggregation);
    }
    Ok(Some(SummaryAggregate {
        engine: table.engine().clone(),
        stream: table.stream().to_string(),
        request: AggregateRequest {
            range,
            bucket_ns,
            aggregations,
        },
        schema: aggregate.schema.clone(),
    }))
}

/// Whether buckets of `width` over the events of `stream` in `range` are at most
/// [`MAX_SUMMARY_BUCKETS`].
fn few_buckets(engine: &Engine, stream: &str, range: TimeRange, width: i64) -> bool {
    let Ok(info) = engine.stream_info(stream) else {
        return false;
    };
    let Some((first, last)) = info.time_range else {
        return true;
    };
    let span = range.intersect(TimeRange::new(first, last));
    span.is_empty()
        || (i128::from(span.max) - i128::from(span.min)) / i128::from(width) < MAX_SUMMARY_BUCKETS
}

/// The width of `date_bin(interval, tstart)` in nanoseconds (a whole, positive number of
/// days and nanoseconds, from the epoch).
fn bucket_width(expr: &Expr) -> Option<i64> {
    let Expr::ScalarFunction(ScalarFunction { func, args }) = expr.clone().unalias() else {
        return None;
    };
    if func.name() != "date_bin" {
        return None;
    }
    let [Expr::Literal(interval, _), Expr::Column(column)] = args.as_slice() else {
        return None;
    };
    if column.name != TSTART {
        return None;
    }
    let width = match interval {
        ScalarValue::IntervalMonthDayNano(Some(v)) if v.months == 0 => i64::from(v.days)
            .checked_mul(86_400_000_000_000)?
            .checked_add(v.nanoseconds)?,
        ScalarValue::IntervalDayTime(Some(v)) => i64::from(v.days)
            .checked_mul(86_400_000_000_000)?
            .checked_add(i64::from(v.milliseconds).checked_mul(1_000_000)?)?,
        _ => return None,
    };
    (width > 0).then_some(width)
}

/// `expr` as an engine aggregation: `count(*)`, or count, min, max, sum or avg of a numeric
/// field, with no DISTINCT, FILTER or ORDER BY.
fn summary_aggregation(expr: &Expr, schema: &tidemark_core::Schema) -> Option<Aggregation> {
    let Expr::AggregateFunction(AggregateFunction {
        func,
        params:
            AggregateFunctionParams {
                args,
                distinct: false,
                filter: None,
                order_by,
                null_treatment: _,
            },
    }) = expr.clone().unalias()
    else {
        return None;
    };
    if !order_by.is_empty() {
        return None;
    }
    let agg = match func.name() {
        "count" => AggFn::Count,
        "min" => AggFn::Min,
        "max" => AggFn::Max,
        "sum" => AggFn::Sum,
        "avg" => AggFn::Avg,
        _ => return None,
    };
    match args.as_slice() {
        [Expr::Literal(value, _)] if agg == AggFn::Count && !value.is_null() => {
            Some(Aggregation::count())
        }
        [Expr::Column(column)] => {
            let field = &schema.fields()[schema.index_of(&column.name)?];
            (agg == AggFn::Count
                || field.ty.is_numeric() && field.ty != tidemark_core::FieldType::Boolean)
                .then(|| Aggregation::new(agg, &column.name))
        }
        _ => None,
    }
}

/// Plans [`SummaryAggregate`] nodes.
#[derive(Debug, Default)]
pub struct SummaryPlanner;

#[async_trait]
impl ExtensionPlanner for SummaryPlanner {
    async fn plan_extension(
        &self,
        _planner: &dyn PhysicalPlanner,
        node: &dyn UserDefinedLogicalNode,
        _logical_inputs: &[&LogicalPlan],
        _physical_inputs: &[Arc<dyn ExecutionPlan>],
        _session: &dyn Session,
        _planning_ctx: &PhysicalPlanningContext,
    ) -> Result<Option<Arc<dyn ExecutionPlan>>> {
        let Some(node) = node.as_any().downcast_ref::<SummaryAggregate>() else {
            return Ok(None);
        };
        let schema: SchemaRef = Arc::new(node.schema.as_arrow().clone());
        let partition = SummaryPartition {
            node: node.clone(),
            schema: schema.clone(),
        };
        Ok(Some(Arc::new(StreamingTableExec::try_new(
            schema,
            vec![Arc::new(partition)],
            None,
            None,
            false,
            None,
        )?)))
    }
}

struct SummaryPartition {
    node: SummaryAggregate,
    schema: SchemaRef,
}

impl fmt::Debug for SummaryPartition {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        self.node.fmt(f)
    }
}

impl PartitionStream for SummaryPartition {
    fn schema(&self) -> &SchemaRef {
        &self.schema
    }

    fn execute(&self, _ctx: Arc<TaskContext>) -> SendableRecordBatchStream {
        // Computed where the stream is polled, not on a blocking thread: from summaries the
        // answer takes microseconds to a few milliseconds (a few edge blocks read), less than
        // the two thread hand-offs a blocking task costs, and queries have their own
        // runtime (`crate::runtime`), so this holds no worker that appends need.
        let node = self.node.clone();
        let schema = self.schema.clone();
        let batch = futures::stream::once(async move { run(&node, &schema) });
        Box::pin(RecordBatchStreamAdapter::new(self.schema.clone(), batch))
    }
}

/// The engine's aggregate as a record batch of `schema`.
fn run(node: &SummaryAggregate, schema: &SchemaRef) -> Result<RecordBatch> {
    let mut rows = node
        .engine
        .aggregate(&node.stream, &node.request)
        .map_err(|e| DataFusionError::External(Box::new(e)))?;
    let bucketed = node.request.bucket_ns.is_some();
    if rows.is_empty() && !bucketed {
        // SQL's aggregate of no rows is one row: counts of 0, the rest null.
        rows.push(tidemark_engine::AggregateRow {
            bucket_start: None,
            events: 0,
            values: node
                .request
                .aggregations
                .iter()
                .map(|a| match a.func {
                    AggFn::Count => Value::Long(0),
                    _ => Value::Null,
                })
                .collect(),
        });
    }
    let offset = usize::from(bucketed);
    assert_eq!(
        schema.fields().len(),
        offset + node.request.aggregations.len(),
        "a summary aggregate's schema is its bucket and its aggregations"
    );
    let columns = schema
        .fields()
        .iter()
        .enumerate()
        .map(|(i, field)| {
            let scalars = rows.iter().map(|row| {
                let value = if i < offset {
                    ScalarValue::TimestampNanosecond(row.bucket_start, Some("UTC".into()))
                } else {
                    scalar(&row.values[i - offset])
                };
                value.cast_to(field.data_type())
            });
            let scalars = scalars.collect::<Result<Vec<_>>>()?;
            if scalars.is_empty() {
                return Ok(datafusion::arrow::array::new_empty_array(field.data_type()));
            }
            ScalarValue::iter_to_array(scalars)
        })
        .collect::<Result<Vec<_>>>()?;
    Ok(RecordBatch::try_new(schema.clone(), columns)?)
}

fn scalar(value: &Value) -> ScalarValue {
    match value {
        Value::Null => ScalarValue::Null,
        Value::Boolean(v) => ScalarValue::Boolean(Some(*v)),
        Value::Byte(v) => ScalarValue::Int8(Some(*v)),
        Value::Short(v) => ScalarValue::Int16(Some(*v)),
        Value::Integer(v) => ScalarValue::Int32(Some(*v)),
        Value::Long(v) => ScalarValue::Int64(Some(*v)),
        Value::Float(v) => ScalarValue::Float32(Some(*v)),
        Value::Double(v) => ScalarValue::Float64(Some(*v)),
        Value::String(v) => ScalarValue::Utf8(Some(v.clone())),
        Value::Bytes(v) => ScalarValue::Binary(Some(v.clone())),
    }
}
