//! The binary protocol listener (see `docs/protocol.md`). Each connection has one reader
//! and one writer task; every APPEND runs as its own task, so many requests are in flight on
//! one connection and answers go out as they complete, matched by request id.
//!
//! A frame's bytes are admitted (see [`crate::admission`]) before its body is read: when the
//! server is full, the body is skipped unread and the request answered TRY_LATER.

mod subscribe;

use std::collections::HashMap;
use std::sync::Arc;
use std::time::Instant;

use tidemark_core::{Command, EventBatch, ProducerSeq, Schema};
use tidemark_protocol::{
    decode_append_batch, decode_frame, decode_header, frame_len, ErrorCode, Frame, FrameError,
    Header, Request, Response, HEADER_LEN,
};
use tokio::io::{AsyncRead, AsyncReadExt, AsyncWrite, AsyncWriteExt, ReadHalf, WriteHalf};
use tokio::net::TcpListener;
use tokio::sync::{mpsc, watch};
use tokio::task::JoinSet;

use crate::admission::Permit;
use crate::append::{self, Append, AppendError};
use crate::auth::token_matches;
use crate::consume::{self, Start};
use crate::metrics::{Metrics, Rejection};
use crate::shutdown::{serve_connections, stopped, Accept, Serving};
use crate::state::{AppState, Namespace};
use crate::store::{StoreError, StoreErrorKind};
use crate::tls::TlsListener;
use subscribe::{Credit, Subscription};

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
                crate::socket::set_up(&socket);
                Ok((Box::new(socket), peer))
            }
            BinaryListener::Tls(listener) => match listener.next().await {
                // Set up by the listener before its handshake.
                Some((stream, peer)) => Ok((Box::new(stream), peer)),
                None => std::future::pending().await,
            },
        }
    }
}

/// Accepts connections until `shutdown` turns true, then waits (at most
/// `limits.shutdown_grace_ms`) for every connection to answer the requests it has read.
/// A connection past `limits.max_binary_connections` is answered `ERROR UNAVAILABLE` with
/// request id 0 (as every answer that closes a connection) and closed.
pub async fn serve(state: AppState, listener: BinaryListener, shutdown: watch::Receiver<bool>) {
    let limits = &state.config().limits;
    let max_connections = limits.max_binary_connections;
    let serving = Serving {
        what: "binary",
        max_connections,
        grace: limits.shutdown_grace(),
        draining: "binary connections",
    };
    let serve = |socket, _peer| serve_connection(state.clone(), socket, shutdown.clone());
    let refuse = |socket| refuse_connection(state.clone(), socket, max_connections);
    serve_connections(listener, serving, shutdown.clone(), serve, refuse).await;
}

/// Tells a connection past the bound why it is closed, counted as every refusal is.
async fn refuse_connection(state: AppState, mut socket: Box<dyn Connection>, bound: usize) {
    let refused = Refused::new(
        StoreErrorKind::Unavailable,
        ErrorCode::Unavailable,
        &format!(
            "the server serves {bound} binary connections at once \
             (limits.max_binary_connections): retry later"
        ),
    );
    let answer = refused.counted(state.metrics());
    let _ = socket.write_all(&encode(0, &answer)).await;
    let _ = socket.shutdown().await;
}

/// Answers queued for one connection's writer.
const ANSWER_QUEUE: usize = 1024;
/// A frame this long is written alone rather than copied together with others.
const LARGE_FRAME: usize = 64 << 10;
/// Subscriptions one connection may hold at once: one client takes at most this many of
/// `limits.max_subscriptions` per connection.
const MAX_SUBSCRIPTIONS_PER_CONNECTION: usize = 64;
/// How long a stopping server lets a connection's subscriptions say so before closing it.
const SUBSCRIPTIONS_SAY_GOODBYE: std::time::Duration = std::time::Duration::from_secs(1);

