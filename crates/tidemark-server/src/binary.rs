//! The binary protocol listener (see `docs/protocol.md`). Each connection has one reader
//! and one writer task; every APPEND runs as its own task, so many requests are in flight on
//! one connection and answers go out as they complete, matched by request id.
//!
//! A frame's bytes are admitted (see [`crate::admission`]) before its body is read: when the
//! server is full, the body is skipped unread and the request answered TRY_LATER.

use std::time::Instant;

use tidemark_core::{Command, ProducerSeq};
use tidemark_protocol::{
    decode_append_batch, decode_frame, decode_header, frame_len, ErrorCode, Frame, FrameError,
    Header, Request, Response, HEADER_LEN,
};
use tokio::io::{AsyncRead, AsyncReadExt, AsyncWrite, AsyncWriteExt, ReadHalf, WriteHalf};
use tokio::net::TcpListener;
use tokio::sync::{mpsc, watch};
use tokio::task::JoinSet;

use crate::admission::Permit;
use crate::auth::token_matches;
use crate::metrics::Rejection;
use crate::shutdown::{serve_connections, stopped, Accept, Serving};
use crate::state::{AppState, Namespace};
use crate::store::{StoreError, StoreErrorKind, INLINE_BYTES};
use crate::tls::TlsListener;

/// A client's byte stream, plain TCP or TLS.
pub trait Connection: AsyncRead + AsyncWrite + Send + Unpin + 'static {}
impl<T: AsyncRead + AsyncWrite + Send + Unpin + 'static> Connection for T {}

/// Where binary-protocol connections come from.
pub enum BinaryListener {
    Plain(TcpListener),
    Tls(TlsListener),
}

impl Accept for BinaryListener {
    type Socket = Box<dyn Connection>;

    async fn accept(&mut self) -> std::io::Result<(Box<dyn Connection>, std::net::SocketAddr)> {
        match self {
            BinaryListener::Plain(listener) => {
                let (socket, peer) = listener.accept().await?;
                // Answers are small and latency matters more than packet count.
                let _ = socket.set_nodelay(true);
                Ok((Box::new(socket), peer))
            }
            BinaryListener::Tls(listener) => match listener.next().await {
                Some((stream, peer)) => {
                    let _ = stream.get_ref().0.set_nodelay(true);
                    Ok((Box::new(stream), peer))
                }
                None => std::future::pending().await,
            },
        }
    }
}

/// Accepts connections until `shutdown` turns true, then waits (at most
/// `limits.shutdown_grace_ms`) for every connection to answer the requests it has read.
pub async fn serve(state: AppState, listener: BinaryListener, shutdown: watch::Receiver<bool>) {
    let serving = Serving {
        what: "binary",
        max_connections: usize::MAX,
        grace: state.config().limits.shutdown_grace(),
        draining: "binary connections",
    };
    serve_connections(listener, serving, shutdown.clone(), |socket, _peer| {
        serve_connection(state.clone(), socket, shutdown.clone())
    })
    .await;
}

/// Answers queued for one connection's writer.
const ANSWER_QUEUE: usize = 1024;

/// The answer to PING and to an accepted AUTH.
const ACK_NOTHING: Response = Response::Ack {
    lsn: 0,
    events: 0,
    service_micros: 0,
};

/// What a connection has proven with AUTH.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Granted {
    Nothing,
    Read,
    Write,
}

