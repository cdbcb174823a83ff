//! `POST /v1/query`: SQL, answered as it streams; an `INSERT` (with the write token) is
//! appended, durable before it is answered.
//!
//! The statement is planned and its first batch computed before the answer starts, so that
//! every error a statement can have up front gets its status (400, 404, 413); after that the
//! body is written batch by batch through a small channel, in bounded memory however long
//! the answer. A failure mid-answer (a disk read) can then only cut the body short.
//!
//! A query runs at most `limits.query_timeout_ms`, planning included, and stops as soon as
//! its client is gone: even inside a long computation, which checks the query's
//! [`Stop`] (the request's future and the answer's body cancel it when dropped). It runs on
//! the query runtime, never on the workers that take appends, within what all queries share
//! ([`tidemark_sql::resources`]): refused with 503 `resources_exhausted` when that is in use.

use std::io;
use std::sync::Arc;

use arrow_array::{ArrayRef, RecordBatch, UInt64Array};

use axum::body::{Body, Bytes};
use axum::extract::State;
use axum::http::{header, HeaderMap};
use axum::response::{IntoResponse, Response};
use futures::{FutureExt, StreamExt};
use serde::Deserialize;
use tidemark_engine::EngineError;
use tidemark_query::Times;
use tidemark_sql::write::{write_of, Write};
use tidemark_sql::{AnswerWriter, Format, SendableRecordBatchStream, SqlError, SqlOptions, Stop};
use tokio::sync::{mpsc, oneshot};
use tokio::time::Instant;

use super::extract::JsonBody;
use crate::error::ApiError;
use crate::sql_write::{self, SqlWriteError};
use crate::state::{AppState, Namespace};
use crate::store::StoreErrorKind;

/// Encoded chunks of an answer waiting for the client.
const CHUNKS_AHEAD: usize = 2;

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
pub struct QueryRequest {
    sql: String,
    /// `local` (default) or `linearizable`.
    consistency: Option<String>,
    /// How timestamps are written in text answers: `rfc3339` (default) or `ns`.
    time: Option<String>,
}

/// `{"sql": "SELECT ..."}` → `{"columns", "rows"}`, or CSV / NDJSON / an Arrow IPC stream by
/// the Accept header. The query runs on the query runtime ([`tidemark_sql::runtime`]); this
/// handler only waits for its first rows and hands the body on.
pub async fn query(
    State(state): State<AppState>,
    headers: HeaderMap,
    JsonBody(request): JsonBody<QueryRequest>,
) -> Result<Response, ApiError> {
    let times = times_of(request.time.as_deref())?;
    match write_of(&request.sql) {
        Some(Write::Insert) => return insert(&state, &headers, request.sql, times).await,
        Some(Write::CopyFromStdin) => {
            return Err(ApiError::new(
                StoreErrorKind::Invalid,
                "unsupported_sql",
                "COPY ... FROM STDIN takes its rows over PostgreSQL's protocol (psql's \\copy); \
                 over HTTP, send them to POST /v1/streams/{stream}/events",
            ))
        }
        None => {}
    }
    super::cluster::read_barrier(&state, request.consistency.as_deref()).await?;
    let format = format_of(&headers);
    let runtime = tidemark_sql::runtime::query_runtime()
        .map_err(|e| ApiError::internal(format!("starting the query threads: {e}")))?;
    let (head_tx, head_rx) = oneshot::channel();
    let (chunks_tx, chunks_rx) = mpsc::channel(CHUNKS_AHEAD);
    let stop = Stop::after(state.config().limits.query_timeout());
    // The client leaving drops this future, or the answer's body: either stops the query,
    // however busy it is.
    let cancel = stop.cancel_on_drop();
    runtime.spawn(answer(
        state,
        request.sql,
        (format, times),
        stop,
        head_tx,
        chunks_tx,
    ));
    let answer = head_rx
        .await
        .map_err(|_| ApiError::internal("the query stopped before its answer began"))??;
    let body = match answer {
        Answer::Whole(bytes) => Body::from(bytes),
        Answer::Streamed => {
            let chunks =
                futures::stream::unfold((chunks_rx, cancel), |(mut rx, cancel)| async move {
                    rx.recv().await.map(|chunk| (chunk, (rx, cancel)))
                });
            Body::from_stream(chunks.flat_map(|chunk| {
                let pieces: Vec<io::Result<Bytes>> = match chunk {
                    Ok(pieces) => pieces.into_iter().map(Ok).collect(),
                    Err(e) => vec![Err(e)],
                };
                futures::stream::iter(pieces)
            }))
        }
    };
    Ok(([(header::CONTENT_TYPE, format.media_type())], body).into_response())
}

