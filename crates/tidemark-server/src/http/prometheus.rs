//! Prometheus remote write and remote read, so that Prometheus (and the agents that speak
//! remote write: Grafana Agent, vmagent, OpenTelemetry's exporter) keep their samples in
//! Tidemark and read them back as long-term storage: `POST /api/v1/write`,
//! `POST /api/v1/read`.
//!
//! A metric name is a stream (created evolving on its first sample), its labels STRING
//! fields, the sample a `value` DOUBLE field, its milliseconds nanoseconds. Rows go through
//! `ingest` like every protocol's. A stale marker is the NaN it is on the wire (its bits
//! are stored and read back as they came). Reads: [`crate::remote_read`].
//!
//! Back-pressure is answered 503 with `Retry-After`, not 429: Prometheus retries 5xx with
//! backoff but drops a batch answered 429 unless `retry_on_http_429` is set (experimental).

use axum::extract::State;
use axum::http::{header, HeaderMap, HeaderValue, StatusCode};
use axum::response::{IntoResponse, Response};
use axum::routing::post;
use axum::Router;
use tidemark_core::Value;
use tidemark_protocol::prometheus::{
    self, QueryResult, ReadResponse, WriteRequest, RESPONSE_SAMPLES,
};

use super::access::{reads, writes};
use super::extract::{Body, ControlBody};
use super::run::refusal;
use crate::admission::Permit;
use crate::error::ApiError;
use crate::ingest::{self, Numbered, Refusal, Row, ROW_VALUE_BYTES};
use crate::metrics::Protocol;
use crate::remote_read::{self, Budget, ReadError, NAME_LABEL, VALUE_FIELD};
use crate::state::{AppState, Namespace, MAX_CONTROL_BODY};
use crate::store::in_place_or_blocking;
use crate::store::StoreErrorKind;

const NAMESPACE: Namespace = Namespace::Replicated;

const NANOS_PER_MILLI: i64 = 1_000_000;

pub fn routes() -> Router<AppState> {
    Router::new()
        .route("/api/v1/write", writes(post(write)))
        .route("/api/v1/read", reads(post(read)))
}

async fn write(
    State(state): State<AppState>,
    headers: HeaderMap,
    body: Result<Body, ApiError>,
) -> Response {
    match stored(&state, &headers, body).await {
        Ok(events) => {
            state
                .metrics()
                .protocol_stored(Protocol::PrometheusWrite, events);
            StatusCode::NO_CONTENT.into_response()
        }
        Err(error) => {
            state.metrics().protocol_refused(Protocol::PrometheusWrite);
            answer_error(error)
        }
    }
}

/// Decodes and stores a remote-write request; the events stored.
async fn stored(
    state: &AppState,
    headers: &HeaderMap,
    body: Result<Body, ApiError>,
) -> Result<u64, ApiError> {
    snappy_encoded(headers)?;
    let body = body?;
    let bytes_received = body.bytes.len();
    let (request, mut permit) = decode_admitted(state, body).await?;
    // Each sample becomes a row holding its series' labels: a series of many labels and
    // many samples takes far more as rows than on the wire. Bounded like a body, and
    // admitted before the rows are made.
    let limit = state.config().limits.max_body_bytes;
    let held = row_bytes(&request);
    if held > limit {
        return Err(ApiError::too_large_because(format!(
            "the samples take {held} bytes as rows (labels repeated for each sample), more \
             than the limit of {limit}: send fewer samples per request"
        )));
    }
    if !permit.grow(held) {
        return Err(overloaded(state));
    }
    let rows = rows(request)?;
    let written = ingest::write(
        state.store(NAMESPACE),
        state.metrics(),
        rows,
        Numbered::TimeSeries,
        permit,
        ingest::MAX_FIELDS,
        bytes_received,
    )
    .await
    .map_err(|refused: Refusal| refusal(state, refused.error))?;
    Ok(written.events)
}

