//! PostgreSQL's system catalog (`pg_catalog`), as clients read it: psql's `\d` family,
//! SQLAlchemy's reflection, pgjdbc's `DatabaseMetaData` (DBeaver, Metabase) and Grafana's
//! pickers all ask `pg_class`, `pg_attribute`, `pg_namespace`, `pg_type` and friends before
//! their first query.
//!
//! The catalog's tables, its functions (`format_type`, `pg_table_is_visible`, `quote_ident`,
//! `has_table_privilege`, ...) and the rewrites of PostgreSQL-only syntax that its queries
//! use (`OPERATOR(pg_catalog.~)`, `'x'::regclass`, `COLLATE pg_catalog.default`) are
//! `datafusion-pg-catalog`'s, whose static tables are PostgreSQL's own rows (`pg_type`,
//! `pg_proc`, ...). What is Tidemark's: the tables it lists are the streams of the engine
//! (`Streams`), each with its table's columns ([`convert::table_schema`]), in one catalog
//! (`tidemark`) and one schema (`public`); the few functions the crate leaves out
//! ([`functions`]); which statements are catalog queries, so that the crate's rewrites,
//! some of which would be wrong answers over streams, touch no query of streams (`rewrite`);
//! the tables of what Tidemark has none of (indexes, constraints, policies...) kept empty, and
//! a catalog query about them that DataFusion cannot plan answered with its columns and no
//! rows (`empty`); and DataFusion's array functions that the crate brings into the build
//! left out where they would make unbounded values.
//!
//! A relation's oid is given the first time a catalog query sees it and kept for the life of
//! the [`SystemCatalog`] (a server keeps one): psql looks a table's oid up in one query and
//! its columns by that oid in the next.

use std::fmt;
use std::sync::{Arc, OnceLock};

use async_trait::async_trait;
use datafusion::arrow::array::{Int32Array, StringArray};
use datafusion::arrow::datatypes::{DataType, Field, SchemaRef};
use datafusion::catalog::{SchemaProvider, TableProvider};
use datafusion::common::{Column, DataFusionError, ScalarValue};
use datafusion::datasource::{provider_as_source, TableType, ViewTable};
use datafusion::execution::session_state::SessionStateBuilder;
use datafusion::execution::SessionState;
use datafusion::logical_expr::{lit, Expr, LogicalPlanBuilder};
use datafusion::prelude::SessionContext;

use datafusion_pg_catalog::pg_catalog::catalog_info::CatalogInfo;
use datafusion_pg_catalog::pg_catalog::context::EmptyContextProvider;
use datafusion_pg_catalog::pg_catalog::{
    setup_pg_catalog, PgCatalogSchemaProvider, PgCatalogStaticTables, PgCatalogTable,
};
use tidemark_engine::{Engine, EngineError};

use crate::{convert, CATALOG, SCHEMA};

mod aggregates;
mod empty;
pub mod functions;
mod rewrite;

pub(crate) use empty::{empty_answer, has_aggregate};
pub(crate) use rewrite::rewrite;

/// The name of PostgreSQL's system catalog schema.
pub const PG_CATALOG: &str = "pg_catalog";

/// The `pg_catalog` schema of one engine's streams, its oids kept across queries. Cheap to
/// clone (one shared catalog).
#[derive(Clone)]
pub struct SystemCatalog {
    schema: Arc<PgCatalogSchemaProvider<Streams, EmptyContextProvider>>,
}

impl fmt::Debug for SystemCatalog {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("SystemCatalog").finish_non_exhaustive()
    }
}

impl SystemCatalog {
    /// The catalog of the streams `engine` gives each time it is asked (a server's engine
    /// may be replaced, as a cluster node's is by a snapshot).
    pub fn new(engine: impl Fn() -> Engine + Send + Sync + 'static) -> SystemCatalog {
        let streams = Streams {
            engine: Arc::new(engine),
        };
        let schema = PgCatalogSchemaProvider::try_new(
            streams,
            static_tables().clone(),
            EmptyContextProvider,
        )
        // try_new only stores its arguments (its Result is for the future).
        .expect("a pg_catalog provider is built from its parts alone");
        SystemCatalog {
            schema: Arc::new(schema),
        }
    }

