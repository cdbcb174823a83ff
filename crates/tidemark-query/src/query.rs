//! Running queries against a database ([`Engine`]) and shaping the answers as tables.

use tidemark_engine::{AggregateRequest, Engine, EngineError};

use crate::output::Table;
use tidemark_core::Value;

/// Runs an aggregate and returns a table with a `bucket` column (when bucketed: each
/// bucket's start in nanoseconds) and one column per aggregation, named like
/// `max(LASTTRADEPRICE)`.
pub fn run_aggregate(
    db: &Engine,
    stream: &str,
    request: &AggregateRequest,
) -> Result<Table, EngineError> {
    let rows = db.aggregate(stream, request)?;
    let bucketed = request.bucket_ns.is_some();
    let mut columns = Vec::new();
    if bucketed {
        columns.push("bucket".to_string());
    }
    columns.extend(request.aggregations.iter().map(|a| match &a.field {
        Some(f) => format!("{}({f})", a.func),
        None => format!("{}(*)", a.func),
    }));
    let rows = rows
        .into_iter()
        .map(|row| {
            let mut out = Vec::with_capacity(columns.len());
            if let Some(start) = row.bucket_start.filter(|_| bucketed) {
                // Nanoseconds, as every time column: the caller writes them as its output
                // asks (`Table::with_times`).
                out.push(Value::Long(start));
            }
            out.extend(row.values);
            out
        })
        .collect();
    Ok(Table { columns, rows })
}
