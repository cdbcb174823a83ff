//! SQL over Tidemark's streams, on Apache DataFusion.
//!
//! Owns: turning SQL text into a stream of Arrow record batches. Each stream is a table
//! (`tstart`, `tend`, its fields; see [`convert`]) whose scans push the projection, the
//! time range and field predicates down to the engine ([`table`], [`pushdown`]); an
//! aggregate the engine's block summaries answer is answered by them ([`summary`]); names
//! are matched as people write them ([`resolve`]); answers are written as they stream
//! ([`render`]); where DataFusion's answers differ from PostgreSQL's, Tidemark answers as
//! PostgreSQL does ([`postgres`]). Everything else — joins, window functions, CTEs,
//! subqueries, date functions — is DataFusion's.
//!
//! Must never know about: transports (HTTP, the binary protocol), storage formats, Raft.
//! It reads through an [`Engine`], whatever keeps it (an embedded database or a replica).

mod bounded;
pub mod bounds;
pub mod convert;
pub mod extrema;
pub mod moving;
pub mod newest_first;
pub mod params;
pub mod plans;
pub mod postgres;
pub mod pushdown;
pub mod render;
pub mod resolve;
pub mod resources;
pub mod runtime;
pub mod scan_partition;
pub mod semi_join_keys;
pub mod session;
pub mod stop;
mod stop_checks;
pub mod stream_scan;
pub mod summary;
pub mod system_catalog;
pub mod table;
mod top_per_partition;
pub mod write;

use std::pin::Pin;
use std::sync::{Arc, OnceLock};
use std::task::{Context, Poll};

use async_trait::async_trait;
use datafusion::arrow::array::RecordBatch;
use datafusion::arrow::datatypes::SchemaRef;
use datafusion::arrow::error::ArrowError;
use datafusion::catalog::{
    CatalogProvider, CatalogProviderList, MemoryCatalogProvider, MemoryCatalogProviderList,
    MemorySchemaProvider, SchemaProvider, Session,
};
use datafusion::common::tree_node::{TreeNode, TreeNodeRecursion};
use datafusion::common::{DataFusionError, Result as DfResult, SchemaError};
use datafusion::execution::context::QueryPlanner;
use datafusion::execution::{
    FunctionRegistry, RecordBatchStream, SessionState, SessionStateBuilder, TaskContext,
};
use datafusion::logical_expr::LogicalPlan;
use datafusion::physical_optimizer::optimizer::PhysicalOptimizer;
use datafusion::physical_optimizer::PhysicalOptimizerRule;
use datafusion::physical_plan::{execute_stream, ExecutionPlan};
use datafusion::physical_planner::{DefaultPhysicalPlanner, PhysicalPlanner};
use datafusion::prelude::SessionConfig;
use datafusion::sql::sqlparser::ast::{Ident, Statement};
use futures::{Stream, StreamExt};
use tidemark_engine::{Engine, EngineError};

pub use datafusion::physical_plan::SendableRecordBatchStream;
pub use plans::{PlanCache, Planning};
pub use render::{AnswerWriter, Format};
pub use resources::{QueryResources, ResourceLimits};
pub use stop::{CancelOnDrop, Stop};

use bounded::QueryGuard;
use moving::MovingPlan;
use newest_first::NewestFirst;
use plans::{Planned, StreamsRead};
use resolve::Names;
use resources::QuerySlot;
use semi_join_keys::DistinctSemiJoinKeys;
use stop::Refusal;
use summary::{SummaryPlanner, SummaryRule};
use system_catalog::SystemCatalog;
use table::StreamTable;
use top_per_partition::TopPerPartition;

