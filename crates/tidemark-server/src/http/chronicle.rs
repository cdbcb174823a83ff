//! The ChronicleDB-compatible routes, so that existing ChronicleDB-on-Raft clients and
//! notebooks work unchanged. JSON shapes follow that API; attribute names match
//! case-insensitively.

use std::time::{Duration, Instant};

use axum::extract::State;
use axum::routing::{get, post};
use axum::{Extension, Json, Router};
use serde::Deserialize;
use serde_json::{json, Map, Value as Json_};
use tidemark_core::{AggFn, Command, Field, FieldType, Schema};
use tidemark_engine::{AggregateRequest, Aggregation, StreamInfo, TimeRange};

use super::access::{reads, writes};
use super::extract::{get_ignore_case, parse_json_value, ApiPath, ApiQuery, Body, JsonBody};
use super::run::{append_decoded, blocking, submit, with_db};
use crate::admission::Permit;
use crate::error::ApiError;
use crate::state::{AppState, Namespace};

/// The store routes, nested under `/api/event-store` (replicated) and
/// `/api/event-store/embedded` (node-local).
pub fn store_routes(namespace: Namespace) -> Router<AppState> {
    Router::new()
        .route(
            "/streams",
            reads(get(list_streams)).merge(writes(post(create_stream))),
        )
        .route("/streams/{stream}/info", reads(get(stream_info)))
        .route(
            "/streams/{stream}/events",
            writes(post(append).delete(request_clear)),
        )
        .route(
            "/streams/{stream}/aggregates/{func}",
            reads(get(aggregate_count)),
        )
        .route(
            "/streams/{stream}/aggregates/{func}/{attribute}",
            reads(get(aggregate)),
        )
        .route("/clear-request-confirmation", writes(post(confirm_clear)))
        .layer(Extension(namespace))
}

/// `/api/sys-info` and the insert benchmark.
pub fn sys_routes() -> Router<AppState> {
    const MEASURE: &str = "/api/sys-info/performance/measure/event-store";
    Router::new()
        .route("/api/sys-info", reads(get(sys_info)))
        .route(
            &format!("{MEASURE}/insert-events/{{count}}"),
            // A GET that writes events: the write token.
            writes(get(measure_insert)).layer(Extension(Namespace::Replicated)),
        )
        .route(
            &format!("{MEASURE}/embedded/insert-events/{{count}}"),
            writes(get(measure_insert)).layer(Extension(Namespace::Local)),
        )
}

async fn list_streams(
    State(state): State<AppState>,
    Extension(namespace): Extension<Namespace>,
) -> Json<Vec<String>> {
    Json(state.db(namespace).list_streams())
}

async fn create_stream(
    State(state): State<AppState>,
    Extension(namespace): Extension<Namespace>,
    JsonBody(request): JsonBody<Map<String, Json_>>,
) -> Result<Json<Json_>, ApiError> {
    let name = get_ignore_case(&request, "streamName")
        .and_then(Json_::as_str)
        .ok_or_else(|| ApiError::bad_request("\"streamName\" (a string) is required"))?
        .to_string();
    let schema =
        parse_schema(get_ignore_case(&request, "schema").ok_or_else(|| {
            ApiError::bad_request("\"schema\" (a list of attributes) is required")
        })?)?;
    // ChronicleDB knows no partitions: a stream that exists with this schema is the one
    // asked for, whatever its partition (a create naming the default would be refused for
    // the partition alone, where the same request was answered 200 before partitions).
    let existing = state.db(namespace).stream_schema(&name);
    if existing.is_ok_and(|existing| existing.matches(&schema)) {
        return Ok(Json(json!({"streamName": name})));
    }
    let created = Command::CreateStream {
        name: name.clone(),
        schema,
        evolving: false,
        partition: tidemark_core::Partition::DAY,
    };
    submit(&state, namespace, created).await?;
    Ok(Json(json!({"streamName": name})))
}

