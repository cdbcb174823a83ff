//! Reading a stream by position (`GET /v1/streams/{s}/events?after=…`), once, as a long
//! poll (`wait`), or following it (`follow=true`): events in the order the stream gave them
//! positions, each with its position, so that a consumer resumes after the last one it saw.
//!
//! Formats: NDJSON, Server-Sent Events or Arrow ([`render`]).
//!
//! A follow runs as one task per client: it reads what is new, renders it, and hands the
//! client one chunk at a time through a queue of one, so a client that stops reading holds
//! the task at that chunk (one read's worth of memory) and never slows appends. While
//! nothing is new it waits on the stream's watch (`Engine::watch_positions`), sending a
//! heartbeat every [`HEARTBEAT`]. Follows and waits hold a slot of
//! `limits.max_subscriptions`.

mod params;
mod render;

use std::time::Duration;

use axum::body::Body as ResponseBody;
use axum::http::{header, HeaderMap, HeaderValue};
use axum::response::{IntoResponse, Response};
use bytes::Bytes;
use tidemark_engine::{Engine, EngineError, PositionRead, PositionRequest};
use tokio::sync::{mpsc, watch};

pub use params::is_position_read;
use params::Params;
use render::{Format, Renderer, Stop};

use crate::consume;
use crate::error::ApiError;
use crate::state::{AppState, Namespace};
use crate::store::StoreError;

/// How often an idle follow says it is alive (proxies close connections silent for long).
pub const HEARTBEAT: Duration = Duration::from_secs(15);

/// A piece of a followed answer's body.
type Chunk = Result<Bytes, std::io::Error>;

/// Answers a read by position of `stream` in `namespace`.
pub async fn read(
    state: AppState,
    namespace: Namespace,
    stream: String,
    raw: Option<String>,
    headers: HeaderMap,
) -> Result<Response, ApiError> {
    let params = Params::parse(raw.as_deref(), &headers)?;
    let format = params::format(&headers);
    let db = state.db(namespace);
    let after = consume::start_after(&state, &db, &stream, &params.start())
        .await
        .map_err(|e| from_store(&state, e))?;
    if !params.follow && params.wait.is_none() {
        let read = read_once(&state, &db, &stream, after, params.limit).await?;
        return events_answer(format, &params, read);
    }
    let slot = consume::subscription_slot(&state).map_err(|e| from_store(&state, e))?;
    // Watched before the first read, so that an append in between is not missed.
    let mut watch = watch_stream(&state, &db, &stream)?;
    let first = read_once(&state, &db, &stream, after, params.limit).await?;
    if let Some(wait) = params.wait {
        let read = if first.events.is_empty() {
            // Answered at the first append, at the end of the wait, or when the server stops
            // (empty: the client asks again, there or elsewhere).
            let mut stopping = state.stopping();
            tokio::select! {
                _ = tokio::time::timeout(wait, watch.changed()) => {}
                () = consume::until_stopping(&mut stopping) => {}
            }
            read_once(&state, &db, &stream, after, params.limit).await?
        } else {
            first
        };
        drop(slot);
        return events_answer(format, &params, read);
    }
    let next_position = first.next_position;
    let renderer =
        Renderer::begin(format, params.times, first.events.schema()).map_err(render_failed)?;
    // One chunk waits for the client at a time: a client that stops reading holds the
    // follow there.
    let (chunks, body) = mpsc::channel::<Chunk>(1);
    let follow = Follow {
        state: state.clone(),
        db,
        stream,
        after,
        limit: params.limit,
        renderer,
        watch,
        stopping: state.stopping(),
        chunks,
    };
    tokio::spawn(async move {
        follow.run(first).await;
        drop(slot);
    });
    let body = ResponseBody::from_stream(tokio_stream_of(body));
    Ok(answer(format, next_position, body))
}

fn from_store(state: &AppState, e: StoreError) -> ApiError {
    ApiError::from_store(e, state.retry_after_ms())
}

/// The whole answer to one read: its events, rendered.
fn events_answer(
    format: Format,
    params: &Params,
    read: PositionRead,
) -> Result<Response, ApiError> {
    let next_position = read.next_position;
    let mut renderer =
        Renderer::begin(format, params.times, read.events.schema()).map_err(render_failed)?;
    let mut pieces = renderer.events(read.events).map_err(stopped)?;
    pieces.extend(renderer.finish().map_err(stopped)?);
    let body: Vec<u8> = pieces.concat();
    Ok(answer(format, next_position, ResponseBody::from(body)))
}

fn render_failed(e: std::io::Error) -> ApiError {
    ApiError::internal(format!("writing the answer failed: {e}"))
}