async fn serve_connection(
    state: AppState,
    socket: Box<dyn Connection>,
    mut shutdown: watch::Receiver<bool>,
) {
    let (mut reader, writer) = tokio::io::split(socket);
    // Bounded: a client that sends without reading its answers is paused, not buffered for.
    let (answers, outbox) = mpsc::channel(ANSWER_QUEUE);
    let writer = tokio::spawn(write_answers(writer, outbox));
    let mut requests = JoinSet::new();
    let auth = &state.config().auth;
    let mut granted = if auth.is_enabled() {
        Granted::Nothing
    } else {
        Granted::Write
    };
    loop {
        let frame = tokio::select! {
            _ = stopped(&mut shutdown) => break,
            frame = read_frame(&state, &mut reader, granted == Granted::Write) => frame,
        };
        let (header, bytes, permit) = match frame {
            Ok(Some(frame)) => frame,
            Ok(None) => break,
            Err(Refusal {
                request_id,
                answer,
                close,
            }) => {
                let _ = answers.send(encode(request_id, &answer)).await;
                if close {
                    break;
                }
                continue;
            }
        };
        let request_id = header.request_id;
        // The one checksum pass over the body. A frame that fails it cannot be trusted to
        // say where the next one starts.
        // The answer carries request id 0, like every error that closes the connection:
        // with the body in doubt, so is the header that came with it.
        if let Err(e) = decode_frame(&bytes, usize::MAX) {
            let _ = answers.send(encode(0, &malformed(&e.to_string()))).await;
            break;
        }
        if header.kind.is_append() {
            // Appends are decoded and stored in their own task, off this loop; read_frame
            // refused them on a connection without the write token.
            assert!(
                granted == Granted::Write,
                "an append read without the write token"
            );
            let (state, answers) = (state.clone(), answers.clone());
            requests.spawn(async move {
                let answer = append(&state, header, bytes).await;
                drop(permit);
                let _ = answers.send(encode(request_id, &answer)).await;
            });
            // Reap finished requests so the set does not grow with the connection's age.
            while requests.try_join_next().is_some() {}
            continue;
        }
        let frame = Frame {
            kind: header.kind,
            request_id,
            body: &bytes[HEADER_LEN..],
        };
        let request = match Request::decode(&frame) {
            Ok(request) => request,
            Err(e) => {
                state.metrics().rejected(Rejection::BadRequest);
                let _ = answers.send(encode(request_id, &bad_request(&e))).await;
                continue;
            }
        };
        match request {
            Request::Ping => {
                let _ = answers.send(encode(request_id, &ACK_NOTHING)).await;
            }
            Request::Auth { .. } if !auth.is_enabled() => {
                // Without tokens configured every connection may write: AUTH changes nothing.
                let _ = answers.send(encode(request_id, &ACK_NOTHING)).await;
            }
            Request::Auth { token } => {
                granted = if token_matches(token, &auth.write_token) {
                    Granted::Write
                } else if token_matches(token, &auth.read_token) {
                    Granted::Read
                } else {
                    Granted::Nothing
                };
                let answer = if granted == Granted::Nothing {
                    state.metrics().rejected(Rejection::Unauthorized);
                    error(ErrorCode::Unauthorized, "the token is not valid")
                } else {
                    ACK_NOTHING
                };
                let _ = answers.send(encode(request_id, &answer)).await;
            }
            Request::Command { .. } if granted != Granted::Write => {
                state.metrics().rejected(Rejection::Unauthorized);
                let answer = error(
                    ErrorCode::Unauthorized,
                    "catalog changes need AUTH with the write token",
                );
                let _ = answers.send(encode(request_id, &answer)).await;
            }
            Request::Command { command } => {
                // In its own task like an append: a catalog change waits for its fsync.
                let command = command.to_vec();
                let (state, answers) = (state.clone(), answers.clone());
                requests.spawn(async move {
                    let answer = catalog_change(&state, &command).await;
                    drop(permit);
                    let _ = answers.send(encode(request_id, &answer)).await;
                });
                while requests.try_join_next().is_some() {}
            }
            // Taken by kind before decoding, above.
            Request::Append { .. } => {}
        }
    }
    while requests.join_next().await.is_some() {}
    drop(answers);
    let _ = writer.await;
}

/// A frame that is not served, and whether the connection can go on after it.
struct Refusal {
    request_id: u64,
    answer: Response,
    close: bool,
}

/// The largest frame other than an APPEND (PING, AUTH): a token and a little more.
const MAX_CONTROL_FRAME: usize = 64 << 10;

