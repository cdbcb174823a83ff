//! Reading a stream by position (`GET /v1/streams/{s}/events?after=…`), once, as a long
//! poll (`wait`), or following it (`follow=true`): events in the order the stream gave them
//! positions, each with its position, so that a consumer resumes after the last one it saw.
//!
//! Formats: NDJSON, one `{"position": P, "event": {…}}` per line (the event as a scan prints
//! it); or Server-Sent Events (`Accept: text/event-stream`), each event's position its `id`,
//! so that a browser's `EventSource` resumes by itself (it sends `Last-Event-ID`).
//!
//! A follow runs as one task per client: it reads what is new, renders it, and hands the
//! client one chunk at a time through a queue of one, so a client that stops reading holds
//! the task at that chunk (one read's worth of memory) and never slows appends. While
//! nothing is new it waits on the stream's watch (`Engine::watch_positions`), sending a
//! heartbeat every [`HEARTBEAT`]. Follows and waits hold a slot of
//! `limits.max_subscriptions`.

use std::time::Duration;

use axum::body::Body as ResponseBody;
use axum::http::{header, HeaderMap, HeaderValue};
use axum::response::{IntoResponse, Response};
use serde_json::json;
use tidemark_engine::{Engine, EngineError, PositionRead, PositionRequest};
use tidemark_query::Times;
use tokio::sync::{mpsc, watch};

use super::run::blocking;
use crate::error::ApiError;
use crate::state::{AppState, Namespace};
use crate::store::StoreErrorKind;

/// Events answered by one read when the client names no `limit`.
const DEFAULT_LIMIT: usize = 1_000;
/// The most events one read answers: what a follow renders at a time, and so what a client
/// that stops reading can hold on the server.
const MAX_LIMIT: usize = 10_000;
/// The longest long poll (`wait`).
const MAX_WAIT: Duration = Duration::from_secs(60);
/// How often an idle follow says it is alive (proxies close connections silent for long).
pub const HEARTBEAT: Duration = Duration::from_secs(15);

/// Whether a request for the events of a stream is a read by position: it names one of
/// this module's parameters, or asks for Server-Sent Events.
pub fn is_position_read(raw: Option<&str>, headers: &HeaderMap) -> bool {
    let named = form_urlencoded::parse(raw.unwrap_or_default().as_bytes())
        .any(|(key, _)| matches!(key.as_ref(), "after" | "follow" | "wait" | "consumer"));
    named || wants_sse(headers)
}

fn wants_sse(headers: &HeaderMap) -> bool {
    headers
        .get(header::ACCEPT)
        .and_then(|v| v.to_str().ok())
        .is_some_and(|accept| accept.contains("text/event-stream"))
}

/// The query string of a read by position.
#[derive(Debug, Clone, PartialEq)]
struct Params {
    after: Option<u64>,
    /// Read after the position this named consumer committed (unless `after` says where).
    consumer: Option<String>,
    limit: usize,
    follow: bool,
    wait: Option<Duration>,
    times: Times,
}