    /// The catalog of `engine`'s streams, for one query (its oids hold within it).
    pub fn of(engine: &Engine) -> SystemCatalog {
        let engine = engine.clone();
        SystemCatalog::new(move || engine.clone())
    }

    /// The `pg_catalog` schema, to register in a query's catalog.
    pub fn schema(&self) -> Arc<dyn SchemaProvider> {
        Arc::new(CatalogSchema {
            inner: self.schema.clone(),
        })
    }

    /// Whether `pg_catalog.table` never has a row here: PostgreSQL's own rows of it are
    /// none, and Tidemark adds none (policies, triggers, publications, inheritance).
    fn is_empty(&self, table: &str) -> bool {
        if none_here(table) {
            return true;
        }
        match self.schema.build_table_by_name(table) {
            Ok(Some(PgCatalogTable::Static(rows))) => rows.data().iter().all(|b| b.num_rows() == 0),
            Ok(Some(PgCatalogTable::Empty(_))) => true,
            // The streams' tables, and names that are no catalog table.
            Ok(Some(PgCatalogTable::Dynamic(_))) | Ok(None) | Err(_) => false,
        }
    }
}

/// The catalog tables of what Tidemark has none of: indexes, constraints, column defaults,
/// inheritance, triggers, rules. PostgreSQL's own rows of them (which the crate ships)
/// describe PostgreSQL's system tables, which are not here: empty, with their columns.
const NONE_HERE: &[&str] = &[
    "pg_index",
    "pg_constraint",
    "pg_attrdef",
    "pg_inherits",
    "pg_trigger",
    "pg_rewrite",
];

fn none_here(table: &str) -> bool {
    NONE_HERE.contains(&table.to_ascii_lowercase().as_str())
}

/// The crate's `pg_catalog` with the tables of [`NONE_HERE`] empty, and `pg_aggregate`'s
/// functions by oid ([`aggregates`]).
#[derive(Debug)]
struct CatalogSchema {
    inner: Arc<PgCatalogSchemaProvider<Streams, EmptyContextProvider>>,
}

#[async_trait]
impl SchemaProvider for CatalogSchema {
    fn table_names(&self) -> Vec<String> {
        self.inner.table_names()
    }

    async fn table(
        &self,
        name: &str,
    ) -> Result<Option<Arc<dyn datafusion::catalog::TableProvider>>, DataFusionError> {
        if name.eq_ignore_ascii_case("pg_aggregate") {
            return Ok(Some(aggregates::pg_aggregate()?));
        }
        let table = self.inner.table(name).await?;
        if let (Some(inner), Some(arrays)) = (&table, array_columns(name)) {
            return Ok(Some(with_array_columns(name, inner.clone(), arrays)?));
        }
        if !none_here(name) {
            return Ok(table);
        }
        Ok(match table {
            Some(table) => Some(Arc::new(datafusion::datasource::MemTable::try_new(
                table.schema(),
                vec![Vec::new()],
            )?)),
            None => None,
        })
    }

    fn table_exist(&self, name: &str) -> bool {
        self.inner.table_exist(name)
    }
}

/// The columns of `table` that PostgreSQL types as arrays (`text[]`, `aclitem[]`), which the
/// crate's table leaves out or types as text: psql's `\d+` reads `pg_class.reloptions`,
/// `\dn+` and `\dT+` pass `nspacl` and `typacl` to `array_to_string` (and `\dp` `relacl` and
/// `attacl`, though it still stops at `pg_policy.polroles <> '{0}'`). Tidemark keeps no per-table
/// options and no privileges: each is NULL, as PostgreSQL's is for a relation or schema
/// with the defaults.
fn array_columns(table: &str) -> Option<&'static [&'static str]> {
    NULL_ARRAYS
        .iter()
        .find(|(name, _)| table.eq_ignore_ascii_case(name))
        .map(|(_, columns)| *columns)
}

/// The array columns of [`array_columns`], by table.
const NULL_ARRAYS: &[(&str, &[&str])] = &[
    ("pg_class", &["relacl", "reloptions"]),
    ("pg_namespace", &["nspacl"]),
    ("pg_attribute", &["attacl", "attoptions", "attfdwoptions"]),
    ("pg_type", &["typacl"]),
];

