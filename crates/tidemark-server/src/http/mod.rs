//! The HTTP API: routing, authentication, and the shared pieces of every handler (bodies read
//! under admission control, engine calls moved off the async threads, JSON errors).

mod access;
mod chronicle;
mod cluster;
pub mod connections;
pub mod front;
mod influx;
mod native;
mod prometheus;
mod sql;

use axum::extract::{FromRequest, FromRequestParts, Path, Query, Request, State};
use axum::http::request::Parts;
use axum::http::{header, HeaderMap, StatusCode};
use axum::response::{IntoResponse, Response};
use axum::routing::get;
use axum::{Json, Router};
use http_body_util::BodyExt;
use serde::de::DeserializeOwned;
use std::sync::Arc;
use tidemark_core::{Command, EventBatch, ProducerSeq, Schema};
use tidemark_engine::{Engine, EngineError};

use std::time::Duration;

use crate::admission::{Admission, Permit};
use crate::error::ApiError;
use crate::state::{AppState, Namespace};
use crate::store::{Ack, INLINE_BYTES};

/// The whole HTTP API; each route declares who may call it (`access`).
pub fn router(state: AppState) -> Router {
    Router::new()
        .nest(
            "/api/event-store",
            chronicle::store_routes(Namespace::Replicated),
        )
        .nest(
            "/api/event-store/embedded",
            chronicle::store_routes(Namespace::Local),
        )
        .merge(chronicle::sys_routes())
        .merge(native::routes())
        .merge(influx::routes())
        .merge(prometheus::routes())
        .merge(cluster::routes())
        .route("/health", get(health))
        .route("/ready", get(ready))
        .fallback(not_found)
        .method_not_allowed_fallback(method_not_allowed)
        // For the access guards of `access`, which run after routing.
        .layer(axum::Extension(state.clone()))
        .with_state(state)
}

/// Liveness: 200 and `pass` while the process answers, whatever its stores' state (that is
/// `/ready`'s to say, with a 503). The body is InfluxDB 2's health check because its clients
/// read it: influxdb-client's `health()` reports `fail` without a `name`, and its model's
/// `status` is `pass` or `fail`. Load balancers and our own tools look at the status code.
/// Why a store of this server refuses writes until restarted, if one does.
fn write_failure(state: &AppState) -> Option<String> {
    [Namespace::Replicated, Namespace::Local]
        .into_iter()
        .find_map(|namespace| state.db(namespace).write_failure())
}

async fn health(State(state): State<AppState>) -> Json<serde_json::Value> {
    let failure = write_failure(&state);
    // Still alive when read-only (a restart is the cure, not a reroute), but not silent.
    let message = match failure {
        Some(reason) => format!("alive, read-only until restarted: {reason}"),
        None => "ready for queries and writes".to_string(),
    };
    Json(serde_json::json!({
        "name": "tidemark",
        "message": message,
        "status": "pass",
        "checks": [],
        "version": env!("CARGO_PKG_VERSION"),
    }))
}

/// Ready once the stores are open, which is before the listener starts: a server that
/// answers at all is ready; a cluster node is ready once it knows a leader (503 before).
/// A store whose log failed (a full disk) refuses writes until restarted: 503 then too.
async fn ready(State(state): State<AppState>) -> Response {
    let uptime = state.uptime().as_millis() as u64;
    let failure = write_failure(&state);
    if let Some(failure) = failure {
        return (
            StatusCode::SERVICE_UNAVAILABLE,
            Json(serde_json::json!({"status": "read-only", "uptimeMs": uptime, "reason": failure})),
        )
            .into_response();
    }
    match state.cluster().map(|c| c.status()) {
        Some(status) if status.leader.is_none() => (
            StatusCode::SERVICE_UNAVAILABLE,
            Json(serde_json::json!({"status": "no leader", "uptimeMs": uptime})),
        )
            .into_response(),
        Some(status) => Json(serde_json::json!({
            "status": "ready", "uptimeMs": uptime, "leader": status.leader, "node": status.node
        }))
        .into_response(),
        None => Json(serde_json::json!({"status": "ready", "uptimeMs": uptime})).into_response(),
    }
}

async fn not_found() -> ApiError {
    ApiError::new(StatusCode::NOT_FOUND, "not_found", "no such route")
}