impl Params {
    fn parse(raw: Option<&str>, headers: &HeaderMap) -> Result<Params, ApiError> {
        let mut params = Params {
            after: None,
            consumer: None,
            limit: DEFAULT_LIMIT,
            follow: false,
            wait: None,
            times: Times::Nanoseconds,
        };
        for (key, value) in form_urlencoded::parse(raw.unwrap_or_default().as_bytes()) {
            match key.as_ref() {
                "after" => params.after = Some(parse_number(&value, "after", "a position")?),
                "limit" => {
                    let limit: usize = parse_number(&value, "limit", "a count of events")?;
                    if limit == 0 || limit > MAX_LIMIT {
                        return Err(ApiError::bad_request(format!(
                            "limit must be 1 to {MAX_LIMIT} for a read by position, not {limit}"
                        )));
                    }
                    params.limit = limit;
                }
                "follow" => {
                    params.follow = match value.as_ref() {
                        "true" | "1" => true,
                        "false" | "0" => false,
                        other => {
                            return Err(ApiError::bad_request(format!(
                                "follow must be true or false, not {other:?}"
                            )))
                        }
                    }
                }
                "wait" => {
                    let ms: u64 = parse_number(&value, "wait", "milliseconds")?;
                    params.wait = Some(Duration::from_millis(ms).min(MAX_WAIT));
                }
                "time" => params.times = parse_times(&value)?,
                "consumer" => params.consumer = Some(value.into_owned()),
                "from" | "to" | "last" | "fields" | "where" | "consistency" => {
                    return Err(ApiError::bad_request(format!(
                        "{key} is a parameter of a scan by time; a read by position takes \
                         after, consumer, limit, follow, wait and time"
                    )))
                }
                other => {
                    return Err(ApiError::bad_request(format!(
                        "unknown parameter {other:?} (after, consumer, limit, follow, wait, time)"
                    )))
                }
            }
        }
        // A browser's EventSource reconnects with the id of the last event it received.
        if params.after.is_none() && wants_sse(headers) {
            if let Some(last) = headers.get("last-event-id").and_then(|v| v.to_str().ok()) {
                params.after = Some(parse_number(last, "Last-Event-ID", "a position")?);
            }
        }
        if params.follow && params.wait.is_some() {
            return Err(ApiError::bad_request(
                "follow and wait do not go together: a follow waits for ever, a wait once",
            ));
        }
        Ok(params)
    }
}

fn parse_number<T: std::str::FromStr>(value: &str, name: &str, what: &str) -> Result<T, ApiError> {
    value
        .parse()
        .map_err(|_| ApiError::bad_request(format!("{name} {value:?} is not {what}")))
}

fn parse_times(value: &str) -> Result<Times, ApiError> {
    match value {
        "ns" => Ok(Times::Nanoseconds),
        "rfc3339" => Ok(Times::Rfc3339),
        other => Err(ApiError::bad_request(format!(
            "time must be \"ns\" or \"rfc3339\", not {other:?}"
        ))),
    }
}

/// How events are written to the client.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Format {
    Ndjson,
    Sse,
}

impl Format {
    fn content_type(self) -> &'static str {
        match self {
            Format::Ndjson => "application/x-ndjson",
            Format::Sse => "text/event-stream",
        }
    }

    /// The events of `read`, each with its position.
    fn events(self, read: &PositionRead, times: Times, out: &mut Vec<u8>) {
        let events = &read.events;
        for row in 0..events.len() {
            let Some(position) = events.position_at(row) else {
                continue;
            };
            let mut event = tidemark_core::json::event_to_json(events, row);
            if times == Times::Rfc3339 {
                tidemark_query::format_event_times(&mut event);
            }
            match self {
                Format::Ndjson => {
                    let line = json!({"position": position, "event": event});
                    out.extend_from_slice(line.to_string().as_bytes());
                    out.push(b'\n');
                }
                Format::Sse => {
                    out.extend_from_slice(format!("id: {position}\ndata: {event}\n\n").as_bytes())
                }
            }
        }
    }

    /// Said while nothing is new: that the follow is alive, and where the stream is.
    fn heartbeat(self, next_position: u64) -> Vec<u8> {
        match self {
            Format::Ndjson => format!(
                "{}\n",
                json!({"heartbeat": true, "nextPosition": next_position})
            ),
            // A comment: EventSource ignores it, proxies see traffic.
            Format::Sse => format!(": heartbeat, next position {next_position}\n\n"),
        }
        .into_bytes()
    }

    /// Why the follow ends, as its last words (the answer's status was sent long before).
    fn error(self, e: &ApiError) -> Vec<u8> {
        let body = json!({"error": e.code, "message": e.message});
        match self {
            Format::Ndjson => format!("{body}\n"),
            Format::Sse => format!("event: error\ndata: {body}\n\n"),
        }
        .into_bytes()
    }
}