/// The answer to PING and to an accepted AUTH.
const ACK_NOTHING: Response = Response::Ack {
    lsn: 0,
    events: 0,
    service_micros: 0,
    positions: None,
};

/// What a connection has proven with AUTH.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Granted {
    Nothing,
    Read,
    Write,
}

/// A connection's answers on their way to its writer. Every answer passes here, and every
/// refusal is counted here ([`Refused::counted`]), as is the refusal of a connection past
/// the bound: the binary protocol counts nowhere else.
#[derive(Clone)]
struct Outbox {
    answers: mpsc::Sender<Outgoing>,
    state: AppState,
}

/// A frame on its way to the connection's writer, and what it holds until written (a
/// subscription's bytes not yet written, [`subscribe::MAX_UNWRITTEN`]).
struct Outgoing {
    frame: Vec<u8>,
    held: Option<tokio::sync::OwnedSemaphorePermit>,
}

impl Outbox {
    async fn send(&self, request_id: u64, answer: Answer) {
        let response = match answer {
            Ok(response) => response,
            Err(refused) => refused.counted(self.state.metrics()),
        };
        let frame = encode(request_id, &response);
        let _ = self.answers.send(Outgoing { frame, held: None }).await;
    }

    /// Queues a frame encoded elsewhere (a subscription's EVENTS), holding `held` until it
    /// is written; `false` once the connection is gone.
    async fn send_frame(&self, frame: Vec<u8>, held: tokio::sync::OwnedSemaphorePermit) -> bool {
        let held = Some(held);
        self.answers.send(Outgoing { frame, held }).await.is_ok()
    }
}

/// What a request is answered: ACK, or a refusal.
type Answer = Result<Response, Refused>;

/// A refusal as the protocol answers it (ERROR or TRY_LATER), with its kind, by which it
/// is counted.
#[derive(Debug)]
struct Refused {
    kind: StoreErrorKind,
    response: Response,
}

impl Refused {
    /// The answer, the refusal counted by its kind ([`Rejection::of`]): every binary
    /// refusal is answered through here.
    fn counted(self, metrics: &Metrics) -> Response {
        if let Some(why) = Rejection::of(self.kind) {
            metrics.rejected(why);
        }
        self.response
    }

    fn new(kind: StoreErrorKind, code: ErrorCode, message: &str) -> Refused {
        Refused {
            kind,
            response: Response::Error {
                code,
                message: message.to_string(),
            },
        }
    }

    /// A frame that cannot be read: the connection closes after it.
    fn malformed(message: &str) -> Refused {
        Refused::new(StoreErrorKind::Invalid, ErrorCode::MalformedFrame, message)
    }

    fn unauthorized(message: &str) -> Refused {
        Refused::new(
            StoreErrorKind::Unauthorized,
            ErrorCode::Unauthorized,
            message,
        )
    }

    /// A well-framed request whose body does not decode.
    fn bad_request(e: &FrameError) -> Refused {
        let code = match e {
            FrameError::SchemaMismatch { .. } => ErrorCode::SchemaMismatch,
            _ => ErrorCode::BadRequest,
        };
        Refused::new(StoreErrorKind::Invalid, code, &e.to_string())
    }

    /// TRY_LATER: nothing was stored, and the same request may succeed after the hint.
    fn try_later(kind: StoreErrorKind, retry_after_ms: u32, message: String) -> Refused {
        Refused {
            kind,
            response: Response::TryLater {
                retry_after_ms,
                message,
            },
        }
    }