async fn method_not_allowed() -> ApiError {
    ApiError::new(
        StatusCode::METHOD_NOT_ALLOWED,
        "method_not_allowed",
        "this route does not take that method",
    )
}

/// A request body read in full, with the admission it holds until the request is answered.
pub struct Body {
    pub bytes: Vec<u8>,
    pub permit: Permit,
}

/// The largest body of a control request (stream creation, retention, a query, membership):
/// JSON of a few fields. Such bodies draw on their own budget
/// ([`AppState::control_admission`]), so that reads and control requests never take room
/// from appends, nor appends from them.
pub const MAX_CONTROL_BODY: usize = 1 << 20;

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
    let refuse = |error: ApiError| {
        state.count_rejection(&error);
        error
    };
    if declared.is_some_and(|n| n > limit) {
        return Err(refuse(ApiError::too_large(limit)));
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
        return Err(refuse(overloaded()));
    };
    // Capacity is address space until written, so the declared length may size it.
    let mut bytes = Vec::with_capacity(declared.unwrap_or(0));
    loop {
        let frame = match tokio::time::timeout(read_timeout, body.frame()).await {
            Err(_elapsed) => {
                return Err(refuse(ApiError::new(
                    StatusCode::REQUEST_TIMEOUT,
                    "timeout",
                    format!(
                        "the request body stopped arriving for {} ms",
                        read_timeout.as_millis()
                    ),
                )))
            }
            Ok(None) => break,
            Ok(Some(frame)) => frame
                .map_err(|e| refuse(ApiError::bad_request(format!("reading the body: {e}"))))?,
        };
        let Ok(data) = frame.into_data() else {
            continue;
        };
        let total = bytes.len() + data.len();
        if total > limit {
            return Err(refuse(ApiError::too_large(limit)));
        }
        if !permit.grow(data.len()) {
            drop((bytes, permit));
            discard(&mut body, limit, read_timeout).await;
            return Err(refuse(overloaded()));
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

/// Runs blocking engine work off the async threads.
pub async fn blocking<T: Send + 'static>(
    work: impl FnOnce() -> T + Send + 'static,
) -> Result<T, ApiError> {
    tokio::task::spawn_blocking(work)
        .await
        .map_err(|e| ApiError::internal(format!("the request's worker failed: {e}")))
}

/// Decodes `body` against the stream's schema (off the async threads) and appends it;
/// answers once the batch is durable. The body's admission is held until then.
pub async fn append_decoded(
    state: &AppState,
    namespace: Namespace,
    stream: String,
    body: Body,
    producer: Option<ProducerSeq>,
    decode: impl FnOnce(&[u8], &Arc<Schema>) -> Result<EventBatch, ApiError> + Send + 'static,
) -> Result<Ack, ApiError> {
    let store = state.store(namespace);
    let bytes = body.bytes.len();
    let outcome = async {
        let schema = store
            .stream_schema(&stream)
            .await
            .map_err(|e| state.store_error(e))?;
        // A small body decodes in microseconds: in place (see `store::INLINE_BYTES`).
        let (batch, permit) = if body.bytes.len() <= INLINE_BYTES {
            (decode(&body.bytes, &schema)?, body.permit)
        } else {
            blocking(move || Ok::<_, ApiError>((decode(&body.bytes, &schema)?, body.permit)))
                .await??
        };
        let append = Command::Append {
            name: stream,
            batch,
            producer,
        };
        let ack = submit(state, namespace, append).await;
        drop(permit);
        ack
    }
    .await;
    if let Ok(ack) = &outcome {
        state.metrics().appended(ack.events as usize, bytes);
    }
    outcome
}

/// Runs `command` on the store of `namespace`; a refusal is mapped to its HTTP answer and
/// counted.
pub async fn submit(
    state: &AppState,
    namespace: Namespace,
    command: Command<EventBatch>,
) -> Result<Ack, ApiError> {
    state
        .store(namespace)
        .submit(command)
        .await
        .map_err(|e| state.store_error(e))
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

/// Runs `work` on a store off the async threads, engine errors mapped (and counted).
pub async fn with_db<T: Send + 'static>(
    state: &AppState,
    namespace: Namespace,
    work: impl FnOnce(&Engine) -> Result<T, EngineError> + Send + 'static,
) -> Result<T, ApiError> {
    let db = state.db(namespace).clone();
    blocking(move || work(&db))
        .await?
        .map_err(|e| state.engine_error(e))
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
