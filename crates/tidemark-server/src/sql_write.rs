//! SQL's writes (`INSERT`, and the rows of a PostgreSQL `COPY ... FROM STDIN`) stored as
//! every other door stores events: the rows held on the append budget from the moment they
//! are computed or received until they are appended, one command for the whole statement
//! (all of it or none), answered once durable (on a cluster: committed), counted in
//! `/metrics` as appended.
//!
//! Who may write is the transport's to check before it calls here (the write token).
//!
//! Must never know about: how a transport answers (each maps [`SqlWriteError`] once).

use std::sync::{Arc, Mutex, PoisonError};

use tidemark_core::Command;
use tidemark_sql::write::Rows;
use tidemark_sql::{SqlError, SqlOptions, Stop};

use crate::admission::Permit;
use crate::state::{AppState, Namespace};
use crate::store::{Ack, StoreError, StoreErrorKind};

/// Why an SQL write stored nothing: its statement (planning, its values) or the store.
#[derive(Debug)]
pub enum SqlWriteError {
    Sql(SqlError),
    Store(StoreError),
}

impl From<SqlError> for SqlWriteError {
    fn from(e: SqlError) -> SqlWriteError {
        SqlWriteError::Sql(e)
    }
}

impl From<StoreError> for SqlWriteError {
    fn from(e: StoreError) -> SqlWriteError {
        SqlWriteError::Store(e)
    }
}

/// The refusal of a write when the append budget is in use: retry shortly.
pub fn overloaded(what: &str) -> StoreError {
    StoreError::new(
        StoreErrorKind::Overloaded,
        format!(
            "the server is taking as many appends as it can (limits.max_in_flight_bytes): \
             retry the {what} shortly"
        ),
    )
}

/// Runs the `INSERT` `sql` (its values or query, on the query runtime, within the server's
/// query bounds and timeout) and appends its rows; `None` when it had none. Dropping the
/// future stops the statement's query.
pub async fn insert(state: &AppState, sql: String) -> Result<Option<Ack>, SqlWriteError> {
    let stop = Stop::after(state.config().limits.query_timeout());
    let _cancel = stop.cancel_on_drop();
    let options = SqlOptions {
        stop,
        ..state.sql_options()
    };
    let runtime = tidemark_sql::runtime::query_runtime()
        .map_err(|e| StoreError::internal(format!("starting the query threads: {e}")))?;
    let permit = state
        .admission()
        .try_admit(0)
        .ok_or_else(|| overloaded("INSERT"))?;
    let permit = Arc::new(Mutex::new(permit));
    let worker = state.clone();
    let held = permit.clone();
    let rows = runtime
        .spawn(async move {
            let db = worker.db(Namespace::Replicated);
            let max_bytes = worker.config().limits.max_body_bytes;
            let mut reserve = move |bytes: usize| {
                held.lock()
                    .unwrap_or_else(PoisonError::into_inner)
                    .grow(bytes)
            };
            tidemark_sql::write::insert(&db, &sql, options, max_bytes, &mut reserve).await
        })
        .await
        .map_err(|e| StoreError::internal(format!("the INSERT stopped: {e}")))??;
    let permit = Arc::try_unwrap(permit)
        .map_err(|_| StoreError::internal("the INSERT's budget is still shared"))?
        .into_inner()
        .unwrap_or_else(PoisonError::into_inner);
    append_rows(state, rows, permit).await
}

/// Appends `rows` as one batch, their bytes held by `permit` until the append is answered;
/// `None` when there are none (nothing is logged).
pub async fn append_rows(
    state: &AppState,
    rows: Rows,
    permit: Permit,
) -> Result<Option<Ack>, SqlWriteError> {
    if rows.events.is_empty() {
        return Ok(None);
    }
    let bytes = rows.events.heap_bytes();
    let command = Command::Append {
        name: rows.stream,
        batch: rows.events,
        producer: None,
    };
    // Boxed: the store's future (a cluster's Raft write) nested in a statement's is deeper
    // than the compiler's layout computation goes by default.
    let ack = Box::pin(state.store(Namespace::Replicated).submit(command)).await?;
    drop(permit);
    state.metrics().appended(ack.events as usize, bytes);
    Ok(Some(ack))
}