/// Why a statement was not answered.
#[derive(Debug, thiserror::Error)]
pub enum SqlError {
    #[error("SQL syntax: {0}")]
    Syntax(String),
    /// A statement or feature outside what Tidemark answers; the message names it.
    #[error("not supported: {0}")]
    Unsupported(String),
    /// A well-formed statement that does not make sense here (an unknown column, a type
    /// mismatch, a division by zero...).
    #[error("{0}")]
    Invalid(String),
    /// A name that nothing has: a column, or a function (an unknown stream is the engine's
    /// [`EngineError::UnknownStream`]).
    #[error("{1}")]
    Undefined(Undefined, String),
    /// A value an operation cannot take: text that is no value of the type it is cast to,
    /// a division by zero.
    #[error("{1}")]
    BadValue(BadValue, String),
    /// A value outside its type's range: a cast to an integer type of a number it cannot
    /// hold ("integer out of range", [`postgres::casts`]), PostgreSQL's 22003.
    #[error("{0}")]
    OutOfRange(String),
    /// Beyond the bounds on text size, operator count and nesting ([`bounds`]).
    #[error("the statement is too complex: {0}")]
    TooComplex(String),
    /// The query needed more than a query may have: more memory than
    /// [`SqlOptions::memory_bytes`], a value larger than the largest a function may make, or
    /// more spill than all queries may have. The message says which.
    #[error("{0}")]
    TooLarge(String),
    /// The query ran longer than its caller allows (the server's `limits.query_timeout_ms`).
    #[error("the query ran longer than {0:?} and was stopped: narrow the time range or aggregate")]
    Timeout(std::time::Duration),
    #[error(transparent)]
    Engine(#[from] EngineError),
    /// A fault of the SQL engine itself, not of the statement.
    #[error("internal error in the SQL engine: {0}")]
    Internal(String),
}

/// What [`SqlError::Undefined`] found no such one of. Apart from [`SqlError::Invalid`] so
/// that a PostgreSQL client is told as PostgreSQL tells it (psycopg's `UndefinedColumn`,
/// `UndefinedFunction`), which programs branch on.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Undefined {
    Column,
    Function,
}

/// What was wrong with the value of a [`SqlError::BadValue`].
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum BadValue {
    /// Text that does not parse as the type it is cast to (`'abc'::int`).
    InvalidText,
    DivisionByZero,
}

impl From<Refusal> for SqlError {
    fn from(refusal: Refusal) -> SqlError {
        match refusal {
            Refusal::TooLarge(message) => SqlError::TooLarge(message),
            // What all queries share is in use: the server is overloaded, retry shortly
            // (PostgreSQL's insufficient_resources; HTTP 503 resources_exhausted).
            Refusal::Exhausted(message) => SqlError::Engine(EngineError::Overloaded(message)),
            Refusal::Timeout(after) => SqlError::Timeout(after),
            // No one reads it: the client left.
            Refusal::Cancelled => SqlError::Invalid(Refusal::Cancelled.to_string()),
        }
    }
}

/// The message of a query refused for its own memory bound.
fn needs_more_memory(what: &str) -> String {
    format!(
        "the query needs more memory than it may use ({what}): narrow the time range, \
         aggregate, or add a LIMIT"
    )
}

impl From<DataFusionError> for SqlError {
    fn from(mut error: DataFusionError) -> SqlError {
        // Tidemark's own refusals (bounds, stops) keep their kind wherever DataFusion
        // wrapped them.
        if let Some(refusal) = Refusal::find(&error) {
            return refusal.clone().into();
        }
        // An engine error (an unknown stream, a failed read) keeps its kind, so that each
        // transport answers it as it answers the same error elsewhere.
        while let DataFusionError::Context(_, inner) = error {
            error = *inner;
        }
        let error = match error {
            DataFusionError::External(inner) => match inner.downcast::<EngineError>() {
                Ok(engine) => return SqlError::Engine(*engine),
                Err(other) if other.is::<postgres::casts::OutOfRange>() => {
                    return SqlError::OutOfRange(other.to_string())
                }
                Err(other) => return SqlError::Invalid(other.to_string()),
            },
            other => other,
        };
        let message = error.to_string();
        match error.find_root() {
            DataFusionError::External(inner) if inner.is::<postgres::casts::OutOfRange>() => {
                SqlError::OutOfRange(inner.to_string())
            }
            DataFusionError::External(inner) => SqlError::Invalid(inner.to_string()),
            DataFusionError::SQL(e, _) => SqlError::Syntax(e.to_string()),
            DataFusionError::NotImplemented(what) => SqlError::Unsupported(what.clone()),
            DataFusionError::ResourcesExhausted(what)
                if what.contains(resources::SHARED_MEMORY_IN_USE) =>
            {
                SqlError::Engine(EngineError::Overloaded(what.clone()))
            }
            DataFusionError::ResourcesExhausted(what) => {
                SqlError::TooLarge(needs_more_memory(what))
            }
            // DataFusion's own bound on spill files (queries without server resources).
            _ if message.contains("exceeded the allowable limit") => {
                SqlError::TooLarge(needs_more_memory(&message))
            }
            DataFusionError::SchemaError(e, _)
                if matches!(**e, SchemaError::FieldNotFound { .. }) =>
            {
                SqlError::Undefined(Undefined::Column, message)
            }
            // DataFusion's planner says so only in words (`plan_err!`), pinned by a test.
            DataFusionError::Plan(what) if what.starts_with("Invalid function '") => {
                SqlError::Undefined(Undefined::Function, what.clone())
            }
            DataFusionError::ArrowError(e, _) => match **e {
                ArrowError::DivideByZero => SqlError::BadValue(BadValue::DivisionByZero, message),
                // Arrow's words for a number too large for its integer type.
                ArrowError::CastError(ref m) if m.starts_with("Can't cast value") => {
                    SqlError::OutOfRange(message)
                }
                ArrowError::CastError(ref m) if m.starts_with("Cannot cast string") => {
                    SqlError::BadValue(BadValue::InvalidText, message)
                }
                ArrowError::ParseError(_) => SqlError::BadValue(BadValue::InvalidText, message),
                _ => SqlError::Invalid(message),
            },
            DataFusionError::Internal(what) => SqlError::Internal(what.clone()),
            DataFusionError::Plan(what) | DataFusionError::Execution(what) => {
                SqlError::Invalid(what.clone())
            }
            _ => SqlError::Invalid(message),
        }
    }
}

