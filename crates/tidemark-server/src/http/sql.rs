//! `POST /v1/query`: SQL, answered as it streams.
//!
//! The statement is planned and its first batch computed before the answer starts, so that
//! every error a statement can have up front gets its status (400, 404, 413); after that the
//! body is written batch by batch through a small channel, in bounded memory however long
//! the answer. A failure mid-answer (a disk read) can then only cut the body short.
//!
//! A query runs at most `limits.query_timeout_ms`, planning included, and stops as soon as
//! its client is gone.

use axum::body::Body;
use axum::extract::State;
use axum::http::{header, HeaderMap, StatusCode};
use axum::response::{IntoResponse, Response};
use futures::StreamExt;
use serde::Deserialize;
use tidemark_query::Times;
use tidemark_sql::{AnswerWriter, Format, SqlError, SqlOptions};

use super::JsonBody;
use crate::error::ApiError;
use crate::state::{AppState, Namespace};

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
/// the Accept header.
pub async fn query(
    State(state): State<AppState>,
    headers: HeaderMap,
    JsonBody(request): JsonBody<QueryRequest>,
) -> Result<Response, ApiError> {
    super::cluster::read_barrier(&state, request.consistency.as_deref()).await?;
    let times = match request.time.as_deref() {
        None | Some("rfc3339") => Times::Rfc3339,
        Some("ns") => Times::Nanoseconds,
        Some(other) => {
            return Err(ApiError::new(
                StatusCode::BAD_REQUEST,
                "bad_request",
                format!("time {other:?}: say \"rfc3339\" or \"ns\""),
            ))
        }
    };
    let format = format_of(&headers);
    let db = state.db(Namespace::Replicated);
    let options = SqlOptions {
        memory_bytes: state.config().limits.max_result_bytes,
        ..SqlOptions::default()
    };
    let timeout = state.config().limits.query_timeout();
    let deadline = tokio::time::Instant::now() + timeout;
    let retry_after_ms = state.retry_after_ms();
    let rejected = |e: SqlError| {
        let error = from_sql(e, retry_after_ms);
        state.count_rejection(&error);
        error
    };
    let timed_out = || rejected(SqlError::Timeout(timeout));
    let mut batches =
        tokio::time::timeout_at(deadline, tidemark_sql::query(&db, &request.sql, options))
            .await
            .map_err(|_| timed_out())?
            .map_err(rejected)?;
    let first = match tokio::time::timeout_at(deadline, batches.next())
        .await
        .map_err(|_| timed_out())?
    {
        Some(batch) => Some(batch.map_err(|e| rejected(e.into()))?),
        None => None,
    };
    let schema = batches.schema();
    let mut writer = AnswerWriter::begin(format, times, &schema, Vec::new())
        .map_err(|e| ApiError::internal(format!("writing the answer: {e}")))?;
    if let Some(batch) = &first {
        writer
            .write(batch)
            .map_err(|e| ApiError::internal(format!("writing the answer: {e}")))?;
    }
    let (tx, rx) = tokio::sync::mpsc::channel::<std::io::Result<Vec<u8>>>(CHUNKS_AHEAD);
    tokio::spawn(async move {
        let mut writer = writer;
        let failed = loop {
            let chunk = writer.take_output();
            if !chunk.is_empty() && tx.send(Ok(chunk)).await.is_err() {
                return; // The client left.
            }
            let next = tokio::select! {
                // The client left: dropping the stream stops the query's work.
                () = tx.closed() => return,
                next = tokio::time::timeout_at(deadline, batches.next()) => next,
            };
            let Ok(next) = next else {
                break std::io::Error::other(SqlError::Timeout(timeout).to_string());
            };
            match next {
                Some(Ok(batch)) => {
                    if let Err(e) = writer.write(&batch) {
                        break e;
                    }
                }
                Some(Err(e)) => break std::io::Error::other(SqlError::from(e).to_string()),
                None => match writer.finish() {
                    Ok(rest) => {
                        if !rest.is_empty() {
                            let _ = tx.send(Ok(rest)).await;
                        }
                        return;
                    }
                    Err(e) => break e,
                },
            }
        };
        tracing::warn!("a query's answer was cut short: {failed}");
        let _ = tx.send(Err(failed)).await;
    });
    let body = futures::stream::unfold(rx, |mut rx| async move {
        rx.recv().await.map(|chunk| (chunk, rx))
    });
    Ok((
        [(header::CONTENT_TYPE, format.media_type())],
        Body::from_stream(body),
    )
        .into_response())
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
/// answered as everywhere else (an unknown stream 404...).
pub fn from_sql(e: SqlError, retry_after_ms: u32) -> ApiError {
    let message = e.to_string();
    match e {
        SqlError::Engine(e) => ApiError::from_engine(e, retry_after_ms),
        SqlError::Unsupported(_) => {
            ApiError::new(StatusCode::BAD_REQUEST, "unsupported_sql", message)
        }
        SqlError::Syntax(_) | SqlError::Invalid(_) | SqlError::TooComplex(_) => {
            ApiError::new(StatusCode::BAD_REQUEST, "bad_sql", message)
        }
        SqlError::TooLarge(_) => ApiError::new(StatusCode::BAD_REQUEST, "too_large", message),
        SqlError::Timeout(_) => ApiError::new(StatusCode::BAD_REQUEST, "query_timeout", message),
        SqlError::Internal(_) => ApiError::internal(message),
    }
}
