//! The native API under `/v1` (the one the docs teach), `/metrics` and the OpenAPI document.

use axum::extract::{RawQuery, State};
use axum::http::{header, HeaderMap, StatusCode};
use axum::response::IntoResponse;
use axum::routing::{delete, get, post, put};
use axum::{Json, Router};
use serde::Deserialize;
use serde_json::{json, Value as Json_};
use tidemark_core::{Command, EventBatch, Partition, Schema};
use tidemark_engine::{ConsumerInfo, Retention, StreamInfo};
use tidemark_query::{write_events, EventFormat, EventQuery, EventsError, Times};

use super::access::{reads, writes};
use super::extract::{parse_json_value, producer_tag, ApiPath, Body, JsonBody};
use super::run::{append_decoded, blocking, submit, with_db};
use crate::error::ApiError;
use crate::metrics::{Gauges, SqlGauges};
use crate::state::{AppState, Namespace};
use crate::store::StoreErrorKind;

/// The OpenAPI document of every route, checked against the router by the tests.
pub const OPENAPI: &str = include_str!("openapi.json");

pub fn routes() -> Router<AppState> {
    Router::new()
        .route(
            "/v1/streams",
            reads(get(list_streams)).merge(writes(post(create_stream))),
        )
        .route(
            "/v1/streams/{stream}",
            reads(get(stream_info)).merge(writes(delete(drop_stream))),
        )
        .route(
            "/v1/streams/{stream}/events",
            reads(get(scan)).merge(writes(post(append))),
        )
        .route("/v1/streams/{stream}/consumers", reads(get(list_consumers)))
        .route(
            "/v1/streams/{stream}/consumers/{consumer}",
            reads(get(consumer_info))
                .merge(writes(post(commit_position)))
                .merge(writes(delete(forget_consumer))),
        )
        .route("/v1/streams/{stream}/clear", writes(post(clear)))
        .route("/v1/streams/{stream}/retention", writes(put(set_retention)))
        .route(
            "/v1/streams/{stream}/out-of-order-window",
            writes(put(set_out_of_order_window)),
        )
        // A query only reads, whatever its method.
        .route("/v1/query", reads(post(super::sql::query)))
        .route("/v1/tier", reads(get(tier_status)))
        .route("/v1/openapi.json", reads(get(openapi)))
        .route("/metrics", reads(get(metrics)))
}

/// The native API addresses the replicated store; the ChronicleDB routes reach both.
const NAMESPACE: Namespace = Namespace::Replicated;

fn info_json(info: &StreamInfo) -> Json_ {
    json!({
        "name": info.name,
        "schema": info.schema.fields().iter().map(|f| json!({"name": f.name, "type": f.ty.name()})).collect::<Vec<_>>(),
        "evolving": info.evolving,
        "eventCount": info.event_count,
        "timeRange": info.time_range.map(|(first, last)| json!({"first": first, "last": last})),
        "bytesOnDisk": info.bytes_on_disk,
        "tieredBytes": info.tiered_bytes,
        "flushedEvents": info.flushed_events,
        "segments": info.segments,
        "retention": {"maxAgeNs": info.retention.max_age_ns, "maxBytes": info.retention.max_bytes},
        "outOfOrderWindow": {
            "ns": info.out_of_order_window_ns.filter(|&w| w != i64::MAX),
            "text": tidemark_query::time::format_window(info.out_of_order_window_ns),
            "isDefault": !info.own_out_of_order_window,
        },
        "partition": {"ns": info.partition.ns(), "text": info.partition.to_string()},
        "nextPosition": info.next_position,
        "consumers": info.consumers.iter().map(consumer_json).collect::<Vec<_>>(),
    })
}

async fn list_streams(State(state): State<AppState>) -> Result<Json<Json_>, ApiError> {
    let db = state.db(NAMESPACE).clone();
    let infos = blocking(move || {
        db.list_streams()
            .iter()
            .filter_map(|name| db.stream_info(name).ok())
            .map(|info| info_json(&info))
            .collect::<Vec<_>>()
    })
    .await?;
    Ok(Json(Json_::Array(infos)))
}

/// `{"name": "ticks", "schema": "SYMBOL:STRING,PRICE:DOUBLE"}`; the schema may also be a
/// list of `{"name", "type"}` objects. `"evolving": true` lets writes add fields;
/// `"partition": "1h"` sets the stream's time partitions (default a day).
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct CreateStream {
    name: String,
    schema: SchemaSpec,
    #[serde(default)]
    evolving: bool,
    /// Text such as `"6h"`; any JSON here, so that a number is refused naming the field
    /// (serde's message for a field of the wrong type does not).
    partition: Option<serde_json::Value>,
}

