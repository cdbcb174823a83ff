//! A stream as a DataFusion table: scans go to the engine with the projection, time range
//! and field predicates pushed down ([`crate::scan_partition`] runs them).

use std::fmt;
use std::sync::Arc;

use async_trait::async_trait;
use datafusion::arrow::datatypes::SchemaRef;
use datafusion::catalog::Session;
use datafusion::common::Result;
use datafusion::datasource::{TableProvider, TableType};
use datafusion::logical_expr::{Expr, TableProviderFilterPushDown};
use datafusion::physical_plan::ExecutionPlan;
use tidemark_core::Schema;
use tidemark_engine::{Engine, ScanRequest};

use crate::convert::{table_schema, TEND, TSTART};
use crate::pushdown::{support, Pushed};
use crate::scan_partition::ScanPartition;
use crate::stream_scan::{Size, StreamScan};

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
        // gone since planning began is the scan's to report (its size is then nothing).
        let size = match self.engine.stream_info(&self.stream) {
            Ok(info) => Size::estimate(
                &info,
                pushed.range,
                !pushed.predicates.is_empty(),
                limit,
                row_bytes(&output),
            ),
            Err(_) => Size {
                rows: 0,
                row_bytes: row_bytes(&output),
            },
        };
        let request = ScanRequest {
            range: pushed.range,
            fields: Some(fields),
            filter: pushed.predicates,
            ..ScanRequest::default()
        };
        let partition =
            ScanPartition::new(self.engine.clone(), self.stream.clone(), request, output);
        Ok(Arc::new(StreamScan::new(partition, None, limit, size)?))
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