/// Whether `column` is one of the array columns Tidemark keeps NULL ([`array_columns`]);
/// their names are the catalog's alone.
fn is_null_array(column: &str) -> bool {
    NULL_ARRAYS
        .iter()
        .any(|(_, columns)| columns.iter().any(|c| column.eq_ignore_ascii_case(c)))
}

/// `inner` (the crate's `table`) with `arrays` as NULL arrays of text: in its place where
/// it has such a column, after its columns where it has none.
fn with_array_columns(
    table: &str,
    inner: Arc<dyn TableProvider>,
    arrays: &[&str],
) -> Result<Arc<dyn TableProvider>, DataFusionError> {
    let text_array = DataType::List(Arc::new(Field::new_list_field(DataType::Utf8, true)));
    let null_array = |name: &str| -> Result<Expr, DataFusionError> {
        Ok(lit(ScalarValue::try_from(&text_array)?).alias(name))
    };
    let schema = inner.schema();
    let mut columns = Vec::with_capacity(schema.fields().len() + arrays.len());
    for field in schema.fields() {
        columns.push(if arrays.contains(&field.name().as_str()) {
            null_array(field.name())?
        } else {
            Expr::Column(Column::new(Some(table), field.name()))
        });
    }
    for name in arrays {
        if schema.field_with_name(name).is_err() {
            columns.push(null_array(name)?);
        }
    }
    let plan = LogicalPlanBuilder::scan(table, provider_as_source(inner), None)?
        .project(columns)?
        .build()?;
    Ok(Arc::new(ViewTable::new(plan, None)))
}

/// PostgreSQL's own rows of the static tables, read once per process (a megabyte of Arrow).
fn static_tables() -> &'static Arc<PgCatalogStaticTables> {
    static TABLES: OnceLock<Arc<PgCatalogStaticTables>> = OnceLock::new();
    TABLES.get_or_init(|| {
        Arc::new(
            PgCatalogStaticTables::try_new()
                .expect("the pg_catalog tables built into the binary read as Arrow"),
        )
    })
}

/// The oid of each type of PostgreSQL's `pg_type`, by name.
fn type_oids() -> &'static std::collections::HashMap<String, i32> {
    static OIDS: OnceLock<std::collections::HashMap<String, i32>> = OnceLock::new();
    OIDS.get_or_init(|| {
        let mut oids = std::collections::HashMap::new();
        for batch in static_tables().pg_type.data() {
            let column = |name: &str| batch.column_by_name(name).cloned();
            let (Some(names), Some(numbers)) = (column("typname"), column("oid")) else {
                continue;
            };
            let names = names.as_any().downcast_ref::<StringArray>();
            let numbers = numbers.as_any().downcast_ref::<Int32Array>();
            let (Some(names), Some(numbers)) = (names, numbers) else {
                continue;
            };
            for (name, oid) in names.iter().zip(numbers.iter()) {
                if let (Some(name), Some(oid)) = (name, oid) {
                    oids.insert(name.to_owned(), oid);
                }
            }
        }
        oids
    })
}

/// The catalog's functions, and the planner that reads PostgreSQL's oid types
/// (`regclass`, `regtype`, ...), installed in `state` (the session template).
pub(crate) fn install(state: SessionState) -> SessionState {
    let context = SessionContext::new_with_state(state);
    // Registers the functions and the type planner in the context's state, and a
    // pg_catalog schema in its default catalog, which no query sees: each query registers
    // its own catalog, with the engine's pg_catalog (`SystemCatalog::schema`).
    setup_pg_catalog(&context, CATALOG, EmptyContextProvider)
        .expect("the session template has its default catalog");
    let mut state = context.state();
    functions::install(&mut state);
    without_unbounded_array_functions(&mut state);
    without_array_planner(state)
}

/// DataFusion's array functions that catalog queries call on the catalog's array columns
/// (psql and pgjdbc test `x = ANY(column)`, which the crate writes `array_contains`): each
/// makes a number, a boolean or one element, never an array.
const ARRAY_FUNCTIONS_KEPT: &[&str] = &[
    "array_element",
    "array_length",
    "cardinality",
    "array_ndims",
    "array_dims",
    "array_has",
    "array_has_all",
    "array_has_any",
    "array_position",
    // Text, bounded as string functions are (`crate::bounded`): its result is worked out
    // from its elements and separator before it is made.
    "array_to_string",
    // An array of pieces of one text, bounded the same way (at most one element per byte
    // of it): Grafana's pickers split `search_path` with it.
    "string_to_array",
];