#[derive(Debug, Deserialize)]
#[serde(untagged)]
enum SchemaSpec {
    Spec(String),
    Fields(Vec<tidemark_core::Field>),
}

async fn create_stream(
    State(state): State<AppState>,
    JsonBody(request): JsonBody<CreateStream>,
) -> Result<impl IntoResponse, ApiError> {
    let schema = match request.schema {
        SchemaSpec::Spec(spec) => Schema::parse_spec(&spec)?,
        SchemaSpec::Fields(fields) => Schema::new(fields)?,
    };
    let partition = match &request.partition {
        None | Some(serde_json::Value::Null) => Partition::DAY,
        Some(serde_json::Value::String(text)) => tidemark_query::time::parse_partition(text)?,
        Some(other) => {
            return Err(ApiError::bad_request(format!(
                "\"partition\" is a duration's text such as \"6h\" or \"1d\", not {other}"
            )))
        }
    };
    let name = request.name;
    let existed = state.db(NAMESPACE).list_streams().contains(&name);
    let created = Command::CreateStream {
        name: name.clone(),
        schema,
        evolving: request.evolving,
        partition,
    };
    submit(&state, NAMESPACE, created).await?;
    let info = with_db(&state, NAMESPACE, move |db| db.stream_info(&name)).await?;
    let status = if existed {
        StatusCode::OK
    } else {
        StatusCode::CREATED
    };
    Ok((status, Json(info_json(&info))))
}

async fn stream_info(
    State(state): State<AppState>,
    ApiPath(stream): ApiPath<String>,
) -> Result<Json<Json_>, ApiError> {
    let info = with_db(&state, NAMESPACE, move |db| db.stream_info(&stream)).await?;
    Ok(Json(info_json(&info)))
}

async fn drop_stream(
    State(state): State<AppState>,
    ApiPath(stream): ApiPath<String>,
) -> Result<Json<Json_>, ApiError> {
    let dropped = Command::DropStream {
        name: stream.clone(),
    };
    submit(&state, NAMESPACE, dropped).await?;
    Ok(Json(json!({"dropped": stream})))
}

async fn clear(
    State(state): State<AppState>,
    ApiPath(stream): ApiPath<String>,
) -> Result<Json<Json_>, ApiError> {
    let cleared = Command::Clear {
        name: stream.clone(),
    };
    submit(&state, NAMESPACE, cleared).await?;
    Ok(Json(json!({"cleared": stream})))
}

/// `{"maxAge": "7d", "maxBytes": 1000000000}`; a missing key removes that limit.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
struct SetRetention {
    max_age: Option<String>,
    max_bytes: Option<u64>,
}

async fn set_retention(
    State(state): State<AppState>,
    ApiPath(stream): ApiPath<String>,
    JsonBody(request): JsonBody<SetRetention>,
) -> Result<Json<Json_>, ApiError> {
    let max_age_ns = request
        .max_age
        .as_deref()
        .map(tidemark_query::time::parse_duration)
        .transpose()
        .map_err(|e| ApiError::bad_request(e.to_string()))?;
    let retention = Retention {
        max_age_ns,
        max_bytes: request.max_bytes,
    };
    let name = stream.clone();
    submit(&state, NAMESPACE, Command::SetRetention { name, retention }).await?;
    let info = with_db(&state, NAMESPACE, move |db| db.stream_info(&stream)).await?;
    Ok(Json(info_json(&info)))
}

/// `{"window": "30d"}`, `"unlimited"` or `"default"` (the server's window).
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct SetOutOfOrderWindow {
    window: String,
}

async fn set_out_of_order_window(
    State(state): State<AppState>,
    ApiPath(stream): ApiPath<String>,
    JsonBody(request): JsonBody<SetOutOfOrderWindow>,
) -> Result<Json<Json_>, ApiError> {
    let window_ns = tidemark_query::time::parse_window(&request.window)
        .map_err(|e| ApiError::bad_request(e.to_string()))?;
    let name = stream.clone();
    submit(
        &state,
        NAMESPACE,
        Command::SetOutOfOrderWindow { name, window_ns },
    )
    .await?;
    let info = with_db(&state, NAMESPACE, move |db| db.stream_info(&stream)).await?;
    Ok(Json(info_json(&info)))
}