/// How a query runs.
#[derive(Debug, Clone)]
pub struct SqlOptions {
    /// Memory the query's operators (sorts, groups, joins) may hold; beyond it a query
    /// spills (within the server's spill space) or fails with [`SqlError::TooLarge`] rather
    /// than take the server's memory. Scans and answers stream, so this bounds what a
    /// query *keeps*, not what it reads.
    pub memory_bytes: usize,
    /// Whether aggregates the block summaries answer are answered by them (off only to
    /// check them against the plain plan).
    pub summaries: bool,
    /// What all of a server's queries share ([`resources`]): their memory pool, spill space
    /// and slots. Without it the query is bounded by `memory_bytes` alone and spills where
    /// DataFusion spills by default (the CLI, tests).
    pub resources: Option<Arc<QueryResources>>,
    /// When the query stops by itself (its deadline) or from outside (its client left).
    pub stop: Stop,
    /// The `pg_catalog` of the engine's streams, whose oids a server keeps from query to
    /// query ([`system_catalog`]); without one, a query has its own.
    pub system_catalog: Option<SystemCatalog>,
}

impl Default for SqlOptions {
    fn default() -> Self {
        SqlOptions {
            memory_bytes: 256 << 20,
            summaries: true,
            resources: None,
            stop: Stop::never(),
            system_catalog: None,
        }
    }
}

impl SqlOptions {
    /// What the query's function calls may use.
    fn guard(&self) -> QueryGuard {
        QueryGuard {
            stop: self.stop.clone(),
            memory_bytes: match &self.resources {
                Some(r) => self.memory_bytes.min(r.limits().memory_bytes),
                None => self.memory_bytes,
            },
            max_value_bytes: self
                .resources
                .as_ref()
                .map_or(bounded::DEFAULT_MAX_VALUE_BYTES, |r| {
                    r.limits().max_value_bytes
                }),
            constants: Arc::default(),
        }
    }
}

/// Plans `sql` against the streams of `engine` and starts it: the answer's schema and its
/// batches as they come.
pub async fn query(
    engine: &Engine,
    sql: &str,
    options: SqlOptions,
) -> Result<SendableRecordBatchStream, SqlError> {
    query_with(&PlanCache::new(0), engine, sql, options).await
}

/// [`query`], taking the plan of a statement planned before from `plans` (and leaving its
/// plan there for the next time).
pub async fn query_with(
    plans: &PlanCache,
    engine: &Engine,
    sql: &str,
    options: SqlOptions,
) -> Result<SendableRecordBatchStream, SqlError> {
    // The query's slot among those the server runs at once, held until its stream is
    // dropped; planning counts (constant folding computes).
    let slot = match &options.resources {
        Some(resources) => Some(resources.admit()?),
        None => None,
    };
    options.stop.check()?;
    let memory = resources::query_memory(options.memory_bytes, options.resources.as_ref());
    let (mut state, optimized) = optimized_plan(plans, engine, sql, &options).await?;
    fit_to_memory_bound(&mut state, &optimized, options.memory_bytes)?;
    let physical = state
        .query_planner()
        .create_physical_plan(&optimized, &state)
        .await?;
    let physical = stop_checks::checked(physical, &options.stop)?;
    // The query's own memory bound within the server's pool, and its spill files in the
    // server's spill space (the shared session has neither).
    let runtime = resources::query_runtime_env(memory, options.resources.as_ref())?;
    let task = Arc::new(TaskContext::from(&state).with_runtime(runtime));
    let batches = execute_stream(physical, task)?;
    Ok(Box::pin(Guarded {
        schema: batches.schema(),
        batches,
        stop: options.stop,
        stopped: false,
        _slot: slot,
    }))
}