/// The request a snappy body holds, inflated and decoded, each step's memory admitted on the
/// body's permit before it is taken (the compressed bytes are given back).
async fn decode_admitted(
    state: &AppState,
    mut body: Body,
) -> Result<(WriteRequest, Permit), ApiError> {
    let limit = state.config().limits.max_body_bytes;
    let compressed = std::mem::take(&mut body.bytes);
    let inflated =
        prometheus::inflated_len(&compressed).map_err(|e| ApiError::bad_request(e.to_string()))?;
    if inflated > limit {
        return Err(ApiError::too_large_because(format!(
            "the body inflates to {inflated} bytes, more than the limit of {limit}"
        )));
    }
    // The inflated request is held besides the compressed one: admitted too (see influx).
    if !body.permit.grow(inflated) {
        return Err(overloaded(state));
    }
    // Small messages take many times their wire bytes decoded (an empty series: 2 bytes
    // and a 96-byte struct): what the request will hold decoded is admitted before it is.
    let inflate = move || {
        let bytes = prometheus::inflate(&compressed, limit)?;
        let decoded = prometheus::write_request_bytes(&bytes)?;
        Ok::<_, prometheus::PrometheusError>((bytes, decoded))
    };
    let (bytes, decoded) = in_place_or_blocking(inflated, inflate)
        .await
        .map_err(|e| refusal(state, e))?
        .map_err(|e| ApiError::bad_request(e.to_string()))?;
    if decoded > limit {
        return Err(ApiError::too_large_because(format!(
            "the request takes {decoded} bytes decoded (its {inflated} bytes hold many \
             small messages), more than the limit of {limit}"
        )));
    }
    if !body.permit.grow(decoded) {
        return Err(overloaded(state));
    }
    let decode = move || prometheus::decode_write_inflated(&bytes);
    let request = in_place_or_blocking(inflated, decode)
        .await
        .map_err(|e| refusal(state, e))?
        .map_err(|e| ApiError::bad_request(e.to_string()))?;
    Ok((request, body.permit))
}

fn overloaded(state: &AppState) -> ApiError {
    ApiError::overloaded(
        "the server has too many request bytes in flight; retry later",
        state.retry_after_ms(),
    )
}

/// Remote write bodies are snappy blocks; a body that says it is anything else is refused
/// rather than misread (415).
fn snappy_encoded(headers: &HeaderMap) -> Result<(), ApiError> {
    let encoding = headers
        .get(header::CONTENT_ENCODING)
        .and_then(|v| v.to_str().ok())
        .map(|v| v.trim().to_ascii_lowercase());
    match encoding.as_deref() {
        None | Some("") | Some("snappy") => Ok(()),
        Some(other) => Err(ApiError::new(
            StoreErrorKind::Invalid,
            "unsupported_encoding",
            format!("Content-Encoding {other:?}: remote write bodies are snappy blocks"),
        )
        .with_status(StatusCode::UNSUPPORTED_MEDIA_TYPE)),
    }
}

/// The memory the rows of `request` take, about: every sample repeats its series' labels.
fn row_bytes(request: &WriteRequest) -> usize {
    request.timeseries.iter().fold(0usize, |total, series| {
        let labels = series.labels.iter().fold(ROW_VALUE_BYTES, |sum, label| {
            sum.saturating_add(label.name.len() + label.value.len() + ROW_VALUE_BYTES)
        });
        total.saturating_add(labels.saturating_mul(series.samples.len()))
    })
}

/// One row per sample: the series' labels (those with a value), then `value`. A row's
/// "line" is its series' number in the request, from 1.
fn rows(request: WriteRequest) -> Result<Vec<Row>, ApiError> {
    let samples: usize = request.timeseries.iter().map(|s| s.samples.len()).sum();
    let mut rows = Vec::with_capacity(samples);
    for (index, series) in request.timeseries.into_iter().enumerate() {
        let number = index + 1;
        let refuse = |what: &str| ApiError::bad_request(format!("time series {number}: {what}"));
        if !series.exemplars.is_empty() {
            return Err(refuse(
                "exemplars are not stored; turn send_exemplars off for this remote_write",
            ));
        }
        if !series.histograms.is_empty() {
            return Err(refuse(
                "native histograms are not stored; turn send_native_histograms off for this \
                 remote_write",
            ));
        }
        let mut name = None;
        let mut labels = Vec::with_capacity(series.labels.len() + 1);
        for label in series.labels {
            if label.name == NAME_LABEL {
                name = Some(label.value);
            } else if label.name.eq_ignore_ascii_case(VALUE_FIELD) {
                return Err(refuse(&format!(
                    "label {:?} cannot be stored: {VALUE_FIELD:?} is the field that holds \
                     each sample (relabel it, e.g. with metric_relabel_configs)",
                    label.name
                )));
            } else if !label.value.is_empty() {
                // An empty label is no label (Prometheus's rule).
                labels.push((label.name, Value::String(label.value)));
            }
        }
        let name = name
            .filter(|n| !n.is_empty())
            .ok_or_else(|| refuse("it has no metric name (no __name__ label)"))?;
        let mut samples = series.samples.into_iter().peekable();
        while let Some(sample) = samples.next() {
            let tstart = sample
                .timestamp
                .checked_mul(NANOS_PER_MILLI)
                .ok_or_else(|| {
                    refuse(&format!(
                        "timestamp {} ms is beyond what 64-bit nanoseconds hold",
                        sample.timestamp
                    ))
                })?;
            // The last sample takes the labels; the others copy them.
            let mut values = if samples.peek().is_some() {
                let mut copy = Vec::with_capacity(labels.len() + 1);
                copy.extend(labels.iter().cloned());
                copy
            } else {
                std::mem::take(&mut labels)
            };
            values.push((VALUE_FIELD.to_string(), Value::Double(sample.value)));
            rows.push(Row {
                line: number,
                stream: name.clone(),
                tstart,
                values,
            });
        }
    }
    Ok(rows)
}