/// Events as a JSON array (`[{...}, ...]`) or as NDJSON (one object per line), the body's
/// first non-blank byte decides; or as an Arrow IPC stream, said by its content type
/// (`application/vnd.apache.arrow.stream`: [`tidemark_protocol::arrow`]). All or nothing;
/// answers once durable.
async fn append(
    State(state): State<AppState>,
    ApiPath(stream): ApiPath<String>,
    headers: HeaderMap,
    body: Body,
) -> Result<Json<Json_>, ApiError> {
    let producer = producer_tag(&headers)?;
    let arrow = headers
        .get(header::CONTENT_TYPE)
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.get(..tidemark_protocol::arrow::MEDIA_TYPE.len()))
        // Media types are case-insensitive (RFC 9110 8.3.1).
        .is_some_and(|v| v.eq_ignore_ascii_case(tidemark_protocol::arrow::MEDIA_TYPE));
    let ack = if arrow {
        append_decoded(&state, NAMESPACE, stream, body, producer, decode_arrow).await?
    } else {
        append_decoded(&state, NAMESPACE, stream, body, producer, decode_events).await?
    };
    let mut answer = json!({"events": ack.events, "lsn": ack.lsn});
    // Only where it is known: a single server's answer has no `duplicate` (docs/server.md).
    if let Some(duplicate) = ack.duplicate {
        answer["duplicate"] = duplicate.into();
    }
    if let Some(positions) = ack.positions {
        answer["firstPosition"] = positions.first.into();
        answer["lastPosition"] = positions.last.into();
    }
    Ok(Json(answer))
}

fn decode_arrow(bytes: &[u8], schema: &std::sync::Arc<Schema>) -> Result<EventBatch, ApiError> {
    tidemark_protocol::arrow::decode_events(bytes, schema)
        .map_err(|e| ApiError::bad_request(e.to_string()))
}

fn decode_events(bytes: &[u8], schema: &std::sync::Arc<Schema>) -> Result<EventBatch, ApiError> {
    let first = bytes.iter().find(|b| !b.is_ascii_whitespace());
    if first == Some(&b'[') {
        let Json_::Array(events) = parse_json_value(bytes)? else {
            return Err(ApiError::bad_request("expected a JSON array of events"));
        };
        return Ok(tidemark_core::json::decode_events(schema, &events)?);
    }
    let mut builder = tidemark_core::BatchBuilder::new(schema.clone(), 0);
    let mut row = 0;
    for (number, line) in bytes.split(|&b| b == b'\n').enumerate() {
        if line.iter().all(u8::is_ascii_whitespace) {
            continue;
        }
        let event = tidemark_core::json::parse_strict(line).map_err(|e| {
            ApiError::bad_request(format!("malformed JSON on line {}: {e}", number + 1))
        })?;
        tidemark_core::json::decode_event_into(&mut builder, &event, row)?;
        row += 1;
    }
    Ok(builder.finish())
}

/// `GET /v1/streams/{s}/events?from=&to=&last=&fields=&where=&limit=&time=&consistency=`:
/// the events of a time range in time order, exactly as `tidemark scan` prints them —
/// NDJSON, or CSV with `Accept: text/csv`. `where` may repeat (all must hold). The answer is
/// built whole, up to `limits.max_result_bytes`. With `after`, `follow` or `wait` (or
/// `Accept: text/event-stream`), a read by position instead ([`super::follow`]).
async fn scan(
    State(state): State<AppState>,
    ApiPath(stream): ApiPath<String>,
    RawQuery(raw): RawQuery,
    headers: HeaderMap,
) -> Result<axum::response::Response, ApiError> {
    if super::follow::is_position_read(raw.as_deref(), &headers) {
        return super::follow::read(state, NAMESPACE, stream, raw, headers).await;
    }
    let ScanParams {
        query,
        times,
        consistency,
    } = ScanParams::parse(raw.as_deref())?;
    super::cluster::read_barrier(&state, consistency.as_deref()).await?;
    let csv = headers
        .get(header::ACCEPT)
        .and_then(|v| v.to_str().ok())
        .is_some_and(|accept| accept.contains("text/csv"));
    let format = if csv {
        EventFormat::Csv
    } else {
        EventFormat::Jsonl
    };
    let max_bytes = state.config().limits.max_result_bytes;
    let db = state.db(NAMESPACE);
    let retry_after_ms = state.retry_after_ms();
    let out = blocking(move || {
        let schema = db.stream_schema(&stream)?;
        let request = query
            .request(&schema, tidemark_query::time::now_ns())
            .map_err(EventsError::Query)?;
        let output = query.output_schema(&schema)?;
        let mut out = Capped::new(max_bytes);
        write_events(
            db.scan(&stream, &request)?,
            &output,
            query.limit,
            format,
            times,
            &mut out,
        )?;
        Ok::<_, EventsError>(out.bytes)
    })
    .await?
    .map_err(|e| match e {
        EventsError::Engine(e) => ApiError::from_engine(e, retry_after_ms),
        EventsError::Query(e) => ApiError::bad_request(e.to_string()),
        EventsError::Io(e) => ApiError::new(StoreErrorKind::Invalid, "too_large", e.to_string()),
    })?;
    let content_type = if csv {
        "text/csv"
    } else {
        "application/x-ndjson"
    };
    Ok(([(header::CONTENT_TYPE, content_type)], out).into_response())
}