/// The statement's optimized plan and the session state to run it in: the cached plan of an
/// earlier run of the same text when there is one (moved to this query's `now()` when it
/// depends on it), else planned afresh and cached when the cache keeps it.
async fn optimized_plan(
    plans: &PlanCache,
    engine: &Engine,
    sql: &str,
    options: &SqlOptions,
) -> Result<(SessionState, LogicalPlan), SqlError> {
    let guard = options.guard();
    let streams = engine.list_streams();
    Ok(match plans.get(sql, options.summaries, engine, &streams) {
        Some(planned) => {
            let mut state = session_template(options.summaries).clone();
            guard.install(&mut state);
            // What now() means for this query (the template's clock never started).
            state.mark_start_execution();
            let optimized = match planned.moving.as_ref().and_then(|m| m.at(&state)) {
                Some(moved) => {
                    plans.count(Planning::Moved);
                    moved
                }
                None => {
                    plans.count(Planning::Reused);
                    state.optimize(&planned.plan)?
                }
            };
            (state, optimized)
        }
        None => {
            let (mut state, planned) = plan(engine, sql, options, streams).await?;
            guard.install(&mut state);
            state.mark_start_execution();
            let optimized = state.optimize(&planned.plan)?;
            plans.count(Planning::Afresh);
            if plans.keeps(sql) {
                let moving = MovingPlan::new(&state, &planned.plan, &optimized)?;
                plans.put(
                    sql,
                    options.summaries,
                    Arc::new(Planned { moving, ..planned }),
                );
            }
            (state, optimized)
        }
    })
}

/// Sizes the query's batches and its sorts' merge reservation to its memory bound.
fn fit_to_memory_bound(
    state: &mut SessionState,
    optimized: &LogicalPlan,
    memory_bytes: usize,
) -> Result<(), SqlError> {
    // A large literal is repeated for each row of a batch it is projected into: batches
    // small enough that this stays well within the query's bound.
    let batch_size = state.config().batch_size();
    let rows = bounded::batch_rows(
        memory_bytes,
        bounded::largest_literal(optimized),
        batch_size,
    );
    if rows < batch_size {
        state.config_mut().options_mut().execution.batch_size =
            datafusion::common::config::ConfigNonZeroUsize::try_new(rows)?;
    }
    // A sort that spills first sets aside memory to merge its files, in each partition: a
    // quarter of the query's bound over all partitions at most, so that sorts larger than
    // the bound spill rather than fail however many cores there are.
    let execution = &state.config().options().execution;
    let merge = (memory_bytes / 4 / execution.target_partitions.max(1))
        .min(execution.sort_spill_reservation_bytes);
    if merge < execution.sort_spill_reservation_bytes {
        state
            .config_mut()
            .options_mut()
            .execution
            .sort_spill_reservation_bytes = merge;
    }
    Ok(())
}

/// A query's batches, ended by its [`Stop`] (checked before each batch) and holding its
/// slot until dropped.
struct Guarded {
    schema: SchemaRef,
    batches: SendableRecordBatchStream,
    stop: Stop,
    stopped: bool,
    _slot: Option<QuerySlot>,
}

impl Stream for Guarded {
    type Item = DfResult<RecordBatch>;