/// `[{"name": "SYMBOL", "type": "STRING", "properties": {}}, ...]`
fn parse_schema(json: &Json_) -> Result<Schema, ApiError> {
    let attributes = json
        .as_array()
        .ok_or_else(|| ApiError::bad_request("\"schema\" must be a list of attributes"))?;
    let fields = attributes
        .iter()
        .enumerate()
        .map(|(i, attribute)| {
            let object = attribute.as_object().ok_or_else(|| {
                ApiError::bad_request(format!("schema attribute {i} is not an object"))
            })?;
            let text = |key: &str| {
                get_ignore_case(object, key)
                    .and_then(Json_::as_str)
                    .ok_or_else(|| {
                        ApiError::bad_request(format!(
                            "schema attribute {i} needs a string \"{key}\""
                        ))
                    })
            };
            let ty: FieldType = text("type")?.parse()?;
            Ok(Field::new(text("name")?, ty))
        })
        .collect::<Result<Vec<_>, ApiError>>()?;
    Ok(Schema::new(fields)?)
}

fn schema_json(schema: &Schema) -> Json_ {
    schema
        .fields()
        .iter()
        .map(|f| json!({"name": f.name, "type": f.ty.name(), "properties": {}}))
        .collect()
}

fn info_json(info: &StreamInfo) -> Json_ {
    let interval = info
        .time_range
        .map(|(lower, upper)| json!({"lower": lower, "upper": upper}));
    json!({
        "name": info.name,
        "eventCount": info.event_count,
        "timeInterval": interval,
        "schema": schema_json(&info.schema),
    })
}

async fn stream_info(
    State(state): State<AppState>,
    Extension(namespace): Extension<Namespace>,
    ApiPath(stream): ApiPath<String>,
) -> Result<Json<Json_>, ApiError> {
    let info = with_db(&state, namespace, move |db| db.stream_info(&stream)).await?;
    Ok(Json(info_json(&info)))
}

/// `{"events": [{...}, ...]}`; answers once every event is durable. All or nothing.
async fn append(
    State(state): State<AppState>,
    Extension(namespace): Extension<Namespace>,
    ApiPath(stream): ApiPath<String>,
    body: Body,
) -> Result<Json<Json_>, ApiError> {
    let ack = append_decoded(&state, namespace, stream, body, None, |bytes, schema| {
        // Parsed once into a value (not through `parse_json`'s typed second pass): the
        // events are most of the body.
        let Json_::Object(request) = parse_json_value(bytes)? else {
            return Err(ApiError::bad_request("the body must be a JSON object"));
        };
        let events = get_ignore_case(&request, "events")
            .and_then(Json_::as_array)
            .ok_or_else(|| ApiError::bad_request("\"events\" (a list of events) is required"))?;
        Ok(tidemark_core::json::decode_events(schema, events)?)
    })
    .await?;
    Ok(Json(json!({"eventCount": ack.events})))
}

#[derive(Debug, Deserialize)]
#[serde(rename_all = "camelCase")]
struct RangeParams {
    range_start: Option<i64>,
    range_end: Option<i64>,
    lower_inclusive: Option<bool>,
    upper_inclusive: Option<bool>,
}

impl RangeParams {
    fn range(&self) -> TimeRange {
        let lower = match (self.range_start, self.lower_inclusive.unwrap_or(true)) {
            (None, _) => i64::MIN,
            (Some(start), true) => start,
            (Some(start), false) => start.saturating_add(1),
        };
        let upper = match (self.range_end, self.upper_inclusive.unwrap_or(true)) {
            (None, _) => i64::MAX,
            (Some(end), true) => end,
            (Some(end), false) => end.saturating_sub(1),
        };
        TimeRange::new(lower, upper)
    }
}

async fn aggregate_count(
    state: State<AppState>,
    namespace: Extension<Namespace>,
    ApiPath((stream, func)): ApiPath<(String, String)>,
    params: ApiQuery<RangeParams>,
) -> Result<Json<Json_>, ApiError> {
    run_aggregate(state, namespace, stream, func, None, params).await
}