    /// The binary answer for a store's refusal: the one place a [`StoreError`] becomes a
    /// protocol answer. TRY_LATER for what may succeed when retried, ERROR otherwise.
    fn store(e: StoreError, retry_after_ms: u32) -> Refused {
        use StoreErrorKind as K;
        let code = match e.kind {
            K::Overloaded | K::Unavailable => {
                return Refused::try_later(e.kind, retry_after_ms, e.message)
            }
            K::UnknownStream => ErrorCode::UnknownStream,
            K::TooLarge => ErrorCode::TooLarge,
            K::ReadOnly => ErrorCode::Unavailable,
            K::Unauthorized => ErrorCode::Unauthorized,
            K::Gone => ErrorCode::Gone,
            K::Invalid | K::StreamExists | K::Conflict | K::NotFound => ErrorCode::BadRequest,
            K::Internal => ErrorCode::Internal,
        };
        Refused::new(e.kind, code, &e.message)
    }
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
    let (granted, must_auth_by) = if state.config().auth.is_enabled() {
        let deadline = tokio::time::Instant::now() + state.config().limits.read_timeout();
        (Granted::Nothing, Some(deadline))
    } else {
        (Granted::Write, None)
    };
    let mut session = Session {
        outbox: Outbox {
            answers,
            state: state.clone(),
        },
        state,
        requests: JoinSet::new(),
        subscriptions: JoinSet::new(),
        credits: HashMap::new(),
        granted,
        must_auth_by,
        closing: false,
    };
    loop {
        let may_append = session.granted == Granted::Write;
        let frame = tokio::select! {
            _ = stopped(&mut shutdown) => break,
            frame = read_frame(&session.state, &mut reader, may_append) => frame,
            () = auth_deadline(session.must_auth_by) => {
                let refused = Refused::unauthorized(
                    "no valid AUTH within limits.read_timeout_ms of connecting: closed",
                );
                session.outbox.send(0, Err(refused)).await;
                break;
            }
        };
        let open = match frame {
            Ok(Some((header, bytes, permit))) => {
                session.serve(header, bytes, permit).await && !session.closing
            }
            Ok(None) => false,
            Err(Refusal {
                request_id,
                refused,
                close,
            }) => {
                session.outbox.send(request_id, Err(refused)).await;
                !close
            }
        };
        if !open {
            break;
        }
    }
    while session.requests.join_next().await.is_some() {}
    // A server that stops tells its subscriptions (they answer TRY_LATER): a moment for
    // them to say so. Otherwise, and after it, they end with their connection.
    if *shutdown.borrow() {
        let said = async { while session.subscriptions.join_next().await.is_some() {} };
        let _ = tokio::time::timeout(SUBSCRIPTIONS_SAY_GOODBYE, said).await;
    }
    session.subscriptions.abort_all();
    drop(session);
    let _ = writer.await;
}

/// A connection between frames: what it has proven, and its requests in flight.
struct Session {
    state: AppState,
    outbox: Outbox,
    /// Appends and catalog changes being served, each in its own task (they wait for an
    /// fsync).
    requests: JoinSet<()>,
    /// Subscriptions being served, each in its own task, and their credit by the request
    /// id that opened them.
    subscriptions: JoinSet<()>,
    credits: HashMap<u64, Arc<Credit>>,
    /// The client broke the protocol in a way that leaves its next frames in doubt (a
    /// request id of a running subscription used again): closed after the answer.
    closing: bool,
    granted: Granted,
    /// With tokens configured, a connection must prove one this soon or be closed: else
    /// clients without a token could hold every slot of `limits.max_binary_connections`
    /// by connecting and sending nothing. `None` once proven (or without tokens).
    must_auth_by: Option<tokio::time::Instant>,
}

/// Resolves at the deadline; never without one.
async fn auth_deadline(deadline: Option<tokio::time::Instant>) {
    match deadline {
        Some(deadline) => tokio::time::sleep_until(deadline).await,
        None => std::future::pending().await,
    }
}

