//! `pg_aggregate` joined to `pg_proc` as PostgreSQL's is: `aggfnoid` is the oid of the
//! aggregate's function (a `regproc`), where the crate's rows hold its printed name
//! (`pg_catalog.avg`), which no oid equals (Grafana's older builder lists aggregates with
//! `pg_aggregate JOIN pg_proc ON pg_aggregate.aggfnoid = pg_proc.oid`).
//!
//! A name is not enough for an overloaded aggregate (`avg` has seven). PostgreSQL's rows of
//! both tables, as the crate ships them, list the overloads of a name in the same order
//! (`pg_aggregate.dat` and `pg_proc.dat` are written so, and `avg(float8)`'s transition
//! type `_float8` sits beside its oid 2105): the n-th row of a name in `pg_aggregate` is
//! the n-th aggregate of that name in `pg_proc` by oid. Every aggregate of each table must
//! be matched by one of the other, or the table is refused rather than half right.

use std::collections::{HashMap, VecDeque};
use std::sync::{Arc, OnceLock};

use datafusion::arrow::array::{Array, AsArray, Int32Array, RecordBatch};
use datafusion::arrow::datatypes::{DataType, Schema};
use datafusion::common::DataFusionError;
use datafusion::datasource::MemTable;
use datafusion_pg_catalog::pg_catalog::oid_field;

use super::static_tables;

/// PostgreSQL's `pg_aggregate`, its `aggfnoid` an oid of `pg_proc`.
pub(super) fn pg_aggregate() -> Result<Arc<MemTable>, DataFusionError> {
    static TABLE: OnceLock<Result<Arc<MemTable>, String>> = OnceLock::new();
    TABLE
        .get_or_init(|| by_oid().map_err(|e| e.to_string()))
        .clone()
        .map_err(|e| DataFusionError::Internal(format!("pg_aggregate: {e}")))
}

fn by_oid() -> Result<Arc<MemTable>, DataFusionError> {
    let mut oids = aggregate_oids()?;
    let table = &static_tables().pg_aggregate;
    let schema = table.schema();
    let column = schema.index_of("aggfnoid")?;
    let mut fields = schema.fields().to_vec();
    fields[column] = Arc::new(oid_field::oid_field(
        "aggfnoid",
        oid_field::kind::REGPROC,
        false,
    ));
    let schema = Arc::new(Schema::new_with_metadata(fields, schema.metadata().clone()));
    let mut batches = Vec::new();
    for batch in table.data() {
        let names = batch
            .column(column)
            .as_string_opt::<i32>()
            .ok_or_else(|| DataFusionError::Internal("aggfnoid is not text".into()))?;
        let mut numbers = Vec::with_capacity(names.len());
        for name in names.iter() {
            let name = name.unwrap_or_default();
            let name = name.strip_prefix("pg_catalog.").unwrap_or(name);
            let oid = oids
                .get_mut(name)
                .and_then(VecDeque::pop_front)
                .ok_or_else(|| {
                    DataFusionError::Internal(format!("{name} is no aggregate of pg_proc"))
                })?;
            numbers.push(oid);
        }
        let mut columns = batch.columns().to_vec();
        columns[column] = Arc::new(Int32Array::from(numbers));
        batches.push(RecordBatch::try_new(schema.clone(), columns)?);
    }
    if let Some((name, _)) = oids.iter().find(|(_, left)| !left.is_empty()) {
        return Err(DataFusionError::Internal(format!(
            "pg_proc's aggregate {name} has no row of pg_aggregate"
        )));
    }
    Ok(Arc::new(MemTable::try_new(schema, vec![batches])?))
}

/// The oids of `pg_proc`'s aggregates (`prokind = 'a'`) by name, each name's in ascending
/// order.
fn aggregate_oids() -> Result<HashMap<String, VecDeque<i32>>, DataFusionError> {
    let mut aggregates = Vec::new();
    for batch in static_tables().pg_proc.data() {
        let text = |name: &str| {
            batch
                .column_by_name(name)
                .and_then(|c| c.as_string_opt::<i32>())
                .ok_or_else(|| DataFusionError::Internal(format!("pg_proc.{name} is not text")))
        };
        let (names, kinds) = (text("proname")?, text("prokind")?);
        let numbers = batch
            .column_by_name("oid")
            .filter(|c| c.data_type() == &DataType::Int32)
            .map(|c| c.as_primitive::<datafusion::arrow::datatypes::Int32Type>())
            .ok_or_else(|| DataFusionError::Internal("pg_proc.oid is not an Int32".into()))?;
        for row in 0..batch.num_rows() {
            if kinds.value(row) == "a" {
                aggregates.push((numbers.value(row), names.value(row).to_owned()));
            }
        }
    }
    aggregates.sort_unstable();
    let mut oids: HashMap<String, VecDeque<i32>> = HashMap::new();
    for (oid, name) in aggregates {
        oids.entry(name).or_default().push_back(oid);
    }
    Ok(oids)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_aggregate_is_its_functions_oid() {
        let table = by_oid().unwrap();
        let batches = futures::executor::block_on(async {
            use datafusion::prelude::SessionContext;
            let context = SessionContext::new();
            context.register_table("pg_aggregate", table).unwrap();
            context
                .sql("SELECT aggfnoid, aggtranstype FROM pg_aggregate ORDER BY aggfnoid")
                .await
                .unwrap()
                .collect()
                .await
                .unwrap()
        });
        let rows: Vec<(i32, i32)> = batches
            .iter()
            .flat_map(|b| {
                let oid = b
                    .column(0)
                    .as_primitive::<datafusion::arrow::datatypes::Int32Type>();
                let transition = b
                    .column(1)
                    .as_primitive::<datafusion::arrow::datatypes::Int32Type>();
                (0..b.num_rows())
                    .map(|i| (oid.value(i), transition.value(i)))
                    .collect::<Vec<_>>()
            })
            .collect();
        assert_eq!(rows.len(), 157);
        // avg(int8), avg(int4), avg(float8), sum(int4): PostgreSQL's oids and transition
        // types (internal, _int8, _float8, int8).
        for known in [(2100, 2281), (2101, 1016), (2105, 1022), (2108, 20)] {
            assert!(rows.contains(&known), "{known:?} in {rows:?}");
        }
    }
}
