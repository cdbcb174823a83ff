//! InfluxDB's write routes, so that Telegraf, the InfluxDB client libraries and anything else
//! that speaks line protocol write to Tidemark unchanged: `POST /write` (1.x) and
//! `POST /api/v2/write` (2.x), plus `/ping`, which 1.x clients call to find the server.
//!
//! A measurement is a stream (created, evolving, on its first write), tags are STRING
//! fields, fields keep their type (`ingest`). `db`, `rp`, `org` and `bucket` are accepted and
//! ignored: every write goes to the one replicated namespace, as QuestDB does with them.
//! Answers are InfluxDB's: 204 when stored; errors as 1.x's `{"error": ...}` or 2.x's
//! `{"code", "message", "line"}`, with the status and `Retry-After` clients act on (the
//! official clients retry 429 and 503 after it).

use std::collections::HashMap;
use std::io::Read as _;

use axum::extract::{Query, State};
use axum::http::{header, HeaderMap, HeaderValue, StatusCode};
use axum::response::{IntoResponse, Response};
use axum::routing::{get, post};
use axum::{Json, Router};
use serde_json::json;
use tidemark_core::ValueRef;
use tidemark_protocol::line_protocol::{self, FieldValue, LineError, Precision};

use super::access::{writes, writes_with_query_password};
use super::extract::Body;
use super::run::refusal;
use crate::admission::Permit;
use crate::error::ApiError;
use crate::ingest::{self, Events, Numbered, Refusal};
use crate::metrics::Protocol;
use crate::state::{AppState, Namespace};
use crate::store::in_place_or_blocking;
use crate::store::StoreErrorKind;

const NAMESPACE: Namespace = Namespace::Replicated;

/// The InfluxDB version `/ping` reports: the 1.x API these routes follow.
const INFLUX_VERSION: &str = "1.8.10-tidemark";

pub fn routes() -> Router<AppState> {
    Router::new()
        .route(
            "/write",
            writes_with_query_password(post(|state, query, headers, body| {
                write(Api::V1, state, query, headers, body)
            })),
        )
        .route(
            "/api/v2/write",
            writes(post(|state, query, headers, body| {
                write(Api::V2, state, query, headers, body)
            })),
        )
        .route("/ping", get(ping).head(ping))
}

/// Which API a request came in by: it decides the shape of errors and the precisions taken.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Api {
    V1,
    V2,
}

async fn ping() -> Response {
    let mut response = StatusCode::NO_CONTENT.into_response();
    response.headers_mut().insert(
        "X-Influxdb-Version",
        HeaderValue::from_static(INFLUX_VERSION),
    );
    response
}

async fn write(
    api: Api,
    State(state): State<AppState>,
    Query(query): Query<HashMap<String, String>>,
    headers: HeaderMap,
    body: Result<Body, ApiError>,
) -> Response {
    let outcome = stored(&state, api, &query, &headers, body).await;
    match outcome {
        Ok(events) => {
            state
                .metrics()
                .protocol_stored(Protocol::InfluxLine, events);
            StatusCode::NO_CONTENT.into_response()
        }
        Err(error) => {
            state.metrics().protocol_refused(Protocol::InfluxLine);
            error.into_response(api)
        }
    }
}

/// Decodes and stores the request's points; the events stored.
async fn stored(
    state: &AppState,
    api: Api,
    query: &HashMap<String, String>,
    headers: &HeaderMap,
    body: Result<Body, ApiError>,
) -> Result<u64, InfluxError> {
    let precision = match query.get("precision").map(String::as_str) {
        None | Some("") => Precision::Nanoseconds,
        Some(text) => Precision::parse(text, api == Api::V1).ok_or_else(|| {
            InfluxError::from(ApiError::bad_request(format!(
                "precision {text:?} is not one of {}",
                match api {
                    Api::V1 => "ns, n, us, u, ms, s, m, h",
                    Api::V2 => "ns, us, ms, s",
                }
            )))
        })?,
    };
    let mut body = body?;
    let bytes_received = body.bytes.len();
    let limit = state.config().limits.max_body_bytes;
    let text = decoded_body(headers, std::mem::take(&mut body.bytes), limit)?;
    // An inflated body holds more memory than was admitted as it arrived: the rest is
    // admitted now, or the request waits its turn like any other over the budget.
    if !body.permit.grow(text.len().saturating_sub(bytes_received)) {
        return Err(ApiError::overloaded(
            "the server has too many request bytes in flight; retry later",
            state.retry_after_ms(),
        )
        .into());
    }
    let now = tidemark_query::time::now_ns();
    // The events' columns are admitted on the request's permit as they are built.
    let permit = body.permit;
    let events = in_place_or_blocking(text.len(), move || events(&text, precision, now, permit))
        .await
        .map_err(|e| refusal(state, e))?;
    let events = events.map_err(|refused| match refused {
        Unreadable::Line(e) => InfluxError {
            line: Some(e.line),
            api: ApiError::bad_request(e.to_string()),
        },
        Unreadable::Refused(refused) => InfluxError {
            line: refused.line,
            api: refusal(state, refused.error),
        },
    })?;
    let written = ingest::write_events(
        state.store(NAMESPACE),
        state.metrics(),
        events,
        bytes_received,
    )
    .await
    .map_err(|refused: Refusal| InfluxError {
        line: refused.line,
        api: refusal(state, refused.error),
    })?;
    Ok(written.events)
}