/// Answers a read by position of `stream` in `namespace`.
pub async fn read(
    state: AppState,
    namespace: Namespace,
    stream: String,
    raw: Option<String>,
    headers: HeaderMap,
) -> Result<Response, ApiError> {
    let mut params = Params::parse(raw.as_deref(), &headers)?;
    let db = state.db(namespace);
    if let (None, Some(consumer)) = (params.after, &params.consumer) {
        // A consumer that never committed starts from the earliest event held.
        params.after = db
            .consumer_position(&stream, consumer)
            .map_err(|e| ApiError::from_engine(e, state.retry_after_ms()))?;
    }
    let format = if wants_sse(&headers) {
        Format::Sse
    } else {
        Format::Ndjson
    };
    if !params.follow && params.wait.is_none() {
        let read = read_once(&state, &db, &stream, params.after, params.limit).await?;
        return Ok(events_answer(format, &read, params.times));
    }
    let slot = subscription_slot(&state)?;
    // Watched before the first read, so that an append in between is not missed.
    let mut watch = watch_stream(&state, &db, &stream)?;
    let first = read_once(&state, &db, &stream, params.after, params.limit).await?;
    if let Some(wait) = params.wait {
        let read = if first.events.is_empty() {
            let _ = tokio::time::timeout(wait, watch.changed()).await;
            read_once(&state, &db, &stream, params.after, params.limit).await?
        } else {
            first
        };
        drop(slot);
        return Ok(events_answer(format, &read, params.times));
    }
    let next_position = first.next_position;
    // One chunk waits for the client at a time: a client that stops reading holds the
    // follow there.
    let (chunks, body) = mpsc::channel::<Result<Vec<u8>, std::io::Error>>(1);
    let follow = Follow {
        state,
        db,
        stream,
        params,
        format,
        watch,
        chunks,
    };
    tokio::spawn(async move {
        follow.run(first).await;
        drop(slot);
    });
    let body = ResponseBody::from_stream(tokio_stream_of(body));
    Ok(answer(format, next_position, body))
}

/// A slot of `limits.max_subscriptions` for a follow or a long poll, or the refusal.
fn subscription_slot(state: &AppState) -> Result<tokio::sync::OwnedSemaphorePermit, ApiError> {
    state.subscription_slot().ok_or_else(|| {
        let message = format!(
            "the server follows {} streams for clients at once (limits.max_subscriptions): \
             retry later",
            state.config().limits.max_subscriptions
        );
        let busy = crate::store::StoreError::new(StoreErrorKind::Unavailable, message);
        ApiError::from_store(busy, state.retry_after_ms())
    })
}

/// The whole answer to one read: its events, rendered.
fn events_answer(format: Format, read: &PositionRead, times: Times) -> Response {
    let mut out = Vec::new();
    format.events(read, times, &mut out);
    answer(format, read.next_position, ResponseBody::from(out))
}

/// The answer's head: its format, and the stream's next position when the read began.
fn answer(format: Format, next_position: u64, body: ResponseBody) -> Response {
    let mut response = ([(header::CONTENT_TYPE, format.content_type())], body).into_response();
    response
        .headers_mut()
        .insert("tidemark-next-position", HeaderValue::from(next_position));
    if format == Format::Sse {
        response
            .headers_mut()
            .insert(header::CACHE_CONTROL, HeaderValue::from_static("no-cache"));
    }
    response
}

/// The receiving end of a queue as a stream of body chunks.
fn tokio_stream_of(
    mut chunks: mpsc::Receiver<Result<Vec<u8>, std::io::Error>>,
) -> impl futures::Stream<Item = Result<Vec<u8>, std::io::Error>> {
    futures::stream::poll_fn(move |cx| chunks.poll_recv(cx))
}

fn watch_stream(
    state: &AppState,
    db: &Engine,
    stream: &str,
) -> Result<watch::Receiver<u64>, ApiError> {
    let mut watch = db
        .watch_positions(stream)
        .map_err(|e| ApiError::from_engine(e, state.retry_after_ms()))?;
    watch.borrow_and_update();
    Ok(watch)
}

async fn read_once(
    state: &AppState,
    db: &Engine,
    stream: &str,
    after: Option<u64>,
    limit: usize,
) -> Result<PositionRead, ApiError> {
    let (db, stream) = (db.clone(), stream.to_string());
    let request = PositionRequest::after(after, limit);
    blocking(move || db.read_positions(&stream, &request))
        .await?
        .map_err(|e| ApiError::from_engine(e, state.retry_after_ms()))
}

