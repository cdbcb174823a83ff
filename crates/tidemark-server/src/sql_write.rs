//! SQL's writes (`INSERT`, and the rows of a PostgreSQL `COPY ... FROM STDIN`) stored as
//! every other door stores events: the rows held on the append budget while they are
//! appended, one command for the whole statement (all of it or none), answered once
//! durable (on a cluster: committed), counted in `/metrics` as appended.
//!
//! Who may write is the transport's to check before it calls here (the write token).
//!
//! Must never know about: how a transport answers (each maps [`SqlWriteError`] once).

use tidemark_core::Command;
use tidemark_sql::write::Rows;
use tidemark_sql::{SqlError, SqlOptions};

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

/// Runs the `INSERT` `sql` (its values or query, on the query runtime, within `options`)
/// and appends its rows; `None` when it had none.
pub async fn insert(
    state: &AppState,
    sql: String,
    options: SqlOptions,
) -> Result<Option<Ack>, SqlWriteError> {
    let runtime = tidemark_sql::runtime::query_runtime()
        .map_err(|e| StoreError::internal(format!("starting the query threads: {e}")))?;
    let worker = state.clone();
    let rows = runtime
        .spawn(async move {
            let db = worker.db(Namespace::Replicated);
            let max_bytes = worker.config().limits.max_body_bytes;
            tidemark_sql::write::insert(&db, &sql, options, max_bytes).await
        })
        .await
        .map_err(|e| StoreError::internal(format!("the INSERT stopped: {e}")))??;
    append_rows(state, rows).await
}

/// Appends `rows` as one batch; `None` when there are none (nothing is logged).
pub async fn append_rows(state: &AppState, rows: Rows) -> Result<Option<Ack>, SqlWriteError> {
    if rows.events.is_empty() {
        return Ok(None);
    }
    let bytes = rows.events.heap_bytes();
    let permit = state.admission().try_admit(bytes).ok_or_else(|| {
        StoreError::new(
            StoreErrorKind::Overloaded,
            format!(
                "the server is taking as many appends as it can (limits.max_in_flight_bytes); \
                 retry the {} events shortly",
                rows.events.len()
            ),
        )
    })?;
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
