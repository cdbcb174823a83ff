//! A stream's scan as a plan: DataFusion's `StreamingTableExec` over the stream's
//! [`ScanPartition`], with what the engine knows of its size, and the same scan newest
//! first for [`crate::newest_first`].
//!
//! `StreamingTableExec` reports no statistics, so its join planning could not tell a stream
//! of a million events from one of two hundred: `... WHERE EXISTS (SELECT 1 FROM quotes
//! ...)` built its hash table on the million and took seconds. [`StreamScan`] gives that plan
//! estimates of its rows and bytes from what the engine keeps anyway (a stream's event count
//! and time range; no data is read): the rows of the time range scanned, as if events were
//! spread evenly over the stream's span, fewer when field predicates are pushed down
//! (DataFusion's own default selectivity, 20%), at most the scan's limit. Estimates are
//! marked inexact: they order join sides, they never answer a query.

use std::fmt;
use std::sync::Arc;

use datafusion::arrow::compute::SortOptions;
use datafusion::common::stats::Precision;
use datafusion::common::tree_node::TreeNodeRecursion;
use datafusion::common::{internal_err, Result, Statistics};
use datafusion::execution::TaskContext;
use datafusion::physical_expr::{LexOrdering, PhysicalExpr, PhysicalSortExpr};
use datafusion::physical_plan::execution_plan::{ChildrenPropertiesMode, ReplaceChildrenOptions};
use datafusion::physical_plan::metrics::MetricsSet;
use datafusion::physical_plan::projection::ProjectionExec;
use datafusion::physical_plan::statistics::StatisticsArgs;
use datafusion::physical_plan::streaming::{PartitionStream, StreamingTableExec};
use datafusion::physical_plan::{
    expressions, DisplayAs, DisplayFormatType, ExecutionPlan, PlanProperties,
    SendableRecordBatchStream,
};
use tidemark_engine::{StreamInfo, TimeRange};

use crate::convert::TSTART;
use crate::scan_partition::{Direction, ScanPartition};

/// Of the rows a scan reads, the share its pushed-down field predicates are taken to keep
/// (DataFusion's `default_filter_selectivity`).
const PREDICATE_SELECTIVITY: f64 = 0.2;

/// What a scan is estimated to produce.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Size {
    pub rows: usize,
    /// Bytes of one row as Arrow holds it, about.
    pub row_bytes: usize,
}

impl Size {
    /// The rows of `info`'s stream a scan of `range` reads (with `predicates` pushed down, at
    /// most `limit`), each of about `row_bytes`.
    pub fn estimate(
        info: &StreamInfo,
        range: TimeRange,
        predicates: bool,
        limit: Option<usize>,
        row_bytes: usize,
    ) -> Size {
        let events = info.event_count as f64;
        let in_range = match info.time_range {
            None => 0.0,
            Some((first, last)) => {
                let span = TimeRange::new(first, last);
                let scanned = range.intersect(span);
                if scanned.is_empty() {
                    0.0
                } else {
                    let width = |r: TimeRange| (i128::from(r.max) - i128::from(r.min)) as f64 + 1.0;
                    events * (width(scanned) / width(span)).min(1.0)
                }
            }
        };
        let kept = if predicates {
            in_range * PREDICATE_SELECTIVITY
        } else {
            in_range
        };
        // A scan with anything in range yields a row at least, as far as planning knows.
        let rows = if in_range > 0.0 {
            kept.ceil().max(1.0)
        } else {
            0.0
        } as usize;
        Size {
            rows: limit.map_or(rows, |limit| rows.min(limit)),
            row_bytes,
        }
    }
}

/// A stream's scan: `scan` runs `partition`, and is about `size`.
#[derive(Debug)]
pub struct StreamScan {
    scan: Arc<StreamingTableExec>,
    partition: Arc<ScanPartition>,
    size: Size,
}

impl StreamScan {
    /// `partition`, its columns projected to `projection` and at most `limit` rows.
    pub fn new(
        partition: ScanPartition,
        projection: Option<&Vec<usize>>,
        limit: Option<usize>,
        size: Size,
    ) -> Result<StreamScan> {
        let partition = Arc::new(partition);
        let scan = StreamingTableExec::try_new(
            partition.schema().clone(),
            vec![partition.clone() as Arc<dyn PartitionStream>],
            projection,
            ordering(partition.schema(), projection, partition.direction()),
            false,
            limit,
        )?;
        Ok(StreamScan {
            scan: Arc::new(scan),
            partition,
            size,
        })
    }

    /// The same scan reading the newest events first, its rows in descending `tstart`.
    pub fn newest_first(&self) -> Result<StreamScan> {
        let projection = self.scan.projection().as_ref().map(|p| p.to_vec());
        StreamScan::new(
            self.partition.newest_first(),
            projection.as_ref(),
            self.scan.limit(),
            self.size,
        )
    }