impl Session {
    /// Serves a frame read whole (its bytes admitted on `permit`); `false` when the
    /// connection must close.
    async fn serve(&mut self, header: Header, bytes: Vec<u8>, permit: Permit) -> bool {
        let request_id = header.request_id;
        // The one checksum pass over the body. A frame that fails it cannot be trusted to
        // say where the next one starts.
        // The answer carries request id 0, like every error that closes the connection:
        // with the body in doubt, so is the header that came with it.
        if let Err(e) = decode_frame(&bytes, usize::MAX) {
            self.outbox
                .send(0, Err(Refused::malformed(&e.to_string())))
                .await;
            return false;
        }
        if header.kind.is_append() {
            // Appends are decoded and stored in their own task, off this loop; read_frame
            // refused them on a connection without the write token.
            assert!(
                self.granted == Granted::Write,
                "an append read without the write token"
            );
            let (state, outbox) = (self.state.clone(), self.outbox.clone());
            self.requests.spawn(async move {
                let answer = append(&state, header, bytes, permit).await;
                outbox.send(request_id, answer).await;
            });
            // Reap finished requests so the set does not grow with the connection's age.
            while self.requests.try_join_next().is_some() {}
            return true;
        }
        let frame = Frame {
            kind: header.kind,
            flags: header.flags,
            request_id,
            body: &bytes[HEADER_LEN..],
        };
        match Request::decode(&frame) {
            Ok(request) => self.serve_request(request_id, request, permit).await,
            Err(e) => {
                let refused = Refused::bad_request(&e);
                self.outbox.send(request_id, Err(refused)).await;
            }
        }
        true
    }

    /// Serves a request other than APPEND: PING, AUTH, a catalog change, a subscription
    /// and its credit, a consumer's position.
    async fn serve_request(&mut self, request_id: u64, request: Request<'_>, permit: Permit) {
        let auth = &self.state.config().auth;
        match request {
            Request::Ping => self.outbox.send(request_id, Ok(ACK_NOTHING)).await,
            Request::Auth { .. } if !auth.is_enabled() => {
                // Without tokens configured every connection may write: AUTH changes nothing.
                self.outbox.send(request_id, Ok(ACK_NOTHING)).await;
            }
            Request::Auth { token } => {
                self.granted = if token_matches(token, &auth.write_token) {
                    Granted::Write
                } else if token_matches(token, &auth.read_token) {
                    Granted::Read
                } else {
                    Granted::Nothing
                };
                let answer = if self.granted == Granted::Nothing {
                    Err(Refused::unauthorized("the token is not valid"))
                } else {
                    self.must_auth_by = None;
                    Ok(ACK_NOTHING)
                };
                self.outbox.send(request_id, answer).await;
            }
            Request::Command { .. } if self.granted != Granted::Write => {
                let refused =
                    Refused::unauthorized("catalog changes need AUTH with the write token");
                self.outbox.send(request_id, Err(refused)).await;
            }
            Request::Command { command } => {
                // In its own task like an append: a catalog change waits for its fsync.
                let command = command.to_vec();
                let (state, outbox) = (self.state.clone(), self.outbox.clone());
                self.requests.spawn(async move {
                    let answer = catalog_change(&state, &command).await;
                    drop(permit);
                    outbox.send(request_id, answer).await;
                });
                while self.requests.try_join_next().is_some() {}
            }
            Request::Subscribe { .. } | Request::CommitPosition { .. }
                if self.granted == Granted::Nothing =>
            {
                let refused = Refused::unauthorized("reading needs AUTH with the read token");
                self.outbox.send(request_id, Err(refused)).await;
            }
            Request::Subscribe {
                stream,
                start,
                credit,
                follow,
            } => {
                self.subscribe(request_id, stream, start, credit, follow)
                    .await
            }
            Request::Credit { bytes } => {
                // Credit for a subscription that has ended (or never was) changes nothing.
                if let Some(credit) = self.credits.get(&request_id) {
                    credit.grant(bytes);
                }
            }
            Request::Unsubscribe => {
                // Kept until its task ends: the id is in use until the subscription's ACK.
                if let Some(credit) = self.credits.get(&request_id) {
                    credit.end();
                }
            }
            Request::CommitPosition { .. } if self.granted != Granted::Write => {
                let refused =
                    Refused::unauthorized("committing a position needs AUTH with the write token");
                self.outbox.send(request_id, Err(refused)).await;
            }
            Request::CommitPosition {
                stream,
                consumer,
                position,
            } => {
                let command = Command::CommitPosition {
                    name: stream.to_string(),
                    consumer: consumer.to_string(),
                    position,
                };
                let (state, outbox) = (self.state.clone(), self.outbox.clone());
                self.requests.spawn(async move {
                    let answer = submit_command(&state, command).await;
                    drop(permit);
                    outbox.send(request_id, answer).await;
                });
                while self.requests.try_join_next().is_some() {}
            }
            // Taken by kind before decoding, in `serve`.
            Request::Append { .. } => {}
        }
    }