fn consumer_json(consumer: &ConsumerInfo) -> Json_ {
    json!({"name": consumer.name, "position": consumer.position, "behind": consumer.behind})
}

/// `GET /v1/streams/{s}/consumers`: each named consumer, its position and how many
/// positions the stream gave after it.
async fn list_consumers(
    State(state): State<AppState>,
    ApiPath(stream): ApiPath<String>,
) -> Result<Json<Json_>, ApiError> {
    let consumers = with_db(&state, NAMESPACE, move |db| db.consumers(&stream)).await?;
    Ok(Json(consumers.iter().map(consumer_json).collect()))
}

async fn consumer_info(
    State(state): State<AppState>,
    ApiPath((stream, consumer)): ApiPath<(String, String)>,
) -> Result<Json<Json_>, ApiError> {
    let name = consumer.clone();
    let consumers = with_db(&state, NAMESPACE, move |db| db.consumers(&stream)).await?;
    match consumers.iter().find(|c| c.name == name) {
        Some(found) => Ok(Json(consumer_json(found))),
        None => Err(ApiError::new(
            StoreErrorKind::NotFound,
            "unknown_consumer",
            format!("no consumer {name:?} has committed a position in this stream"),
        )),
    }
}

/// `{"position": N}`: the position the consumer has read to (it resumes after it).
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct Commit {
    position: u64,
}

/// `POST /v1/streams/{s}/consumers/{c}`: keeps the consumer's position; answers once
/// durable (on a cluster: committed).
async fn commit_position(
    State(state): State<AppState>,
    ApiPath((stream, consumer)): ApiPath<(String, String)>,
    JsonBody(commit): JsonBody<Commit>,
) -> Result<Json<Json_>, ApiError> {
    let command = Command::CommitPosition {
        name: stream,
        consumer: consumer.clone(),
        position: Some(commit.position),
    };
    submit(&state, NAMESPACE, command).await?;
    Ok(Json(json!({"name": consumer, "position": commit.position})))
}

/// `DELETE /v1/streams/{s}/consumers/{c}`: forgets the consumer (204 whether it was known
/// or not).
async fn forget_consumer(
    State(state): State<AppState>,
    ApiPath((stream, consumer)): ApiPath<(String, String)>,
) -> Result<StatusCode, ApiError> {
    let command = Command::CommitPosition {
        name: stream,
        consumer,
        position: None,
    };
    submit(&state, NAMESPACE, command).await?;
    Ok(StatusCode::NO_CONTENT)
}

/// The query string of a scan.
struct ScanParams {
    query: EventQuery,
    times: Times,
    consistency: Option<String>,
}

impl ScanParams {
    fn parse(raw: Option<&str>) -> Result<ScanParams, ApiError> {
        let mut query = EventQuery::default();
        let mut times = Times::Nanoseconds;
        let mut consistency = None;
        for (key, value) in form_urlencoded::parse(raw.unwrap_or_default().as_bytes()) {
            let value = value.into_owned();
            match key.as_ref() {
                "from" => query.from = Some(value),
                "to" => query.to = Some(value),
                "last" => query.last = Some(value),
                "fields" => query.fields = Some(value.split(',').map(str::to_string).collect()),
                "where" => query.filters.push(value),
                "limit" => {
                    query.limit = Some(value.parse().map_err(|_| {
                        ApiError::bad_request(format!("limit {value:?} is not a count of events"))
                    })?)
                }
                "time" => {
                    times = match value.as_str() {
                        "ns" => Times::Nanoseconds,
                        "rfc3339" => Times::Rfc3339,
                        other => {
                            return Err(ApiError::bad_request(format!(
                                "time must be \"ns\" or \"rfc3339\", not {other:?}"
                            )))
                        }
                    }
                }
                "consistency" => consistency = Some(value),
                other => {
                    return Err(ApiError::bad_request(format!(
                        "unknown parameter {other:?} (from, to, last, fields, where, limit, time, consistency)"
                    )))
                }
            }
        }
        Ok(ScanParams {
            query,
            times,
            consistency,
        })
    }
}

