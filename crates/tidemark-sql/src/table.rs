//! A stream as a DataFusion table: scans go to the engine with the projection, time range
//! and field predicates pushed down, on a blocking thread that hands batches over a small
//! channel, so a scan holds a few batches in memory however many it reads.

use std::fmt;
use std::sync::Arc;

use async_trait::async_trait;
use datafusion::arrow::datatypes::SchemaRef;
use datafusion::catalog::Session;
use datafusion::common::{DataFusionError, Result};
use datafusion::datasource::{TableProvider, TableType};
use datafusion::execution::TaskContext;
use datafusion::logical_expr::{Expr, TableProviderFilterPushDown};
use datafusion::physical_expr::{LexOrdering, PhysicalSortExpr};
use datafusion::physical_plan::stream::RecordBatchReceiverStreamBuilder;
use datafusion::physical_plan::streaming::{PartitionStream, StreamingTableExec};
use datafusion::physical_plan::{expressions, ExecutionPlan, SendableRecordBatchStream};
use tidemark_core::Schema;
use tidemark_engine::{Engine, ScanRequest};

use crate::convert::{table_schema, to_record_batch, TEND, TSTART};
use crate::pushdown::{support, Pushed};
use crate::sized_scan::{Size, SizedScan};

/// Batches a scan may have decoded ahead of the query.
const SCAN_AHEAD: usize = 2;

/// One stream, read through `engine`.
pub struct StreamTable {
    engine: Engine,
    stream: String,
    schema: Arc<Schema>,
    arrow: SchemaRef,
}

impl fmt::Debug for StreamTable {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("StreamTable")
            .field("stream", &self.stream)
            .finish()
    }
}

impl StreamTable {
    pub fn new(engine: Engine, stream: String, schema: Arc<Schema>) -> StreamTable {
        let arrow = table_schema(&schema);
        StreamTable {
            engine,
            stream,
            schema,
            arrow,
        }
    }

    pub fn engine(&self) -> &Engine {
        &self.engine
    }

    pub fn stream(&self) -> &str {
        &self.stream
    }

    pub fn stream_schema(&self) -> &Arc<Schema> {
        &self.schema
    }
}

#[async_trait]
impl TableProvider for StreamTable {
    fn schema(&self) -> SchemaRef {
        self.arrow.clone()
    }

    fn table_type(&self) -> TableType {
        TableType::Base
    }

    fn supports_filters_pushdown(
        &self,
        filters: &[&Expr],
    ) -> Result<Vec<TableProviderFilterPushDown>> {
        Ok(filters.iter().map(|f| support(&self.schema, f)).collect())
    }

    async fn scan(
        &self,
        _state: &dyn Session,
        projection: Option<&Vec<usize>>,
        filters: &[Expr],
        limit: Option<usize>,
    ) -> Result<Arc<dyn ExecutionPlan>> {
        let output = match projection {
            Some(columns) => Arc::new(self.arrow.project(columns)?),
            None => self.arrow.clone(),
        };
        let fields = output
            .fields()
            .iter()
            .map(|f| f.name())
            .filter(|name| *name != TSTART && *name != TEND)
            .cloned()
            .collect();
        let pushed = Pushed::from_filters(&self.schema, filters);
        // What the engine knows of the stream's size, for the plan's statistics; a stream
        // gone since planning began is the scan's to report.
        let size = self.engine.stream_info(&self.stream).ok().map(|info| {
            Size::estimate(
                &info,
                pushed.range,
                !pushed.predicates.is_empty(),
                limit,
                row_bytes(&output),
            )
        });
        let request = ScanRequest {
            range: pushed.range,
            fields: Some(fields),
            filter: pushed.predicates,
            ..ScanRequest::default()
        };
        // The engine returns events in tstart order: a sort on it (or a merge) needs no work.
        let ordering = match output.index_of(TSTART) {
            Ok(index) => LexOrdering::new([PhysicalSortExpr::new_default(Arc::new(
                expressions::Column::new(TSTART, index),
            ))]),
            Err(_) => None,
        };
        let partition = ScanPartition {
            engine: self.engine.clone(),
            stream: self.stream.clone(),
            request,
            schema: output.clone(),
        };
        let scan = Arc::new(StreamingTableExec::try_new(
            output,
            vec![Arc::new(partition)],
            None,
            ordering,
            false,
            limit,
        )?);
        Ok(match size {
            Some(size) => Arc::new(SizedScan::new(scan, size)),
            None => scan,
        })
    }
}

/// About how many bytes a row of `schema` takes in Arrow: its values' widths, and 16 for a
/// string or bytes (an offset and a short value).
fn row_bytes(schema: &SchemaRef) -> usize {
    schema
        .fields()
        .iter()
        .map(|f| f.data_type().primitive_width().unwrap_or(16))
        .sum::<usize>()
        .max(1)
}

/// The one partition of a stream's scan.
struct ScanPartition {
    engine: Engine,
    stream: String,
    request: ScanRequest,
    schema: SchemaRef,
}

impl fmt::Debug for ScanPartition {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("ScanPartition")
            .field("stream", &self.stream)
            .field("range", &self.request.range)
            .field("filter", &self.request.filter)
            .finish()
    }
}

impl PartitionStream for ScanPartition {
    fn schema(&self) -> &SchemaRef {
        &self.schema
    }

    fn execute(&self, _ctx: Arc<TaskContext>) -> SendableRecordBatchStream {
        let mut builder = RecordBatchReceiverStreamBuilder::new(self.schema.clone(), SCAN_AHEAD);
        let tx = builder.tx();
        let engine = self.engine.clone();
        let stream = self.stream.clone();
        let request = self.request.clone();
        let schema = self.schema.clone();
        // The engine reads files and decodes blocks: work for a blocking thread, not for the
        // runtime's workers.
        builder.spawn_blocking(move || {
            let scan = engine
                .scan(&stream, &request)
                .map_err(|e| DataFusionError::External(Box::new(e)))?;
            for batch in scan {
                let batch = batch.map_err(|e| DataFusionError::External(Box::new(e)))?;
                let record = to_record_batch(batch, &schema)?;
                if tx.blocking_send(Ok(record)).is_err() {
                    // The query stopped reading (a LIMIT was met, or the client left).
                    break;
                }
            }
            Ok(())
        });
        builder.build()
    }
}