/// Reads one whole frame. `Ok(None)` at the end of the stream, or when the peer stops
/// sending in the middle of a frame for longer than the read timeout.
///
/// A frame's bytes are admitted as they arrive, never on its declared length alone, so a
/// client that announces a large frame and sends nothing holds nothing. APPEND bodies draw
/// on the write budget and only on a connection allowed to append (`may_append`); others
/// are skipped unread and answered UNAUTHORIZED. Other frames are small and draw on the
/// control budget, apart from appends.
async fn read_frame(
    state: &AppState,
    reader: &mut ReadHalf<Box<dyn Connection>>,
    may_append: bool,
) -> Result<Option<(Header, Vec<u8>, Permit)>, Refusal> {
    let fatal = |answer| Refusal {
        request_id: 0,
        answer,
        close: true,
    };
    // The length first: a frame over the limit is refused without waiting for more bytes.
    let mut head = [0u8; HEADER_LEN];
    if reader.read_exact(&mut head[..4]).await.is_err() {
        return Ok(None);
    }
    let read_timeout = state.config().limits.read_timeout();
    let max = state.config().limits.max_body_bytes;
    if let Err(e) = frame_len(&head, max) {
        return Err(fatal(match e {
            FrameError::TooLarge { .. } => {
                state.metrics().rejected(Rejection::TooLarge);
                error(ErrorCode::TooLarge, &e.to_string())
            }
            _ => malformed(&e.to_string()),
        }));
    }
    if !matches!(
        tokio::time::timeout(read_timeout, reader.read_exact(&mut head[4..])).await,
        Ok(Ok(_))
    ) {
        return Ok(None);
    }
    let header = match decode_header(&head, max) {
        Ok(Some(header)) => header,
        Ok(None) => return Err(fatal(malformed("incomplete header"))),
        Err(e @ FrameError::UnsupportedVersion(_)) => {
            return Err(fatal(error(ErrorCode::UnsupportedVersion, &e.to_string())))
        }
        Err(e) => return Err(fatal(malformed(&e.to_string()))),
    };
    let body_len = header.frame_len - HEADER_LEN;
    // The request id is known from here on: refusals echo it.
    let refuse = |answer, close| Refusal {
        request_id: header.request_id,
        answer,
        close,
    };
    let budget = if header.kind.is_append() {
        if !may_append {
            if !skip(reader, body_len, read_timeout).await {
                return Ok(None);
            }
            state.metrics().rejected(Rejection::Unauthorized);
            let answer = error(
                ErrorCode::Unauthorized,
                "appends need AUTH with the write token",
            );
            return Err(refuse(answer, false));
        }
        state.admission()
    } else {
        if header.frame_len > MAX_CONTROL_FRAME {
            state.metrics().rejected(Rejection::TooLarge);
            let message = format!(
                "a {:?} frame of {} bytes exceeds the limit of {MAX_CONTROL_FRAME} for frames other than APPEND",
                header.kind, header.frame_len
            );
            return Err(refuse(error(ErrorCode::TooLarge, &message), true));
        }
        state.control_admission()
    };
    let try_later = |skipped: bool| {
        if !skipped {
            return Ok(None);
        }
        state.metrics().rejected(Rejection::Overloaded);
        Err(refuse(
            Response::TryLater {
                retry_after_ms: state.retry_after_ms(),
                message: "the server has too many request bytes in flight".into(),
            },
            false,
        ))
    };
    let Some(mut permit) = budget.try_admit(HEADER_LEN) else {
        // Skip the body unread, so the connection stays in step, and ask for a retry.
        return try_later(skip(reader, body_len, read_timeout).await);
    };
    // Capacity is address space until written: the declared length may size it.
    let mut bytes = Vec::with_capacity(header.frame_len);
    bytes.extend_from_slice(&head);
    while bytes.len() < header.frame_len {
        let remaining = (header.frame_len - bytes.len()) as u64;
        let read = tokio::time::timeout(
            read_timeout,
            (&mut *reader).take(remaining).read_buf(&mut bytes),
        )
        .await;
        let n = match read {
            Ok(Ok(n)) if n > 0 => n,
            _ => return Ok(None),
        };
        if !permit.grow(n) {
            let left = header.frame_len - bytes.len();
            drop((bytes, permit));
            return try_later(skip(reader, left, read_timeout).await);
        }
    }
    debug_assert_eq!(bytes.len(), header.frame_len);
    debug_assert_eq!(permit.bytes(), header.frame_len, "admitted what was read");
    Ok(Some((header, bytes, permit)))
}