async fn aggregate(
    state: State<AppState>,
    namespace: Extension<Namespace>,
    ApiPath((stream, func, attribute)): ApiPath<(String, String, String)>,
    params: ApiQuery<RangeParams>,
) -> Result<Json<Json_>, ApiError> {
    run_aggregate(state, namespace, stream, func, Some(attribute), params).await
}

/// The value of `func(attribute)` over the range: a number, or null when no event (or only
/// nulls) fall in it. `COUNT` of an empty range is 0.
async fn run_aggregate(
    State(state): State<AppState>,
    Extension(namespace): Extension<Namespace>,
    stream: String,
    func: String,
    attribute: Option<String>,
    ApiQuery(params): ApiQuery<RangeParams>,
) -> Result<Json<Json_>, ApiError> {
    let func: AggFn = func.parse().map_err(ApiError::bad_request)?;
    let aggregation = match (&attribute, func) {
        (None, AggFn::Count) => Aggregation::count(),
        (None, _) => return Err(ApiError::bad_request(format!("{func} needs an attribute"))),
        (Some(attribute), _) => Aggregation::new(func, attribute),
    };
    let request = AggregateRequest {
        range: params.range(),
        bucket_ns: None,
        aggregations: vec![aggregation],
    };
    let rows = with_db(&state, namespace, move |db| db.aggregate(&stream, &request)).await?;
    let value = rows
        .first()
        .and_then(|row| row.values.first())
        .map(|v| v.to_json())
        .unwrap_or(if func == AggFn::Count {
            json!(0)
        } else {
            Json_::Null
        });
    Ok(Json(value))
}

/// Step one of clearing: answers `{"streamName", "token"}`; the stream is cleared only when
/// the token comes back to `/clear-request-confirmation` within 5 minutes.
async fn request_clear(
    State(state): State<AppState>,
    Extension(namespace): Extension<Namespace>,
    ApiPath(stream): ApiPath<String>,
) -> Result<Json<Json_>, ApiError> {
    let name = stream.clone();
    with_db(&state, namespace, move |db| db.stream_info(&name)).await?;
    let token = state
        .issue_clear_token(namespace, &stream)
        .map_err(|e| ApiError::from_store(e, state.retry_after_ms()))?;
    Ok(Json(json!({"streamName": stream, "token": token})))
}

async fn confirm_clear(
    State(state): State<AppState>,
    Extension(namespace): Extension<Namespace>,
    request: Result<JsonBody<Map<String, Json_>>, ApiError>,
) -> Result<Json<Json_>, ApiError> {
    let invalid = || ApiError::bad_request("No valid clear request provided");
    let JsonBody(request) = request.map_err(|e| match e.status.as_u16() {
        400 => invalid(),
        _ => e,
    })?;
    let field = |key| get_ignore_case(&request, key).and_then(Json_::as_str);
    let (Some(stream), Some(token)) = (field("streamName"), field("token")) else {
        return Err(invalid());
    };
    if state.redeem_clear_token(token, stream) != Some(namespace) {
        return Err(invalid());
    }
    let cleared = Command::Clear {
        name: stream.to_string(),
    };
    submit(&state, namespace, cleared).await?;
    Ok(Json(json!({"streamName": stream, "cleared": true})))
}

async fn sys_info(State(state): State<AppState>) -> Json<Json_> {
    let hostname = std::fs::read_to_string("/proc/sys/kernel/hostname")
        .map(|h| h.trim().to_string())
        .or_else(|_| std::env::var("HOSTNAME"))
        .unwrap_or_default();
    Json(json!({
        "nodeId": state.config().node_id,
        "version": env!("CARGO_PKG_VERSION"),
        "hostname": hostname,
        "os": format!("{} {}", std::env::consts::OS, std::env::consts::ARCH),
        "dataDirectory": state.data_dir().display().to_string(),
        "uptimeMs": state.uptime().as_millis() as u64,
        "role": role(&state),
    }))
}