/// An `INSERT`: with the write token where tokens are configured, its rows appended as one
/// batch, answered once durable as a one-row table in the format asked for (`events`,
/// `first_position`, `last_position`: the stream positions the events were given).
async fn insert(
    state: &AppState,
    headers: &HeaderMap,
    sql: String,
    times: Times,
) -> Result<Response, ApiError> {
    super::access::check_writes(state, headers)?;
    // The client leaving drops this future, which stops the statement's query.
    let ack = match sql_write::insert(state, sql).await {
        Ok(ack) => ack,
        Err(SqlWriteError::Sql(e)) => return Err(refusal(state, e)),
        Err(SqlWriteError::Store(e)) => {
            return Err(ApiError::from_store(e, state.retry_after_ms()))
        }
    };
    let positions = ack.and_then(|ack| ack.positions);
    let events = ack.map_or(0, |ack| ack.events);
    let inserted = RecordBatch::try_from_iter([
        (
            "events",
            Arc::new(UInt64Array::from(vec![events])) as ArrayRef,
        ),
        (
            "first_position",
            Arc::new(UInt64Array::from(vec![positions.map(|p| p.first)])),
        ),
        (
            "last_position",
            Arc::new(UInt64Array::from(vec![positions.map(|p| p.last)])),
        ),
    ])
    .map_err(|e| ApiError::internal(format!("the INSERT's answer: {e}")))?;
    let format = format_of(headers);
    let writing = |e: io::Error| ApiError::internal(format!("writing the answer: {e}"));
    let mut writer = AnswerWriter::begin(format, times, &inserted.schema()).map_err(writing)?;
    writer.write(&inserted).map_err(writing)?;
    let body = concat(writer.finish().map_err(writing)?);
    Ok(([(header::CONTENT_TYPE, format.media_type())], body).into_response())
}

/// How time columns are written in text answers: the request's `time`.
fn times_of(time: Option<&str>) -> Result<Times, ApiError> {
    match time {
        None | Some("rfc3339") => Ok(Times::Rfc3339),
        Some("ns") => Ok(Times::Nanoseconds),
        Some(other) => Err(ApiError::new(
            StoreErrorKind::Invalid,
            "bad_request",
            format!("time {other:?}: say \"rfc3339\" or \"ns\""),
        )),
    }
}

/// How an answer that began comes: whole, or in chunks through a channel.
enum Answer {
    Whole(Bytes),
    Streamed,
}

/// Plans `sql` and computes its first rows, says on `head` whether the answer can begin
/// (or why not), then sends the rest through `chunks`. Stops when the client leaves (either
/// channel closes) or at `limits.query_timeout_ms`.
async fn answer(
    state: AppState,
    sql: String,
    (format, times): (Format, Times),
    stop: Stop,
    mut head: oneshot::Sender<Result<Answer, ApiError>>,
    chunks: mpsc::Sender<io::Result<Vec<Bytes>>>,
) {
    let timeout = state.config().limits.query_timeout();
    let deadline = stop
        .deadline()
        .map_or_else(|| Instant::now() + timeout, Instant::from_std);
    let started = tokio::select! {
        () = head.closed() => return,
        started = tokio::time::timeout_at(deadline, start(&state, &sql, format, times, stop)) => started,
    };
    let (mut writer, mut batches) = match started {
        Ok(Ok(started)) => started,
        Ok(Err(error)) => {
            let _ = head.send(Err(error));
            return;
        }
        Err(_) => {
            let _ = head.send(Err(refusal(&state, SqlError::Timeout(timeout))));
            return;
        }
    };
    // An answer already whole (most aggregates: one batch) goes in one piece, with no
    // hand-off per chunk: W2's sub-millisecond queries paid for each.
    match batches.next().now_or_never() {
        Some(None) => {
            let whole = writer
                .finish()
                .map(|pieces| Answer::Whole(concat(pieces)))
                .map_err(|e| ApiError::internal(format!("writing the answer: {e}")));
            let _ = head.send(whole);
            return;
        }
        Some(Some(Err(e))) => {
            let _ = head.send(Err(refusal(&state, e.into())));
            return;
        }
        Some(Some(Ok(batch))) => {
            if let Err(e) = writer.write(&batch) {
                let _ = head.send(Err(ApiError::internal(format!("writing the answer: {e}"))));
                return;
            }
        }
        None => {}
    }
    if head.send(Ok(Answer::Streamed)).is_err() {
        return;
    }
    stream_rest(writer, batches, &chunks, (deadline, timeout)).await;
}