/// Reads and drops `len` bytes; `false` if the stream ends or stalls first.
async fn skip(
    reader: &mut ReadHalf<Box<dyn Connection>>,
    len: usize,
    read_timeout: std::time::Duration,
) -> bool {
    let mut buffer = [0u8; 8192];
    let mut left = len;
    while left > 0 {
        let chunk = left.min(buffer.len());
        match tokio::time::timeout(read_timeout, reader.read(&mut buffer[..chunk])).await {
            Ok(Ok(n)) if n > 0 => left -= n,
            _ => return false,
        }
    }
    true
}

/// Decodes the batch of an APPEND frame (its checksum already checked) off the async
/// threads, then appends it to the replicated store.
async fn append(state: &AppState, header: Header, bytes: Vec<u8>) -> Response {
    let started = Instant::now();
    let store = state.store(Namespace::Replicated);
    let retry_after_ms = state.retry_after_ms();
    let frame_bytes = bytes.len();
    let outcome = async {
        let frame = Frame {
            kind: header.kind,
            request_id: header.request_id,
            body: &bytes[HEADER_LEN..],
        };
        // Only the header fields: the batch stays in wire form until it is decoded below.
        // The frame itself was intact (its checksum held), so a bad body is a bad request
        // and the connection goes on.
        let stream = match Request::decode(&frame) {
            Ok(Request::Append { stream, .. }) => stream,
            Ok(_) => return Err(error(ErrorCode::BadRequest, "not an append")),
            Err(e) => return Err(bad_request(&e)),
        };
        let stream_schema = store
            .stream_schema(stream)
            .await
            .map_err(|e| store_answer(e, retry_after_ms))?;
        // A small batch decodes in microseconds, less than a hand-off to a blocking thread.
        let command = if frame_bytes <= INLINE_BYTES {
            decode_append(header, &bytes, &stream_schema)?
        } else {
            tokio::task::spawn_blocking(move || decode_append(header, &bytes, &stream_schema))
                .await
                .map_err(|e| error(ErrorCode::Internal, &e.to_string()))??
        };
        let ack = store
            .submit(command)
            .await
            .map_err(|e| store_answer(e, retry_after_ms))?;
        Ok((ack, frame_bytes))
    }
    .await;
    match outcome {
        Ok((ack, bytes)) => {
            state.metrics().appended(ack.events as usize, bytes);
            Response::Ack {
                lsn: ack.position,
                events: ack.events,
                service_micros: u32::try_from(started.elapsed().as_micros()).unwrap_or(u32::MAX),
            }
        }
        Err(answer) => {
            count(state, &answer);
            answer
        }
    }
}

/// Runs the catalog change a COMMAND frame carries on the replicated store.
async fn catalog_change(state: &AppState, bytes: &[u8]) -> Response {
    let started = Instant::now();
    let command = match tidemark_core::command::decode(bytes) {
        Ok(command) => command,
        Err(e) => return error(ErrorCode::BadRequest, &e.to_string()),
    };
    let Some(command) = command.catalog_change::<tidemark_core::EventBatch>() else {
        return error(
            ErrorCode::BadRequest,
            "COMMAND carries catalog changes; appends go in APPEND",
        );
    };
    match state.store(Namespace::Replicated).submit(command).await {
        Ok(ack) => Response::Ack {
            lsn: ack.position,
            events: 0,
            service_micros: u32::try_from(started.elapsed().as_micros()).unwrap_or(u32::MAX),
        },
        Err(e) => {
            let answer = store_answer(e, state.retry_after_ms());
            count(state, &answer);
            answer
        }
    }
}