/// Leaves out DataFusion's other array functions, which `datafusion-pg-catalog` brings
/// into the build (it asks for DataFusion's default features): arrays are values no
/// operator reserves memory for, and `array_repeat('x', 1e9)`, `range(1e10)`,
/// `array_resize`, `make_array` nested in CTEs make them
/// far larger than what the statement holds (as [`crate::bounded`] says of string
/// functions, which it bounds; `string_to_array`, kept, is bounded there). Tidemark has no array values ([`crate::postgres::arrays`]).
fn without_unbounded_array_functions(state: &mut SessionState) {
    for function in datafusion::functions_nested::all_default_nested_functions() {
        let name = function.name();
        if !ARRAY_FUNCTIONS_KEPT.contains(&name) {
            // Removes its aliases too (`list_repeat`); the Result is the registry trait's.
            let _ = datafusion::execution::FunctionRegistry::deregister_udf(state, name);
        }
    }
}

/// `state` without DataFusion's planner of array syntax (`ARRAY[...]`, `array || array`),
/// which builds `make_array` and `array_concat` calls itself, past the registry. Its
/// planner of `a[i]` stays: one element or a slice, never more than `a`.
fn without_array_planner(state: SessionState) -> SessionState {
    let planners: Vec<_> = state
        .expr_planners()
        .iter()
        // The planner is DataFusion's unit struct; its Debug is its name.
        .filter(|planner| format!("{planner:?}") != "NestedFunctionPlanner")
        .cloned()
        .collect();
    assert!(
        planners.len() < state.expr_planners().len(),
        "DataFusion's NestedFunctionPlanner was found and left out"
    );
    SessionStateBuilder::new_from_existing(state)
        .with_expr_planners(planners)
        .build()
}

/// The streams of an engine as the crate's catalog reads them: catalog `tidemark`, schema
/// `public`, a table per stream.
#[derive(Clone)]
struct Streams {
    engine: Arc<dyn Fn() -> Engine + Send + Sync>,
}

impl fmt::Debug for Streams {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("Streams")
    }
}

impl Streams {
    fn is_ours(catalog: &str, schema: &str) -> bool {
        catalog == CATALOG && schema == SCHEMA
    }
}

#[async_trait]
impl CatalogInfo for Streams {
    async fn catalog_names(&self) -> Result<Vec<String>, DataFusionError> {
        Ok(vec![CATALOG.to_owned()])
    }

    /// `public`, and `pg_catalog` itself: clients tell the catalog's objects from theirs
    /// by its row (psql's completion of table names keeps the relations whose schema is
    /// not `(SELECT oid FROM pg_namespace WHERE nspname = 'pg_catalog')`, which without
    /// the row is NULL and keeps none). It lists no tables here.
    async fn schema_names(&self, catalog: &str) -> Result<Option<Vec<String>>, DataFusionError> {
        Ok((catalog == CATALOG).then(|| vec![SCHEMA.to_owned(), PG_CATALOG.to_owned()]))
    }

    async fn table_names(
        &self,
        catalog: &str,
        schema: &str,
    ) -> Result<Option<Vec<String>>, DataFusionError> {
        Ok(Streams::is_ours(catalog, schema).then(|| (self.engine)().list_streams()))
    }

    async fn table_schema(
        &self,
        catalog: &str,
        schema: &str,
        table: &str,
    ) -> Result<Option<SchemaRef>, DataFusionError> {
        if !Streams::is_ours(catalog, schema) {
            return Ok(None);
        }
        match (self.engine)().stream_schema(table) {
            Ok(schema) => Ok(Some(convert::table_schema(&schema))),
            // Dropped since it was listed: not there.
            Err(EngineError::UnknownStream(_)) => Ok(None),
            Err(e) => Err(DataFusionError::External(Box::new(e))),
        }
    }

    async fn table_type(
        &self,
        catalog: &str,
        schema: &str,
        table: &str,
    ) -> Result<Option<TableType>, DataFusionError> {
        let exists =
            Streams::is_ours(catalog, schema) && (self.engine)().stream_schema(table).is_ok();
        Ok(exists.then_some(TableType::Base))
    }
}