/// A follow in progress: one client's.
struct Follow {
    state: AppState,
    db: Engine,
    stream: String,
    params: Params,
    format: Format,
    watch: watch::Receiver<u64>,
    chunks: mpsc::Sender<Result<Vec<u8>, std::io::Error>>,
}

impl Follow {
    /// Sends `first`, then whatever the stream gives, until the client leaves, the stream
    /// is dropped, or a read fails (said as the last chunk).
    async fn run(mut self, first: PositionRead) {
        let mut read = first;
        loop {
            let mut after = self.params.after;
            if let Some(last) = read.last_position() {
                after = Some(last);
                let mut out = Vec::new();
                self.format.events(&read, self.params.times, &mut out);
                if self.chunks.send(Ok(out)).await.is_err() {
                    return;
                }
            }
            self.params.after = after;
            // Caught up when what was answered reaches the stream's next position (a read
            // cut short by its byte bound is not: the rest is read at once).
            let caught_up = after.is_none_or(|last| last + 1 >= read.next_position);
            if caught_up && !self.wait_for_more(&read).await {
                return;
            }
            match read_once(
                &self.state,
                &self.db,
                &self.stream,
                after,
                self.params.limit,
            )
            .await
            {
                Ok(next) => read = next,
                Err(e) => {
                    let _ = self.chunks.send(Ok(self.format.error(&e))).await;
                    return;
                }
            }
        }
    }

    /// Waits until the stream has more (`true`), sending heartbeats meanwhile; `false`
    /// when the client left or the stream was dropped (said to the client).
    async fn wait_for_more(&mut self, read: &PositionRead) -> bool {
        loop {
            tokio::select! {
                changed = self.watch.changed() => {
                    self.watch.borrow_and_update();
                    if changed.is_err() {
                        let gone = ApiError::from_engine(
                            EngineError::UnknownStream(self.stream.clone()),
                            0,
                        );
                        let _ = self.chunks.send(Ok(self.format.error(&gone))).await;
                        return false;
                    }
                    return true;
                }
                () = tokio::time::sleep(HEARTBEAT) => {
                    let beat = self.format.heartbeat(read.next_position);
                    if self.chunks.send(Ok(beat)).await.is_err() {
                        return false;
                    }
                }
                () = self.chunks.closed() => return false,
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn params(query: &str) -> Result<Params, ApiError> {
        Params::parse(Some(query), &HeaderMap::new())
    }

    #[test]
    fn parameters_are_checked_and_scan_ones_refused_by_name() {
        let p = params("after=41&limit=5&time=rfc3339").unwrap();
        assert_eq!((p.after, p.limit, p.follow), (Some(41), 5, false));
        assert!(params("follow=true").unwrap().follow);
        assert_eq!(params("wait=999999").unwrap().wait, Some(MAX_WAIT));
        for bad in [
            "after=-1",
            "limit=0",
            "limit=10001",
            "follow=yes",
            "wait=soon",
        ] {
            assert!(params(bad).is_err(), "{bad}");
        }
        let e = params("after=1&from=2024-01-01").unwrap_err();
        assert!(e.message.contains("scan by time"), "{}", e.message);
        assert!(params("follow=true&wait=10").is_err());
    }

    #[test]
    fn an_event_source_resumes_after_its_last_event_id() {
        let mut headers = HeaderMap::new();
        headers.insert(
            header::ACCEPT,
            HeaderValue::from_static("text/event-stream"),
        );
        headers.insert("last-event-id", HeaderValue::from_static("17"));
        assert!(is_position_read(None, &headers));
        let p = Params::parse(Some("follow=true"), &headers).unwrap();
        assert_eq!(p.after, Some(17));
        // An explicit `after` wins.
        assert_eq!(
            Params::parse(Some("after=3"), &headers).unwrap().after,
            Some(3)
        );
        assert!(!is_position_read(Some("from=1"), &HeaderMap::new()));
    }
}