fn stopped(stop: Stop) -> ApiError {
    match stop {
        // One read has one schema: the answer began with it.
        Stop::SchemaChanged => ApiError::internal("a read's schema changed while it was written"),
        Stop::Failed(e) => render_failed(e),
    }
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
fn tokio_stream_of(mut chunks: mpsc::Receiver<Chunk>) -> impl futures::Stream<Item = Chunk> {
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
    consume::read(db, stream, after, limit, PositionRequest::DEFAULT_MAX_BYTES)
        .await
        .map_err(|e| from_store(state, e))
}

/// A follow in progress: one client's.
struct Follow {
    state: AppState,
    db: Engine,
    stream: String,
    /// The last position sent (`None`: none yet, reading from the earliest held).
    after: Option<u64>,
    limit: usize,
    renderer: Renderer,
    watch: watch::Receiver<u64>,
    /// Changes when the server stops.
    stopping: watch::Receiver<bool>,
    chunks: mpsc::Sender<Chunk>,
}

/// Why a follow ended.
enum End {
    /// The client left: nothing more to say.
    Left,
    /// The answer ends cleanly (an Arrow answer whose stream's schema changed: the client
    /// resumes after its last position).
    Clean,
    /// A read failed, or the stream was dropped.
    Failed(ApiError),
    /// The server is stopping: said where the format has room (the client follows again
    /// after its last position, on this server once it is back or on another node).
    Stopping,
}

impl Follow {
    /// Sends `first`, then whatever the stream gives, until the client leaves, the stream
    /// is dropped, or a read fails (said as the last chunk where the format can).
    async fn run(mut self, first: PositionRead) {
        let end = self.follow(first).await;
        let last_words = match end {
            End::Left => return,
            End::Clean => match self.renderer.finish() {
                Ok(pieces) => pieces.into_iter().map(Ok).collect(),
                Err(_) => Vec::new(),
            },
            // Said where the format has room; an Arrow answer ends cleanly instead, and
            // its client follows again after its last position.
            End::Stopping => match self
                .renderer
                .error(&from_store(&self.state, consume::stopping()))
            {
                Some(words) => vec![Ok(words)],
                None => self
                    .renderer
                    .finish()
                    .map(|pieces| pieces.into_iter().map(Ok).collect())
                    .unwrap_or_default(),
            },
            End::Failed(e) => match self.renderer.error(&e) {
                Some(words) => vec![Ok(words)],
                // No room in the format: the answer is cut short instead.
                None => vec![Err(std::io::Error::other(e.message))],
            },
        };
        for chunk in last_words {
            if self.chunks.send(chunk).await.is_err() {
                return;
            }
        }
    }

    async fn follow(&mut self, first: PositionRead) -> End {
        let mut read = first;
        loop {
            let next_position = read.next_position;
            if let Some(last) = read.last_position() {
                self.after = Some(last);
                match self.renderer.events(read.events) {
                    Ok(pieces) => {
                        if !send_all(&self.chunks, pieces).await {
                            return End::Left;
                        }
                    }
                    Err(Stop::SchemaChanged) => return End::Clean,
                    Err(Stop::Failed(e)) => return End::Failed(render_failed(e)),
                }
            }
            // Caught up when what was answered reaches the stream's next position (a read
            // cut short by its byte bound is not: the rest is read at once).
            let caught_up = self.after.is_none_or(|last| last + 1 >= next_position);
            if caught_up {
                if let Some(end) = self.wait_for_more(next_position).await {
                    return end;
                }
            }
            // A follow still catching up when the server stops ends too, not at the grace.
            if *self.stopping.borrow() {
                return End::Stopping;
            }
            match read_once(&self.state, &self.db, &self.stream, self.after, self.limit).await {
                Ok(next) => read = next,
                Err(e) => return End::Failed(e),
            }
            if let Err(gone) = consume::still_there(&self.watch, &self.stream) {
                return End::Failed(from_store(&self.state, gone));
            }
        }
    }

    /// Waits until the stream has more (`None`), sending heartbeats meanwhile; or says why
    /// the follow ends (the client left, the stream was dropped).
    async fn wait_for_more(&mut self, next_position: u64) -> Option<End> {
        loop {
            tokio::select! {
                changed = self.watch.changed() => {
                    self.watch.borrow_and_update();
                    if changed.is_err() {
                        let gone = EngineError::UnknownStream(self.stream.clone());
                        return Some(End::Failed(ApiError::from_engine(gone, 0)));
                    }
                    return None;
                }
                () = tokio::time::sleep(HEARTBEAT) => {
                    let beat = match self.renderer.heartbeat(next_position) {
                        Ok(beat) => beat,
                        Err(Stop::Failed(e)) => return Some(End::Failed(render_failed(e))),
                        Err(Stop::SchemaChanged) => return Some(End::Clean),
                    };
                    if !send_all(&self.chunks, beat).await {
                        return Some(End::Left);
                    }
                }
                () = self.chunks.closed() => return Some(End::Left),
                () = consume::until_stopping(&mut self.stopping) => return Some(End::Stopping),
            }
        }
    }
}

/// Hands `pieces` to the client in order; `false` when it left.
async fn send_all(chunks: &mpsc::Sender<Chunk>, pieces: Vec<Bytes>) -> bool {
    for piece in pieces {
        if chunks.send(Ok(piece)).await.is_err() {
            return false;
        }
    }
    true
}