    fn wrap(&self, scan: Arc<dyn ExecutionPlan>, size: Size) -> Result<Arc<dyn ExecutionPlan>> {
        let Some(scan) = scan.downcast_ref::<StreamingTableExec>() else {
            return internal_err!("a stream's scan stays a StreamingTableExec");
        };
        Ok(Arc::new(StreamScan {
            scan: Arc::new(scan.clone()),
            partition: self.partition.clone(),
            size,
        }))
    }
}

/// The order the engine gives rows in, by `tstart`, if the projection keeps it.
fn ordering(
    schema: &datafusion::arrow::datatypes::SchemaRef,
    projection: Option<&Vec<usize>>,
    direction: Direction,
) -> Option<LexOrdering> {
    let full = schema.index_of(TSTART).ok()?;
    let index = match projection {
        Some(columns) => columns.iter().position(|&c| c == full)?,
        None => full,
    };
    let options = match direction {
        Direction::OldestFirst => SortOptions::default(),
        // As DataFusion writes `ORDER BY tstart DESC` (NULLS FIRST, which a non-null
        // column never meets).
        Direction::NewestFirst => SortOptions {
            descending: true,
            nulls_first: true,
        },
    };
    LexOrdering::new([PhysicalSortExpr::new(
        Arc::new(expressions::Column::new(TSTART, index)),
        options,
    )])
}

impl DisplayAs for StreamScan {
    fn fmt_as(&self, format: DisplayFormatType, f: &mut fmt::Formatter) -> fmt::Result {
        self.scan.fmt_as(format, f)?;
        if self.partition.direction() == Direction::NewestFirst {
            write!(f, ", newest_first")?;
        }
        write!(f, ", estimated_rows={}", self.size.rows)
    }
}

impl ExecutionPlan for StreamScan {
    fn name(&self) -> &'static str {
        "StreamScan"
    }

    fn properties(&self) -> &Arc<PlanProperties> {
        self.scan.properties()
    }

    fn children(&self) -> Vec<&Arc<dyn ExecutionPlan>> {
        Vec::new()
    }

    fn apply_expressions(
        &self,
        f: &mut dyn FnMut(&Arc<dyn PhysicalExpr>) -> Result<TreeNodeRecursion>,
    ) -> Result<TreeNodeRecursion> {
        self.scan.apply_expressions(f)
    }

    fn replace_children(
        self: Arc<Self>,
        children: Vec<Arc<dyn ExecutionPlan>>,
        _options: ReplaceChildrenOptions,
    ) -> Result<Arc<dyn ExecutionPlan>> {
        if children.is_empty() {
            Ok(self)
        } else {
            internal_err!("a stream's scan has no children to replace")
        }
    }

    fn with_new_children(
        self: Arc<Self>,
        children: Vec<Arc<dyn ExecutionPlan>>,
    ) -> Result<Arc<dyn ExecutionPlan>> {
        self.replace_children(
            children,
            ReplaceChildrenOptions::new(ChildrenPropertiesMode::Recompute),
        )
    }

    fn execute(
        &self,
        partition: usize,
        context: Arc<TaskContext>,
    ) -> Result<SendableRecordBatchStream> {
        self.scan.execute(partition, context)
    }

    fn metrics(&self) -> Option<MetricsSet> {
        self.scan.metrics()
    }

    fn statistics_from_inputs(
        &self,
        _input_stats: &[Arc<Statistics>],
        _args: &StatisticsArgs,
    ) -> Result<Arc<Statistics>> {
        let mut statistics = Statistics::new_unknown(&self.schema());
        statistics.num_rows = Precision::Inexact(self.size.rows);
        statistics.total_byte_size = Precision::Inexact(self.size.rows * self.size.row_bytes);
        Ok(Arc::new(statistics))
    }

    fn fetch(&self) -> Option<usize> {
        self.scan.fetch()
    }

    fn with_fetch(&self, limit: Option<usize>) -> Option<Arc<dyn ExecutionPlan>> {
        let scan = self.scan.with_fetch(limit)?;
        let rows = limit.map_or(self.size.rows, |limit| self.size.rows.min(limit));
        self.wrap(scan, Size { rows, ..self.size }).ok()
    }

    fn try_swapping_with_projection(
        &self,
        projection: &ProjectionExec,
    ) -> Result<Option<Arc<dyn ExecutionPlan>>> {
        let Some(scan) = self.scan.try_swapping_with_projection(projection)? else {
            return Ok(None);
        };
        // Fewer columns: a row is smaller, in the same proportion as far as planning knows.
        let before = self.scan.schema().fields().len().max(1);
        let after = scan.schema().fields().len();
        let row_bytes = (self.size.row_bytes * after / before).max(1);
        self.wrap(
            scan,
            Size {
                row_bytes,
                ..self.size
            },
        )
        .map(Some)
    }
}