/// Sends the rest of an answer that began, chunk by chunk, until it ends, its client leaves
/// or `deadline` passes (then the body is cut short with the error).
async fn stream_rest(
    mut writer: AnswerWriter,
    mut batches: SendableRecordBatchStream,
    chunks: &mpsc::Sender<io::Result<Vec<Bytes>>>,
    (deadline, timeout): (Instant, std::time::Duration),
) {
    let failed = loop {
        let chunk = writer.take_output();
        if !chunk.is_empty() && chunks.send(Ok(chunk)).await.is_err() {
            return; // The client left.
        }
        let next = tokio::select! {
            // The client left: dropping the stream stops the query's work.
            () = chunks.closed() => return,
            next = tokio::time::timeout_at(deadline, batches.next()) => next,
        };
        let Ok(next) = next else {
            break io::Error::other(SqlError::Timeout(timeout).to_string());
        };
        match next {
            Some(Ok(batch)) => {
                if let Err(e) = writer.write(&batch) {
                    break e;
                }
            }
            Some(Err(e)) => break io::Error::other(SqlError::from(e).to_string()),
            None => match writer.finish() {
                Ok(rest) => {
                    if !rest.is_empty() {
                        let _ = chunks.send(Ok(rest)).await;
                    }
                    return;
                }
                Err(e) => break e,
            },
        }
    };
    tracing::warn!("a query's answer was cut short: {failed}");
    let _ = chunks.send(Err(failed)).await;
}

/// The query planned and its first rows written: every error a statement can have up front
/// comes from here, with its status.
async fn start(
    state: &AppState,
    sql: &str,
    format: Format,
    times: Times,
    stop: Stop,
) -> Result<(AnswerWriter, SendableRecordBatchStream), ApiError> {
    let db = state.db(Namespace::Replicated);
    let options = SqlOptions {
        stop,
        ..state.sql_options()
    };
    let mut batches = tidemark_sql::query_with(state.plans(), &db, sql, options)
        .await
        .map_err(|e| refusal(state, e))?;
    let first = batches
        .next()
        .await
        .transpose()
        .map_err(|e| refusal(state, e.into()))?;
    let writing = |e: io::Error| ApiError::internal(format!("writing the answer: {e}"));
    let mut writer = AnswerWriter::begin(format, times, &batches.schema()).map_err(writing)?;
    if let Some(batch) = &first {
        writer.write(batch).map_err(writing)?;
    }
    Ok((writer, batches))
}

/// An answer's pieces as one (a whole answer is small: one batch).
fn concat(mut pieces: Vec<Bytes>) -> Bytes {
    if pieces.len() == 1 {
        return pieces.swap_remove(0);
    }
    pieces.concat().into()
}

/// A statement's error as this server answers it.
fn refusal(state: &AppState, e: SqlError) -> ApiError {
    from_sql(e, state.retry_after_ms())
}

/// The answer's format by the Accept header; JSON when it names none of the others.
fn format_of(headers: &HeaderMap) -> Format {
    let accept = headers
        .get(header::ACCEPT)
        .and_then(|v| v.to_str().ok())
        .unwrap_or("application/json");
    [Format::Arrow, Format::Csv, Format::JsonLines]
        .into_iter()
        .find(|f| accept.contains(f.media_type()))
        .unwrap_or(Format::JsonDocument)
}

/// A statement's error as an answer: the statement's fault is 400, an engine error is
/// answered as everywhere else (an unknown stream 404...), and what all queries share
/// being in use (memory, spill space, disk, slots) 503 `resources_exhausted` with a hint
/// to retry.
pub fn from_sql(e: SqlError, retry_after_ms: u32) -> ApiError {
    let message = e.to_string();
    match e {
        // Reads never make the engine overloaded: this is the queries' shared resources.
        SqlError::Engine(EngineError::Overloaded(message)) => ApiError {
            retry_after_ms: Some(retry_after_ms),
            ..ApiError::new(StoreErrorKind::Unavailable, "resources_exhausted", message)
        },
        SqlError::Engine(e) => ApiError::from_engine(e, retry_after_ms),
        SqlError::Unsupported(_) => {
            ApiError::new(StoreErrorKind::Invalid, "unsupported_sql", message)
        }
        SqlError::Syntax(_)
        | SqlError::Invalid(_)
        | SqlError::Undefined(..)
        | SqlError::BadValue(..)
        | SqlError::OutOfRange(_)
        | SqlError::TooComplex(_) => ApiError::new(StoreErrorKind::Invalid, "bad_sql", message),
        SqlError::TooLarge(_) => ApiError::new(StoreErrorKind::Invalid, "too_large", message),
        SqlError::Timeout(_) => ApiError::new(StoreErrorKind::Invalid, "query_timeout", message),
        SqlError::Internal(_) => ApiError::internal(message),
    }
}