    /// Starts the subscription SUBSCRIBE asks for, in its own task.
    async fn subscribe(
        &mut self,
        request_id: u64,
        stream: &str,
        start: tidemark_protocol::Start<'_>,
        credit: u32,
        follow: bool,
    ) {
        // Forget the subscriptions that ended, so the map does not grow with the
        // connection's age.
        while self.subscriptions.try_join_next().is_some() {}
        self.credits
            .retain(|_, credit| Arc::strong_count(credit) > 1);
        if self.credits.contains_key(&request_id) {
            // An answer on this id would read as the running subscription's end.
            let refused = Refused::malformed(&format!(
                "request id {request_id} is a subscription still running: ids must be \
                 unique among a connection's requests in flight; closed"
            ));
            self.closing = true;
            return self.outbox.send(0, Err(refused)).await;
        }
        if self.credits.len() >= MAX_SUBSCRIPTIONS_PER_CONNECTION {
            let refused = Refused::new(
                StoreErrorKind::Invalid,
                ErrorCode::BadRequest,
                &format!(
                    "a connection holds at most {MAX_SUBSCRIPTIONS_PER_CONNECTION} \
                     subscriptions: unsubscribe one, or open another connection"
                ),
            );
            return self.outbox.send(request_id, Err(refused)).await;
        }
        let slot = match consume::subscription_slot(&self.state) {
            Ok(slot) => slot,
            Err(e) => {
                let refused = Refused::store(e, self.state.retry_after_ms());
                return self.outbox.send(request_id, Err(refused)).await;
            }
        };
        let start = match start {
            tidemark_protocol::Start::After(position) => Start::After(position),
            tidemark_protocol::Start::Earliest => Start::Earliest,
            tidemark_protocol::Start::FromTime(time) => Start::FromTime(time),
            tidemark_protocol::Start::Consumer(name) => Start::Consumer(name.to_string()),
        };
        let credit = Subscription::credit(credit);
        self.credits.insert(request_id, credit.clone());
        let subscription = Subscription {
            state: self.state.clone(),
            outbox: self.outbox.clone(),
            request_id,
            stream: stream.to_string(),
            start,
            follow,
            credit,
            slot,
        };
        self.subscriptions.spawn(subscription.run());
    }
}