    fn poll_next(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Option<Self::Item>> {
        if self.stopped {
            return Poll::Ready(None);
        }
        if let Err(refusal) = self.stop.check() {
            self.stopped = true;
            return Poll::Ready(Some(Err(refusal.into())));
        }
        self.batches.poll_next_unpin(cx)
    }
}

impl RecordBatchStream for Guarded {
    fn schema(&self) -> SchemaRef {
        self.schema.clone()
    }
}

/// The logical plan of `sql` (before the optimizer) and the session that planned it.
async fn plan(
    engine: &Engine,
    sql: &str,
    options: &SqlOptions,
    streams: Vec<String>,
) -> Result<(SessionState, Planned), SqlError> {
    let system = system_catalog_of(engine, options);
    let Prepared {
        state,
        statement,
        read,
        catalog,
    } = prepare(
        engine,
        sql,
        options,
        &system,
        streams.clone(),
        Fields::Named,
    )?;
    // A catalog query DataFusion cannot plan (or whose types its analyzer refuses) may be
    // about what Tidemark has none of: its columns, no rows. Kept for that (queries of
    // streams are not copied), and optimized here to find out, within the query's bounds.
    let catalog_query = catalog.then(|| statement.clone());
    let planned = state
        .statement_to_plan(datafusion::sql::parser::Statement::Statement(Box::new(
            statement,
        )))
        .await;
    let planned = match planned {
        Ok(plan) if catalog => {
            let mut checking = state.clone();
            options.guard().install(&mut checking);
            checking.optimize(&plan).map(|_| plan)
        }
        other => other,
    };
    let plan = match planned {
        Ok(plan) => plan,
        Err(error) if unknown_field(&error).is_some() => {
            return Err(unknown_field_of_every(engine, sql, options, &system, streams, error).await)
        }
        Err(error) => match catalog_query
            .as_ref()
            .filter(|_| is_unplannable(&error))
            .and_then(|statement| system_catalog::empty_answer(statement, &system))
        {
            Some(empty) => {
                let statement = one_query(&empty)?;
                state
                    .statement_to_plan(datafusion::sql::parser::Statement::Statement(Box::new(
                        statement,
                    )))
                    .await?
            }
            None => return Err(error.into()),
        },
    };
    refuse_writes(&plan)?;
    let planned = Planned {
        engine: engine.clone(),
        streams,
        read,
        plan,
        moving: None,
    };
    Ok((state, planned))
}

/// Whether DataFusion could not plan a statement (syntax or types it does not take), not
/// whether the statement names something that is not there.
fn is_unplannable(error: &DataFusionError) -> bool {
    matches!(
        error.find_root(),
        DataFusionError::Plan(_) | DataFusionError::NotImplemented(_)
    )
}

/// The field DataFusion did not find, with the fields it looked among.
fn unknown_field(error: &DataFusionError) -> Option<&SchemaError> {
    match error.find_root() {
        DataFusionError::SchemaError(e, _) if matches!(**e, SchemaError::FieldNotFound { .. }) => {
            Some(e)
        }
        _ => None,
    }
}

/// The error of a statement that names a field its streams do not have. A query's tables
/// hold only the fields it names (so that scans read no more), and DataFusion's error lists
/// the fields of those tables: `tstart, tend` alone for a misspelt field. Planned again with
/// every field, the error lists the streams' fields and suggests the nearest; only errors
/// pay for this. `first` is the error of the first planning, kept where the second differs.
async fn unknown_field_of_every(
    engine: &Engine,
    sql: &str,
    options: &SqlOptions,
    system: &SystemCatalog,
    streams: Vec<String>,
    first: DataFusionError,
) -> SqlError {
    let again = match prepare(engine, sql, options, system, streams, Fields::Every) {
        Ok(Prepared {
            state, statement, ..
        }) => {
            state
                .statement_to_plan(datafusion::sql::parser::Statement::Statement(Box::new(
                    statement,
                )))
                .await
        }
        Err(e) => return e,
    };
    let error = match &again {
        Err(error) if unknown_field(error).is_some() => error,
        // Planned with every field: the fields the statement names were not all found by
        // `referenced_columns`, and the first error is the one to show.
        _ => &first,
    };
    match unknown_field(error) {
        Some(field) => SqlError::Undefined(
            Undefined::Column,
            without_datafusion_setting(&field.to_string()),
        ),
        None => first.into(),
    }
}

/// DataFusion's advice on a name that differs in case only names a setting of its own
/// (`enable_ident_normalization`) that Tidemark does not expose: said as Tidemark's rule.
fn without_datafusion_setting(message: &str) -> String {
    message
        .lines()
        .map(|line| {
            if line.starts_with("Column names are case sensitive") {
                "Quoted names match exactly; unquoted, they match without regard to case."
            } else {
                line
            }
        })
        .collect::<Vec<_>>()
        .join("\n")
}

/// Which fields of its streams a query's tables hold.
#[derive(Clone, Copy, PartialEq, Eq)]
enum Fields {
    /// Those the statement names (with `tstart` and `tend`): scans read no more.
    Named,
    /// All of them: to say which fields there are.
    Every,
}

/// The statements of `sql`, each as text: a client may send several in one message. One
/// statement keeps its text as sent.
pub fn statements(sql: &str) -> Result<Vec<String>, SqlError> {
    let parsed = bounds::parse_bounded(sql)?;
    if parsed.len() == 1 {
        return Ok(vec![sql.to_owned()]);
    }
    Ok(parsed.iter().map(ToString::to_string).collect())
}

/// The schema of `sql`'s answer, planned but not run: what a client asks for before it
/// executes a statement.
pub async fn describe(
    engine: &Engine,
    sql: &str,
    options: SqlOptions,
) -> Result<SchemaRef, SqlError> {
    let (_, planned) = plan(engine, sql, &options, engine.list_streams()).await?;
    Ok(Arc::new(planned.plan.schema().as_arrow().clone()))
}

/// Runs `sql` to the end and returns its batches (for small answers and tests).
pub async fn query_all(
    engine: &Engine,
    sql: &str,
    options: SqlOptions,
) -> Result<(SchemaRef, Vec<RecordBatch>), SqlError> {
    let mut stream = query(engine, sql, options).await?;
    let schema = stream.schema();
    let mut batches = Vec::new();
    while let Some(batch) = stream.next().await {
        batches.push(batch?);
    }
    Ok((schema, batches))
}

/// A statement parsed and resolved, and the session to plan it in.
struct Prepared {
    /// A session whose tables are the streams the statement names, and `pg_catalog` when
    /// it is a catalog query.
    state: SessionState,
    statement: Statement,
    /// The streams it reads and their schemas.
    read: StreamsRead,
    /// Whether it reads PostgreSQL's catalog (and so no stream).
    catalog: bool,
}

/// Parses and resolves the one statement of `sql` against `streams` (all of `engine`'s)
/// and `system`; its tables hold the fields `fields` says.
fn prepare(
    engine: &Engine,
    sql: &str,
    options: &SqlOptions,
    system: &SystemCatalog,
    streams: Vec<String>,
    fields: Fields,
) -> Result<Prepared, SqlError> {
    let mut names = Names::new(streams);
    let (mut statement, catalog) = system_catalog::rewrite(one_query(sql)?, |table| {
        names.stream(&Ident::new(table)).is_some()
    });
    postgres::syntax::like_escape(&mut statement);
    postgres::syntax::information_schema_columns(&mut statement);
    let table_functions = session_template(options.summaries).table_functions();
    postgres::syntax::functions_in_from(&mut statement, |f| table_functions.contains_key(f));
    postgres::subqueries::rewrite(&mut statement, |t| names.stream(t).is_some());
    let lists_streams = is_listing(&statement);
    let relations = resolve::relations(&statement);
    if catalog {
        // The catalog's queries are a client's own, in PostgreSQL's syntax, planned as they
        // are; a stream's names are resolved as Tidemark resolves them. Not both at once.
        if let Some(stream) = relations
            .tables
            .iter()
            .find(|t| !relations.is_cte(t) && names.stream(t).is_some())
        {
            return Err(SqlError::Unsupported(format!(
                "a query of both a stream ({stream}) and PostgreSQL's catalog (pg_catalog): \
                 query them apart"
            )));
        }
    }
    let (state, tables) = session_of_own_tables(options.summaries, catalog.then_some(system))?;
    names.add_columns([convert::TSTART, convert::TEND].map(String::from));
    let mut read = std::collections::BTreeMap::new();
    // information_schema (and SHOW TABLES, SHOW COLUMNS, which read it) lists the tables
    // of the catalog: every stream then.
    let lists_every_stream = lists_streams
        || relations
            .qualified
            .iter()
            .any(|(s, _)| s == INFORMATION_SCHEMA);
    let wanted: Vec<Ident> = if lists_every_stream {
        names.streams().map(Ident::new).collect()
    } else {
        // A stream may be named in its schema, as Grafana does: `"public"."trades"`.
        let in_schema = relations
            .qualified
            .iter()
            .filter(|(schema, _)| schema == SCHEMA)
            .map(|(_, table)| table.clone());
        relations.tables.iter().cloned().chain(in_schema).collect()
    };
    for relation in &wanted {
        let Some(stream) = names.stream(relation).map(str::to_string) else {
            if relations.is_cte(relation) {
                continue;
            }
            // Said here, as everywhere else, rather than as DataFusion's "table
            // 'tidemark.public.x' not found".
            return Err(EngineError::UnknownStream(relation.value.clone()).into());
        };
        if read.contains_key(&stream) {
            continue;
        }
        let schema = engine.stream_schema(&stream)?;
        names.add_columns(schema.fields().iter().map(|f| f.name.clone()));
        read.insert(stream, schema);
    }
    if !catalog {
        resolve::resolve(&mut statement, &names).map_err(SqlError::Invalid)?;
    }
    // A listing shows every field; a query's tables only have the fields it names.
    let used = if lists_every_stream || fields == Fields::Every {
        None
    } else {
        resolve::referenced_columns(&statement)
    };
    register_tables(engine, &tables, &read, used.as_deref())?;
    Ok(Prepared {
        state,
        statement,
        read: read.into_iter().collect(),
        catalog,
    })
}

/// The `pg_catalog` a query of `engine` reads: the server's, or one of its own.
fn system_catalog_of(engine: &Engine, options: &SqlOptions) -> SystemCatalog {
    match &options.system_catalog {
        Some(system) => system.clone(),
        None => SystemCatalog::of(engine),
    }
}

/// Whether `statement` lists streams or fields (`SHOW TABLES`, `SHOW COLUMNS`).
fn is_listing(statement: &Statement) -> bool {
    matches!(
        statement,
        Statement::ShowTables { .. } | Statement::ShowColumns { .. }
    )
}

/// The one statement of `sql`, which must be a query (or a listing of streams or fields).
fn one_query(sql: &str) -> Result<Statement, SqlError> {
    let mut statements = bounds::parse_bounded(sql)?;
    let statement = match (statements.pop(), statements.is_empty()) {
        (None, _) => return Err(SqlError::Syntax("empty statement".into())),
        (Some(statement), true) => statement,
        (Some(_), false) => {
            return Err(SqlError::Unsupported(format!(
                "{} statements (send exactly one)",
                statements.len() + 1
            )))
        }
    };
    if !is_listing(&statement)
        && !matches!(statement, Statement::Query(_) | Statement::Explain { .. })
    {
        if matches!(statement, Statement::Insert(_) | Statement::Copy { .. }) {
            return Err(SqlError::Unsupported(
                "INSERT and COPY here (a server takes INSERT through POST /v1/query and \
                 PostgreSQL's protocol, COPY ... FROM STDIN through PostgreSQL's; see \
                 docs/sql.md)"
                    .into(),
            ));
        }
        let text = statement.to_string();
        let verb = text.split_whitespace().next().unwrap_or("this");
        return Err(SqlError::Unsupported(format!(
            "{verb} statements: Tidemark runs queries, INSERT and COPY ... FROM STDIN \
             (docs/sql.md); a driver prepares a query through the protocol itself"
        )));
    }
    Ok(statement)
}

/// A session whose catalog holds only the tables registered in the returned schema: a
/// query's own, not the template's; and `system`, the streams' `pg_catalog`, for a catalog
/// query (others, `SHOW TABLES` among them, list the streams alone).
fn session_of_own_tables(
    summaries: bool,
    system: Option<&SystemCatalog>,
) -> Result<(SessionState, Arc<MemorySchemaProvider>), SqlError> {
    let mut state = session_template(summaries).clone();
    let tables = Arc::new(MemorySchemaProvider::new());
    let catalog = MemoryCatalogProvider::new();
    catalog.register_schema(SCHEMA, tables.clone())?;
    if let Some(system) = system {
        catalog.register_schema(system_catalog::PG_CATALOG, system.schema())?;
    }
    let catalogs = MemoryCatalogProviderList::new();
    catalogs.register_catalog(CATALOG.into(), Arc::new(catalog));
    state.register_catalog_list(Arc::new(catalogs));
    Ok((state, tables))
}

/// Registers each stream of `read` as a table in `tables`, with only the fields in `used`
/// (sorted; `tstart` and `tend` always) when given, else with all its fields.
fn register_tables(
    engine: &Engine,
    tables: &MemorySchemaProvider,
    read: &std::collections::BTreeMap<String, Arc<tidemark_core::Schema>>,
    used: Option<&[String]>,
) -> Result<(), SqlError> {
    for (stream, schema) in read {
        let schema = match used {
            // Only the fields the statement names (tstart and tend are always there).
            Some(used) => {
                let kept: Vec<usize> = (0..schema.fields().len())
                    .filter(|&i| used.binary_search(&schema.fields()[i].name).is_ok())
                    .collect();
                Arc::new(schema.project(&kept))
            }
            None => schema.clone(),
        };
        let table = StreamTable::new(engine.clone(), stream.clone(), schema);
        tables.register_table(stream.clone(), Arc::new(table))?;
    }
    Ok(())
}

const INFORMATION_SCHEMA: &str = "information_schema";

/// The catalog and schema of a query's tables (`tidemark.public.ticks`).
const CATALOG: &str = "tidemark";
const SCHEMA: &str = "public";

/// DataFusion's physical optimizer rules, with [`TopPerPartition`] where its own `WindowTopN`
/// stands (left off in Tidemark's configuration: its heaps cannot spill).
fn physical_rules() -> Vec<Arc<dyn PhysicalOptimizerRule + Send + Sync>> {
    let mut rules = PhysicalOptimizer::new().rules;
    let window_top_n = rules.iter().position(|rule| rule.name() == "WindowTopN");
    let at = window_top_n.expect("DataFusion's physical optimizer has its WindowTopN rule");
    rules.insert(at + 1, Arc::new(TopPerPartition));
    rules
}

/// The session every query starts from: configuration, DataFusion's functions, Tidemark's
/// rule and planner. Built once per process and cloned per query (building one registers a
/// few hundred functions, which cost W2's small queries more than planning and running
/// them); each query then gets its own catalog and its own memory bound.
fn session_template(summaries: bool) -> &'static SessionState {
    static WITH_SUMMARIES: OnceLock<SessionState> = OnceLock::new();
    static WITHOUT: OnceLock<SessionState> = OnceLock::new();
    let build = move || {
        let mut config = SessionConfig::new()
            .with_information_schema(true)
            .with_default_catalog_and_schema(CATALOG, SCHEMA);
        // Timestamps compared with text such as '2026-11-24 10:00' are UTC, as everywhere
        // in Tidemark.
        config.options_mut().execution.time_zone = Some("UTC".into());
        let mut builder = SessionStateBuilder::new()
            .with_config(config)
            .with_default_features()
            .with_query_planner(Arc::new(TidemarkPlanner))
            .with_optimizer_rule(Arc::new(DistinctSemiJoinKeys))
            .with_physical_optimizer_rules(physical_rules())
            .with_physical_optimizer_rule(Arc::new(NewestFirst));
        if summaries {
            builder = builder.with_optimizer_rule(Arc::new(SummaryRule));
        }
        // The catalog's functions first: Tidemark's own below replace any of the same name.
        let mut state = system_catalog::install(builder.build());
        // Before the bounds, which then wrap Tidemark's to_char as DataFusion's functions.
        postgres::install(&mut state);
        bounded::bound_functions(&mut state);
        for function in extrema::functions() {
            // Replaces DataFusion's function of the same name. SessionState's registry
            // cannot fail (the Result is the trait's, for registries that can).
            let replaced = state
                .register_udaf(Arc::new(function))
                .expect("a session's registry takes any function");
            assert!(
                replaced.is_some(),
                "extrema replace DataFusion's min and max"
            );
        }
        state
    };
    if summaries {
        WITH_SUMMARIES.get_or_init(build)
    } else {
        WITHOUT.get_or_init(build)
    }
}

