//! What handlers take from a request: bodies read in full under admission control (appends
//! on the write budget, control and query bodies on their own), JSON parsed strictly, path
//! and query parameters refused as JSON errors, the producer tag of an append.

use std::sync::Arc;
use std::time::Duration;

use axum::extract::{FromRequest, FromRequestParts, Path, Query, Request};
use axum::http::request::Parts;
use axum::http::{header, HeaderMap, StatusCode};
use http_body_util::BodyExt;
use serde::de::DeserializeOwned;
use tidemark_core::ProducerSeq;

use crate::admission::{Admission, Permit};
use crate::error::ApiError;
use crate::state::{AppState, MAX_CONTROL_BODY};
use crate::store::StoreErrorKind;

/// A request body read in full, with the admission it holds until the request is answered.
pub struct Body {
    pub bytes: Vec<u8>,
    pub permit: Permit,
}

/// Reads an append's body of at most `limits.max_body_bytes` (413 beyond), admitting its
/// bytes against the write budget as they arrive (429 once it is full).
pub async fn read_body(
    state: &AppState,
    headers: &HeaderMap,
    body: axum::body::Body,
) -> Result<Body, ApiError> {
    let limit = state.config().limits.max_body_bytes;
    read_admitted(state, state.admission(), limit, headers, body).await
}

/// Reads a body of at most `limit` bytes under `budget`. Bytes are admitted as they arrive,
/// never on a declared length alone: a client that announces a large body and sends nothing
/// holds nothing. A body whose bytes stop coming for the read timeout is refused (408).
async fn read_admitted(
    state: &AppState,
    budget: &Arc<Admission>,
    limit: usize,
    headers: &HeaderMap,
    body: axum::body::Body,
) -> Result<Body, ApiError> {
    let declared = headers
        .get(header::CONTENT_LENGTH)
        .and_then(|v| v.to_str().ok()?.parse::<usize>().ok());
    if declared.is_some_and(|n| n > limit) {
        return Err(ApiError::too_large(limit));
    }
    let overloaded = || {
        ApiError::overloaded(
            "the server has too many request bytes in flight; retry later",
            state.retry_after_ms(),
        )
    };
    let read_timeout = state.config().limits.read_timeout();
    let mut body = body;
    let Some(mut permit) = budget.try_admit(0) else {
        return Err(overloaded());
    };
    // Capacity is address space until written, so the declared length may size it.
    let mut bytes = Vec::with_capacity(declared.unwrap_or(0));
    loop {
        let frame = match tokio::time::timeout(read_timeout, body.frame()).await {
            Err(_elapsed) => {
                let message = format!(
                    "the request body stopped arriving for {} ms",
                    read_timeout.as_millis()
                );
                return Err(ApiError::new(StoreErrorKind::Invalid, "timeout", message)
                    .with_status(StatusCode::REQUEST_TIMEOUT));
            }
            Ok(None) => break,
            Ok(Some(frame)) => {
                frame.map_err(|e| ApiError::bad_request(format!("reading the body: {e}")))?
            }
        };
        let Ok(data) = frame.into_data() else {
            continue;
        };
        let total = bytes.len() + data.len();
        if total > limit {
            return Err(ApiError::too_large(limit));
        }
        if !permit.grow(data.len()) {
            drop((bytes, permit));
            discard(&mut body, limit, read_timeout).await;
            return Err(overloaded());
        }
        bytes.extend_from_slice(&data);
    }
    debug_assert_eq!(
        permit.bytes(),
        bytes.len(),
        "admitted exactly what was read"
    );
    Ok(Body { bytes, permit })
}

/// Reads and drops the rest of a refused body (at most `limit` bytes, while it keeps
/// coming), so that the client, still sending, gets the refusal instead of a reset
/// connection. Costs no memory.
async fn discard(body: &mut axum::body::Body, limit: usize, read_timeout: Duration) {
    let mut seen = 0;
    while let Ok(Some(Ok(frame))) = tokio::time::timeout(read_timeout, body.frame()).await {
        if let Ok(data) = frame.into_data() {
            seen += data.len();
            if seen > limit {
                return;
            }
        }
    }
}

impl FromRequest<AppState> for Body {
    type Rejection = ApiError;

    async fn from_request(request: Request, state: &AppState) -> Result<Self, ApiError> {
        let (parts, body) = request.into_parts();
        read_body(state, &parts.headers, body).await
    }
}