/// A frame that is not served, and whether the connection can go on after it.
struct Refusal {
    request_id: u64,
    refused: Refused,
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
    let Some((head, header)) = read_header(state, reader).await? else {
        return Ok(None);
    };
    let read_timeout = state.config().limits.read_timeout();
    let body_len = header.frame_len - HEADER_LEN;
    // The request id is known from here on: refusals echo it.
    let refuse = |refused, close| Refusal {
        request_id: header.request_id,
        refused,
        close,
    };
    let budget = if header.kind.is_append() {
        if !may_append {
            if !skip(reader, body_len, read_timeout).await {
                return Ok(None);
            }
            let refused = Refused::unauthorized("appends need AUTH with the write token");
            return Err(refuse(refused, false));
        }
        state.admission()
    } else {
        if header.frame_len > MAX_CONTROL_FRAME {
            let message = format!(
                "a {:?} frame of {} bytes exceeds the limit of {MAX_CONTROL_FRAME} for frames other than APPEND",
                header.kind, header.frame_len
            );
            let refused = Refused::new(StoreErrorKind::TooLarge, ErrorCode::TooLarge, &message);
            return Err(refuse(refused, true));
        }
        state.control_admission()
    };
    let try_later = |skipped: bool| {
        if !skipped {
            return Ok(None);
        }
        let refused = Refused::try_later(
            StoreErrorKind::Overloaded,
            state.retry_after_ms(),
            "the server has too many request bytes in flight".into(),
        );
        Err(refuse(refused, false))
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

/// Reads a frame's header, its length checked before the rest of it is awaited (a frame
/// over the limit is refused without waiting for more bytes). `Ok(None)` at the end of the
/// stream or when the header stalls; a header that cannot be trusted is refused with
/// request id 0, and the connection closes.
async fn read_header(
    state: &AppState,
    reader: &mut ReadHalf<Box<dyn Connection>>,
) -> Result<Option<([u8; HEADER_LEN], Header)>, Refusal> {
    let fatal = |refused| Refusal {
        request_id: 0,
        refused,
        close: true,
    };
    let mut head = [0u8; HEADER_LEN];
    if reader.read_exact(&mut head[..4]).await.is_err() {
        return Ok(None);
    }
    let read_timeout = state.config().limits.read_timeout();
    let max = state.config().limits.max_body_bytes;
    if let Err(e) = frame_len(&head, max) {
        return Err(fatal(match e {
            FrameError::TooLarge { .. } => Refused::new(
                StoreErrorKind::TooLarge,
                ErrorCode::TooLarge,
                &e.to_string(),
            ),
            _ => Refused::malformed(&e.to_string()),
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
        Ok(None) => return Err(fatal(Refused::malformed("incomplete header"))),
        Err(e @ FrameError::UnsupportedVersion(_)) => {
            return Err(fatal(Refused::new(
                StoreErrorKind::Invalid,
                ErrorCode::UnsupportedVersion,
                &e.to_string(),
            )))
        }
        Err(e) => return Err(fatal(Refused::malformed(&e.to_string()))),
    };
    Ok(Some((head, header)))
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

/// Appends the batch of an APPEND frame (its checksum already checked) to the replicated
/// store through the store layer ([`crate::append`]), which decodes it in place or on the
/// blocking pool.
async fn append(state: &AppState, header: Header, bytes: Vec<u8>, permit: Permit) -> Answer {
    let started = Instant::now();
    let frame = Frame {
        kind: header.kind,
        flags: header.flags,
        request_id: header.request_id,
        body: &bytes[HEADER_LEN..],
    };
    // Only the header fields: the batch stays in wire form until the store layer decodes
    // it. The frame itself was intact (its checksum held), so a bad body is a bad request
    // and the connection goes on.
    let (stream, producer, ask_positions) = match Request::decode(&frame) {
        Ok(Request::Append {
            stream,
            producer,
            ask_positions,
            ..
        }) => (stream.to_string(), producer, ask_positions),
        Ok(_) => {
            let refused = Refused::new(
                StoreErrorKind::Invalid,
                ErrorCode::BadRequest,
                "not an append",
            );
            return Err(refused);
        }
        Err(e) => return Err(Refused::bad_request(&e)),
    };
    let append = Append {
        stream,
        body: bytes,
        permit,
        producer: producer.map(|(producer, sequence)| ProducerSeq {
            producer,
            sequence,
            part: 0,
        }),
    };
    let store = state.store(Namespace::Replicated);
    let decode = move |bytes: &[u8], schema: &Arc<Schema>| decode_append(header, bytes, schema);
    match append::append(store, state.metrics(), append, decode).await {
        Ok(ack) => Ok(Response::Ack {
            lsn: ack.lsn,
            events: ack.events,
            service_micros: micros_since(started),
            // Only to a client that asked: one that did not may be older and read an ACK
            // as its twenty bytes only. None where HTTP's answer has none either (a
            // producer's retry, a stream without positions).
            positions: ack
                .positions
                .filter(|_| ask_positions)
                .map(|p| (p.first, p.last)),
        }),
        Err(AppendError::Store(e)) => Err(Refused::store(e, state.retry_after_ms())),
        Err(AppendError::Decode(refused)) => Err(refused),
    }
}

/// Runs the catalog change a COMMAND frame carries on the replicated store.
async fn catalog_change(state: &AppState, bytes: &[u8]) -> Answer {
    let bad = |message: &str| Refused::new(StoreErrorKind::Invalid, ErrorCode::BadRequest, message);
    let command = tidemark_core::command::decode(bytes).map_err(|e| bad(&e.to_string()))?;
    let Some(command) = command.catalog_change::<EventBatch>() else {
        return Err(bad("COMMAND carries catalog changes; appends go in APPEND"));
    };
    submit_command(state, command).await
}

/// Runs a command other than an append (a catalog change, a consumer's position) on the
/// replicated store; ACK once durable.
async fn submit_command(state: &AppState, command: Command<EventBatch>) -> Answer {
    let started = Instant::now();
    match state.store(Namespace::Replicated).submit(command).await {
        Ok(ack) => Ok(Response::Ack {
            lsn: ack.lsn,
            events: 0,
            service_micros: micros_since(started),
            positions: None,
        }),
        Err(e) => Err(Refused::store(e, state.retry_after_ms())),
    }
}

fn micros_since(started: Instant) -> u32 {
    u32::try_from(started.elapsed().as_micros()).unwrap_or(u32::MAX)
}

/// The batch of an APPEND frame whose checksum held, decoded against the stream's schema.
fn decode_append(
    header: Header,
    bytes: &[u8],
    stream_schema: &Arc<Schema>,
) -> Result<EventBatch, Refused> {
    let frame = Frame {
        kind: header.kind,
        flags: header.flags,
        request_id: header.request_id,
        body: &bytes[HEADER_LEN..],
    };
    let Ok(Request::Append { schema, batch, .. }) = Request::decode(&frame) else {
        return Err(Refused::new(
            StoreErrorKind::Invalid,
            ErrorCode::BadRequest,
            "not an append",
        ));
    };
    decode_append_batch(schema, batch, stream_schema).map_err(|e| Refused::bad_request(&e))
}

fn encode(request_id: u64, answer: &Response) -> Vec<u8> {
    let mut out = Vec::with_capacity(64);
    // The server's answers other than EVENTS (sent by `send_frame`) are a few dozen bytes
    // and a message cut to 4 KiB: they always fit a frame.
    let fits = answer.encode(request_id, &mut out);
    debug_assert!(fits.is_ok(), "an answer too long for a frame");
    out
}

/// Writes answers as they come, several per write when they queue up.
async fn write_answers(
    mut writer: WriteHalf<Box<dyn Connection>>,
    mut outbox: mpsc::Receiver<Outgoing>,
) {
    let mut pending = Vec::new();
    let mut held = Vec::new();
    while let Some(first) = outbox.recv().await {
        if first.frame.len() >= LARGE_FRAME {
            // A subscription's EVENTS: written as it is, not copied into `pending`.
            if writer.write_all(&first.frame).await.is_err() {
                return;
            }
            continue;
        }
        pending.clear();
        pending.extend_from_slice(&first.frame);
        held.push(first.held);
        while let Ok(next) = outbox.try_recv() {
            pending.extend_from_slice(&next.frame);
            held.push(next.held);
        }
        if writer.write_all(&pending).await.is_err() {
            return;
        }
        // Written: what the frames held is free.
        held.clear();
    }
    let _ = writer.shutdown().await;
}