/// `standalone` on a single server; on a cluster node what it is in the Raft group now.
fn role(state: &AppState) -> &'static str {
    match state.cluster().map(|c| c.status()) {
        None => "standalone",
        Some(status) if status.leader == Some(status.node) => "leader",
        Some(status) if status.leader.is_some() => "follower",
        Some(_) => "no leader",
    }
}

/// The most events one insert measurement may generate (they are generated in memory).
const MAX_MEASURE_EVENTS: usize = 20_000_000;

#[derive(Debug, Deserialize)]
#[serde(rename_all = "camelCase")]
struct MeasureParams {
    batch_size: Option<usize>,
}

/// Runs W1 inside the server: generates `count` events, appends them to the benchmark
/// stream in batches of `batchSize`, and reports the time until the last one was durable
/// (generation excluded).
/// How long a generated batch of the built-in benchmark waits for room in the write budget
/// before the benchmark gives up with 429.
const MEASURE_ADMISSION_WAIT: Duration = Duration::from_secs(30);

/// Admits `bytes` of a generated batch to the write budget, trying again every few
/// milliseconds while it is full (in process, a client's retry hint would only distort
/// the timing).
async fn admit_waiting(state: &AppState, bytes: usize) -> Result<Permit, ApiError> {
    let admission = state.admission();
    let limit = state.config().limits.max_in_flight_bytes;
    if bytes > limit {
        return Err(ApiError::bad_request(format!(
            "a batch of {bytes} bytes exceeds the write budget of {limit} bytes: use a smaller batchSize"
        )));
    }
    let deadline = Instant::now() + MEASURE_ADMISSION_WAIT;
    loop {
        if let Some(permit) = admission.try_admit(bytes) {
            return Ok(permit);
        }
        if Instant::now() >= deadline {
            return Err(ApiError::overloaded(
                "the benchmark's batches found no room in the write budget",
                state.retry_after_ms(),
            ));
        }
        tokio::time::sleep(Duration::from_millis(2)).await;
    }
}

async fn measure_insert(
    State(state): State<AppState>,
    Extension(namespace): Extension<Namespace>,
    ApiPath(count): ApiPath<usize>,
    ApiQuery(params): ApiQuery<MeasureParams>,
) -> Result<Json<Json_>, ApiError> {
    if count == 0 || count > MAX_MEASURE_EVENTS {
        return Err(ApiError::bad_request(format!(
            "the event count must be 1..={MAX_MEASURE_EVENTS}"
        )));
    }
    let batch_size = params.batch_size.unwrap_or(1_000);
    if batch_size == 0 {
        return Err(ApiError::bad_request("batchSize must be at least 1"));
    }
    let stream = tidemark_core::workload::w1::STREAM;
    let created = Command::CreateStream {
        name: stream.to_string(),
        schema: tidemark_core::workload::w1::schema(),
        evolving: false,
        partition: tidemark_core::Partition::DAY,
    };
    submit(&state, namespace, created).await?;
    let now = tidemark_query::time::now_ns();
    let generated =
        blocking(move || tidemark_core::workload::w1::generate(count, batch_size, now, now as u64))
            .await?;
    let batches = generated.len();
    let started = Instant::now();
    for batch in generated {
        // Through the write budget like a client's append, waiting for room as a client
        // that retries on 429 would, so that a benchmark cannot crowd out real writes.
        let permit = admit_waiting(&state, batch.heap_bytes()).await?;
        let append = Command::Append {
            name: stream.to_string(),
            batch,
            producer: None,
        };
        submit(&state, namespace, append).await?;
        drop(permit);
    }
    let elapsed = started.elapsed();
    let ms = elapsed.as_secs_f64() * 1e3;
    Ok(Json(json!({
        "message": format!("inserted {count} events into {stream} in {ms:.1} ms ({:.0} events/s)", count as f64 / elapsed.as_secs_f64().max(1e-9)),
        "timeElapsed": ms,
        "eventCount": count,
        "batches": batches,
        "bufferSize": batch_size,
        "isBufferEnabled": batch_size > 1,
    })))
}