/// An error as Prometheus acts on it: 4xx drops the batch, 5xx is retried, so a refusal
/// for being over the budget (429 elsewhere) is a 503 with the same `Retry-After`.
fn answer_error(mut error: ApiError) -> Response {
    if error.status == StatusCode::TOO_MANY_REQUESTS {
        error.status = StatusCode::SERVICE_UNAVAILABLE;
    }
    error.into_response()
}

async fn read(
    State(state): State<AppState>,
    headers: HeaderMap,
    body: Result<ControlBody, ApiError>,
) -> Response {
    match answered(&state, &headers, body).await {
        Ok(body) => {
            state.metrics().protocol_answered(Protocol::PrometheusRead);
            let mut response = (StatusCode::OK, body).into_response();
            let headers = response.headers_mut();
            headers.insert(
                header::CONTENT_TYPE,
                HeaderValue::from_static("application/x-protobuf"),
            );
            headers.insert(header::CONTENT_ENCODING, HeaderValue::from_static("snappy"));
            response
        }
        Err(error) => {
            state.metrics().protocol_refused(Protocol::PrometheusRead);
            error.into_response()
        }
    }
}

/// The snappy-compressed `ReadResponse` to a remote-read request.
async fn answered(
    state: &AppState,
    headers: &HeaderMap,
    body: Result<ControlBody, ApiError>,
) -> Result<Vec<u8>, ApiError> {
    snappy_encoded(headers)?;
    let ControlBody(bytes) = body?;
    let request = prometheus::decode_read(&bytes, MAX_CONTROL_BODY)
        .map_err(|e| ApiError::bad_request(e.to_string()))?;
    if !request.accepted_response_types.is_empty()
        && !request.accepted_response_types.contains(&RESPONSE_SAMPLES)
    {
        return Err(ApiError::bad_request(
            "only the SAMPLES response type is served (accepted_response_types lacks it)",
        ));
    }
    let matchers: usize = request.queries.iter().map(|q| q.matchers.len()).sum();
    if matchers > remote_read::MAX_MATCHERS {
        return Err(ApiError::bad_request(format!(
            "the request carries {matchers} label matchers, more than {}",
            remote_read::MAX_MATCHERS
        )));
    }
    let db = state.db(NAMESPACE);
    let limits = &state.config().limits;
    let mut budget = Budget::new(limits.max_result_bytes, limits.query_timeout());
    let retry_after_ms = state.retry_after_ms();
    super::run::blocking(move || {
        let mut response = ReadResponse {
            results: Vec::with_capacity(request.queries.len()),
        };
        for query in &request.queries {
            let timeseries = remote_read::select(&db, query, &mut budget)?;
            response.results.push(QueryResult { timeseries });
        }
        Ok(prometheus::encode(&response))
    })
    .await?
    .map_err(|e: ReadError| {
        match e {
            ReadError::Engine(e) => ApiError::from_engine(e, retry_after_ms),
            // As SQL answers a result over the same limit.
            ReadError::TooLarge { .. } => {
                ApiError::new(StoreErrorKind::Invalid, "too_large", e.to_string())
            }
            ReadError::Timeout { .. } => {
                ApiError::new(StoreErrorKind::Invalid, "query_timeout", e.to_string())
            }
            ReadError::Matcher { .. } => ApiError::bad_request(e.to_string()),
        }
    })
}