/// An answer under construction that refuses to grow past its cap.
struct Capped {
    bytes: Vec<u8>,
    max: usize,
}

impl Capped {
    fn new(max: usize) -> Capped {
        Capped {
            bytes: Vec::new(),
            max,
        }
    }
}

impl std::io::Write for Capped {
    fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
        if self.bytes.len() + buf.len() > self.max {
            return Err(std::io::Error::other(format!(
                "the answer is larger than limits.max_result_bytes ({} bytes): narrow the \
                 time range, select fewer fields or pass a limit",
                self.max
            )));
        }
        self.bytes.extend_from_slice(buf);
        Ok(buf.len())
    }

    fn flush(&mut self) -> std::io::Result<()> {
        Ok(())
    }
}

/// What tiering has done and holds (`docs/tiering.md`); 404 when the server does not tier.
async fn tier_status(State(state): State<AppState>) -> Result<Json<Json_>, ApiError> {
    let db = state.db(NAMESPACE);
    let status = blocking(move || db.tier_status()).await?;
    let Some(s) = status else {
        return Err(ApiError::not_found(
            "tiering_off",
            "this server does not tier: its configuration has no [tier] section",
        ));
    };
    Ok(Json(json!({
        "url": s.url,
        "afterSeconds": s.after.as_secs(),
        "tieredSegments": s.tiered_segments,
        "tieredBytes": s.tiered_bytes,
        "pendingSegments": s.pending_segments,
        "pendingBytes": s.pending_bytes,
        "rounds": s.rounds,
        "uploadedSegments": s.uploaded_segments,
        "uploadedBytes": s.uploaded_bytes,
        "uploadSeconds": s.upload_time.as_secs_f64(),
        "deletedObjects": s.deleted_objects,
        "readRequests": s.requests,
        "readBytes": s.fetched_bytes,
        "cacheHits": s.cache_hits,
        "cacheBytes": s.cache_bytes,
        "cacheCapacityBytes": s.cache_capacity,
        "failures": s.failures,
        "lastError": s.last_error,
    })))
}

async fn openapi() -> impl IntoResponse {
    ([(header::CONTENT_TYPE, "application/json")], OPENAPI)
}

async fn metrics(State(state): State<AppState>) -> Result<impl IntoResponse, ApiError> {
    let worker = state.clone();
    let text = blocking(move || {
        let (mut streams, mut consumers) = (Vec::new(), Vec::new());
        for namespace in [Namespace::Replicated, Namespace::Local] {
            let db = worker.db(namespace);
            for name in db.list_streams() {
                for consumer in db.consumers(&name).unwrap_or_default() {
                    consumers.push((namespace.label(), name.clone(), consumer));
                }
                if let Ok(info) = db.stream_info(&name) {
                    streams.push((namespace.label(), name, info.event_count));
                }
            }
        }
        // The replicated store's log: the embedded WAL, or a cluster node's Raft log.
        let log = worker.db(Namespace::Replicated).log_stats();
        let raft = worker.cluster().map(|c| c.status());
        let tier = worker.db(Namespace::Replicated).tier_status();
        let mut text = worker.metrics().render(&Gauges {
            bytes_in_flight: worker.admission().bytes_in_flight(),
            requests_in_flight: worker.admission().requests_in_flight(),
            log: &log,
            streams: &streams,
            consumers: &consumers,
            subscriptions: worker.subscriptions(),
            uptime_seconds: worker.uptime().as_secs_f64(),
            raft: raft.as_ref(),
            tier: tier.as_ref(),
            sql_plans: worker.plans(),
            sql: SqlGauges::of(worker.sql_resources()),
        });
        text.push_str(&worker.extra_metrics().unwrap_or_default());
        text
    })
    .await?;
    Ok(([(header::CONTENT_TYPE, "text/plain; version=0.0.4")], text))
}