/// DataFusion's physical planner, with the summary aggregate added.
#[derive(Debug)]
struct TidemarkPlanner;

#[async_trait]
impl QueryPlanner for TidemarkPlanner {
    async fn create_physical_plan(
        &self,
        logical_plan: &LogicalPlan,
        session: &dyn Session,
    ) -> DfResult<Arc<dyn ExecutionPlan>> {
        DefaultPhysicalPlanner::with_extension_planners(vec![Arc::new(SummaryPlanner)])
            .create_physical_plan(logical_plan, session)
            .await
    }
}

/// Only reads: DDL and DML planned by DataFusion (`CREATE VIEW`, `INSERT INTO`) would
/// change nothing in Tidemark and are refused by name.
fn refuse_writes(plan: &LogicalPlan) -> Result<(), SqlError> {
    let mut refused = None;
    // Anywhere in the plan, not only at its top (under EXPLAIN, say).
    plan.apply(|node| {
        Ok(match node {
            LogicalPlan::Dml(_)
            | LogicalPlan::Ddl(_)
            | LogicalPlan::Copy(_)
            | LogicalPlan::Statement(_) => {
                refused = Some(node.display().to_string());
                TreeNodeRecursion::Stop
            }
            _ => TreeNodeRecursion::Continue,
        })
    })?;
    match refused {
        Some(what) => Err(SqlError::Unsupported(format!("{what} (only queries are)"))),
        None => Ok(()),
    }
}