/// Why a body's lines are not events.
enum Unreadable {
    /// Not line protocol.
    Line(LineError),
    /// Line protocol, but not what the streams can take (a field's type, a name...).
    Refused(Refusal),
}

impl From<LineError> for Unreadable {
    fn from(error: LineError) -> Unreadable {
        Unreadable::Line(error)
    }
}

/// The body's lines as events, each line's tags first, then its fields; the tags are
/// STRING fields.
fn events(
    text: &str,
    precision: Precision,
    now: i64,
    permit: Permit,
) -> Result<Events, Unreadable> {
    let mut events = Events::new(Numbered::Line, permit, ingest::MAX_FIELDS);
    line_protocol::each_line(text, precision, now, |line| {
        let tags = line
            .tags
            .iter()
            .map(|(key, value)| (key.as_ref(), ValueRef::String(value)));
        let fields = line.fields.iter().map(|(key, value)| {
            let value = match value {
                FieldValue::Double(v) => ValueRef::Double(*v),
                FieldValue::Long(v) => ValueRef::Long(*v),
                FieldValue::String(v) => ValueRef::String(v),
                FieldValue::Boolean(v) => ValueRef::Boolean(*v),
            };
            (key.as_ref(), value)
        });
        events
            .push(
                line.number,
                &line.measurement,
                line.tstart,
                tags.chain(fields),
            )
            .map_err(Unreadable::Refused)
    })?;
    Ok(events)
}

/// The body as text: gunzipped when sent with `Content-Encoding: gzip`, never to more than
/// `limit` bytes (a small compressed body may inflate to gigabytes).
fn decoded_body(headers: &HeaderMap, bytes: Vec<u8>, limit: usize) -> Result<String, ApiError> {
    let encoding = headers
        .get(header::CONTENT_ENCODING)
        .and_then(|v| v.to_str().ok())
        .map(|v| v.trim().to_ascii_lowercase());
    let bytes = match encoding.as_deref() {
        None | Some("") | Some("identity") => bytes,
        Some("gzip") => {
            let mut inflated = Vec::with_capacity(bytes.len().saturating_mul(4).min(limit));
            flate2::read::MultiGzDecoder::new(bytes.as_slice())
                .take(limit as u64 + 1)
                .read_to_end(&mut inflated)
                .map_err(|e| {
                    ApiError::bad_request(format!("the gzip body does not inflate: {e}"))
                })?;
            if inflated.len() > limit {
                return Err(ApiError::too_large_because(format!(
                    "the body inflates to more than the limit of {limit} bytes"
                )));
            }
            inflated
        }
        Some(other) => {
            return Err(ApiError::new(
                StoreErrorKind::Invalid,
                "unsupported_encoding",
                format!("Content-Encoding {other:?}: only gzip is taken"),
            )
            .with_status(StatusCode::UNSUPPORTED_MEDIA_TYPE))
        }
    };
    String::from_utf8(bytes).map_err(|e| {
        ApiError::bad_request(format!(
            "the body is not UTF-8 (byte {})",
            e.utf8_error().valid_up_to()
        ))
    })
}

/// A refusal, answered in InfluxDB's terms.
struct InfluxError {
    api: ApiError,
    line: Option<usize>,
}

impl From<ApiError> for InfluxError {
    fn from(api: ApiError) -> InfluxError {
        InfluxError { api, line: None }
    }
}

impl InfluxError {
    fn into_response(self, api: Api) -> Response {
        let status = self.api.status;
        let body = match api {
            Api::V1 => json!({"error": self.api.message}),
            Api::V2 => {
                let mut body = json!({"code": v2_code(status), "message": self.api.message});
                if let Some(line) = self.line {
                    body["line"] = line.into();
                }
                body
            }
        };
        let mut response = (status, Json(body)).into_response();
        self.api.mark(&mut response);
        if let Some(ms) = self.api.retry_after_ms {
            let seconds = ms.div_ceil(1000).max(1);
            response
                .headers_mut()
                .insert(header::RETRY_AFTER, HeaderValue::from(seconds));
        }
        response
    }
}

/// InfluxDB 2.x's error code for a status.
fn v2_code(status: StatusCode) -> &'static str {
    match status.as_u16() {
        400 | 415 => "invalid",
        401 | 403 => "unauthorized",
        404 => "not found",
        408 => "request timeout",
        413 => "request too large",
        422 => "unprocessable entity",
        429 => "too many requests",
        503 => "unavailable",
        _ => "internal error",
    }
}