/// The command of an APPEND frame whose checksum held: its batch decoded against the
/// stream's schema.
fn decode_append(
    header: Header,
    bytes: &[u8],
    stream_schema: &std::sync::Arc<tidemark_core::Schema>,
) -> Result<Command<tidemark_core::EventBatch>, Response> {
    let frame = Frame {
        kind: header.kind,
        request_id: header.request_id,
        body: &bytes[HEADER_LEN..],
    };
    let Ok(Request::Append {
        stream,
        schema,
        batch,
        producer,
    }) = Request::decode(&frame)
    else {
        return Err(error(ErrorCode::BadRequest, "not an append"));
    };
    let batch = decode_append_batch(schema, batch, stream_schema).map_err(|e| bad_request(&e))?;
    Ok(Command::Append {
        name: stream.to_string(),
        batch,
        producer: producer.map(|(producer, sequence)| ProducerSeq {
            producer,
            sequence,
            part: 0,
        }),
    })
}

/// The binary answer for a store's refusal: the one place a [`StoreError`] becomes a
/// protocol answer. TRY_LATER for what may succeed when retried, ERROR otherwise.
fn store_answer(e: StoreError, retry_after_ms: u32) -> Response {
    use StoreErrorKind as K;
    let code = match e.kind {
        K::Overloaded | K::Unavailable => {
            return Response::TryLater {
                retry_after_ms,
                message: e.message,
            }
        }
        K::UnknownStream => ErrorCode::UnknownStream,
        K::TooLarge => ErrorCode::TooLarge,
        K::ReadOnly => ErrorCode::Unavailable,
        K::Invalid | K::StreamExists | K::Conflict => ErrorCode::BadRequest,
        K::Internal => ErrorCode::Internal,
    };
    error(code, &e.message)
}

fn count(state: &AppState, answer: &Response) {
    let why = match answer {
        Response::Ack { .. } => return,
        Response::TryLater { .. } => Rejection::Overloaded,
        Response::Error { code, .. } => match code {
            ErrorCode::UnknownStream => Rejection::NotFound,
            ErrorCode::TooLarge => Rejection::TooLarge,
            ErrorCode::Unauthorized => Rejection::Unauthorized,
            ErrorCode::Unavailable => Rejection::Unavailable,
            ErrorCode::Internal | ErrorCode::Other(_) => return,
            _ => Rejection::BadRequest,
        },
    };
    state.metrics().rejected(why);
}

fn error(code: ErrorCode, message: &str) -> Response {
    Response::Error {
        code,
        message: message.to_string(),
    }
}

fn malformed(message: &str) -> Response {
    error(ErrorCode::MalformedFrame, message)
}

fn bad_request(e: &FrameError) -> Response {
    let code = match e {
        FrameError::SchemaMismatch { .. } => ErrorCode::SchemaMismatch,
        _ => ErrorCode::BadRequest,
    };
    error(code, &e.to_string())
}

fn encode(request_id: u64, answer: &Response) -> Vec<u8> {
    let mut out = Vec::with_capacity(64);
    answer.encode(request_id, &mut out);
    out
}

/// Writes answers as they come, several per write when they queue up.
async fn write_answers(
    mut writer: WriteHalf<Box<dyn Connection>>,
    mut outbox: mpsc::Receiver<Vec<u8>>,
) {
    let mut pending = Vec::new();
    while let Some(first) = outbox.recv().await {
        pending.clear();
        pending.extend_from_slice(&first);
        while let Ok(next) = outbox.try_recv() {
            pending.extend_from_slice(&next);
        }
        if writer.write_all(&pending).await.is_err() {
            return;
        }
    }
    let _ = writer.shutdown().await;
}