/// A small JSON request body (at most [`MAX_CONTROL_BODY`] bytes, on the control budget),
/// then parsed (400 with the parser's message when it is not JSON of this shape).
pub struct JsonBody<T>(pub T);

impl<T: DeserializeOwned> FromRequest<AppState> for JsonBody<T> {
    type Rejection = ApiError;

    async fn from_request(request: Request, state: &AppState) -> Result<Self, ApiError> {
        let ControlBody(bytes) = ControlBody::from_request(request, state).await?;
        parse_json(&bytes).map(JsonBody)
    }
}

/// A small request body of any form (at most [`MAX_CONTROL_BODY`] bytes, on the control
/// budget): a read request that is not JSON (Prometheus remote read).
pub struct ControlBody(pub Vec<u8>);

impl FromRequest<AppState> for ControlBody {
    type Rejection = ApiError;

    async fn from_request(request: Request, state: &AppState) -> Result<Self, ApiError> {
        let (parts, body) = request.into_parts();
        let limit = MAX_CONTROL_BODY.min(state.config().limits.max_body_bytes);
        let body = read_admitted(
            state,
            state.control_admission(),
            limit,
            &parts.headers,
            body,
        )
        .await?;
        Ok(ControlBody(body.bytes))
    }
}

/// The `Tidemark-Producer: <producer id>/<sequence>` header of an append: in a cluster, a
/// batch retried with the same pair (after a timeout or a leader change) is applied once.
pub fn producer_tag(headers: &HeaderMap) -> Result<Option<ProducerSeq>, ApiError> {
    let Some(value) = headers.get("tidemark-producer") else {
        return Ok(None);
    };
    let bad = || {
        ApiError::bad_request(
            "Tidemark-Producer must be <producer id>/<sequence>, two unsigned integers",
        )
    };
    let text = value.to_str().map_err(|_| bad())?;
    let (producer, sequence) = text.split_once('/').ok_or_else(bad)?;
    Ok(Some(ProducerSeq {
        producer: producer.trim().parse().map_err(|_| bad())?,
        sequence: sequence.trim().parse().map_err(|_| bad())?,
        part: 0,
    }))
}

/// Parses a JSON body, with the parser's message (line and column) in the 400. An object
/// that gives a key twice is refused, at any depth (see `tidemark_core::json::parse_strict`).
pub fn parse_json<T: DeserializeOwned>(bytes: &[u8]) -> Result<T, ApiError> {
    serde_json::from_value(parse_json_value(bytes)?)
        .map_err(|e| ApiError::bad_request(format!("malformed JSON: {e}")))
}

/// Parses a JSON body into a value, strictly like [`parse_json`], without a typed second
/// pass: for event bodies, where the events are most of the bytes.
pub fn parse_json_value(bytes: &[u8]) -> Result<serde_json::Value, ApiError> {
    tidemark_core::json::parse_strict(bytes)
        .map_err(|e| ApiError::bad_request(format!("malformed JSON: {e}")))
}

/// `Query` whose refusals are JSON errors like every other.
pub struct ApiQuery<T>(pub T);

impl<S: Send + Sync, T: DeserializeOwned + Send> FromRequestParts<S> for ApiQuery<T> {
    type Rejection = ApiError;

    async fn from_request_parts(parts: &mut Parts, state: &S) -> Result<Self, ApiError> {
        match Query::<T>::from_request_parts(parts, state).await {
            Ok(Query(value)) => Ok(ApiQuery(value)),
            Err(e) => Err(ApiError::bad_request(e.body_text())),
        }
    }
}

/// `Path` whose refusals are JSON errors like every other.
pub struct ApiPath<T>(pub T);

impl<S: Send + Sync, T: DeserializeOwned + Send> FromRequestParts<S> for ApiPath<T> {
    type Rejection = ApiError;

    async fn from_request_parts(parts: &mut Parts, state: &S) -> Result<Self, ApiError> {
        match Path::<T>::from_request_parts(parts, state).await {
            Ok(Path(value)) => Ok(ApiPath(value)),
            Err(e) => Err(ApiError::bad_request(e.body_text())),
        }
    }
}

/// Looks a key up in a JSON object ignoring ASCII case, as ChronicleDB clients expect.
pub fn get_ignore_case<'a>(
    object: &'a serde_json::Map<String, serde_json::Value>,
    key: &str,
) -> Option<&'a serde_json::Value> {
    object
        .iter()
        .find(|(k, _)| k.eq_ignore_ascii_case(key))
        .map(|(_, v)| v)
}
